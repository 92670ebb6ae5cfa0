"""The gRPC transport's machinery: the servicer's ways of answering, request parsing, inference decoding and
encoding, status mapping, metrics and the access log. `grpc.py` (rendered from the spec) holds what the spec
decides: the service's name, its RPC table (`Rpc`), the inference messages' field numbers (`InferCodec`) and the
`Servicer` with one method per RPC, each calling one of `ServicerBase`'s ways.

Methods only decode, call the data plane and encode; every rule of the protocol lives in the data plane.
- Ordinary RPCs hand their request message to the data plane and return its reply.
- Inference decodes typed `contents` (`codec.from_contents_message`, which refuses a field that does not
  belong to the datatype) or `raw_input_contents` (zero-copy `codec.from_raw`; entry i belongs to the i-th
  input without contents, and a request may not use both forms) and answers in `raw_output_contents` only,
  one entry per output, as Triton does.
- A data plane error maps to its status code (`errors.GRPC_CODE`); anything unexpected is INTERNAL, logged
  here and never sent with a traceback. Messages over `Settings.max_request_bytes` are RESOURCE_EXHAUSTED.
- Unary inference on a model that allows it runs wholly in the gRPC thread (`_in_thread`, the fast path);
  everything else runs as the servicer's coroutines on the event loop (`grpc_threads`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, NoReturn, TypeAlias, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from ... import codec, convert, extensions
from ...grpc import wire
from ..core.dataplane_base import DataPlaneBase
from ..core.streaming import StreamError, final_response
from ..errors import GRPC_CODE, ErrorKind, InvalidRequest, ModelFailure, OipError, TooLarge, bounded
from ..observe.tracing import carrier
from ..settings import Settings
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .in_thread import UnaryInfer
from .server import NOT_HERE, threaded_server

__all__ = ["Context", "InferCodec", "Observe", "Rpc", "ServicerBase", "create_server", "method_handlers"]

log = logging.getLogger(__name__)
access_log = logging.getLogger("oip.access")

_T = TypeVar("_T")
_M = TypeVar("_M", bound=Message)
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_R = TypeVar("_R", bound=Message)
Context: TypeAlias = "grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]"
_SHARED_MEMORY: Final = extensions.SHARED_MEMORY_REGION  # input parameters: data held by the shared memory extension
# Inference messages at least this large keep their raw tensor bytes out of the protobuf message: the request's
# are read as views of the received bytes, the response's are written after the serialized rest (no copies).
_BIG: Final = 1 << 16

# Told about every answered call (metrics, access log): RPC name, code's name, start (perf_counter_ns), request,
# bytes sent.
Observe: TypeAlias = Callable[[str, str, int, Any, int], None]


@dataclass(frozen=True, slots=True)
class Rpc:
    """One RPC of the service, as the spec declares it."""

    name: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool = False
    server_streaming: bool = False
    inference: bool = False  # its request is the inference request: decoded to numpy tensors for the data plane
    # A streaming inference's response wrapper: the field holding the inference response, and its error text.
    stream_response_field: str | None = None
    stream_error_field: str | None = None

    @property
    def kind(self) -> str:
        """grpc's name for its shape: unary_unary, unary_stream, stream_unary or stream_stream."""
        return f"{'stream' if self.client_streaming else 'unary'}_{'stream' if self.server_streaming else 'unary'}"

    @property
    def fast(self) -> bool:
        """Whether it may be answered wholly in the gRPC thread (unary inference)."""
        return self.inference and not (self.client_streaming or self.server_streaming)


class InferCodec(Generic[_R]):
    """The inference messages: requests (messages of type `request`) to the data plane's tensors, its answers to
    the response message `_R`.

    `param_type` is the full name of every parameters map's value message; `raw_input_field` and
    `raw_output_field` the field numbers of the request's raw_input_contents and the response's
    raw_output_contents."""

    def __init__(
        self, request: type[Message], response: type[_R], param_type: str, raw_input_field: int,
        raw_output_field: int,
    ) -> None:
        self.request = request
        self.response = response
        self.param_type = param_type
        self.raw_input_field = raw_input_field
        self.raw_output_field = raw_output_field

    def decode_request(
        self, message: Any, settings: Settings, raw_contents: Sequence[bytes | memoryview] | None = None
    ) -> InferRequest:
        """The data plane's request: tensors decoded from typed contents or raw contents, as numpy arrays.
        `raw_contents`, when given, stands for the message's raw_input_contents (views of the received bytes)."""
        raw: Sequence[bytes | memoryview] = message.raw_input_contents if raw_contents is None else raw_contents
        limit = settings.max_tensor_elements
        if raw:
            for tensor in message.inputs:
                if tensor.HasField("contents"):
                    raise InvalidRequest(
                        f"input '{tensor.name}': contents must not be set when the request uses raw_input_contents"
                    )
        inputs: list[Tensor] = []
        used = 0
        for tensor in message.inputs:
            name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
            count = codec.element_count(shape, name=name)
            if count > limit:
                raise TooLarge(
                    f"input '{name}': shape {shape} has {count} elements, more than the {limit} allowed per tensor"
                )
            params = self._params_from_proto(tensor.parameters)
            if tensor.HasField("contents"):
                data = codec.from_contents_message(tensor.contents, datatype, shape, name=name)
            elif _SHARED_MEMORY in params:
                data = None  # the data plane reads it from the region
            elif used < len(raw):
                data = codec.from_raw(raw[used], datatype, shape, name=name)
                used += 1
            else:
                raise InvalidRequest(f"input '{name}': no data (neither contents nor a raw_input_contents entry)")
            inputs.append(Tensor(name, datatype, shape, data, params))
        if used != len(raw):
            raise InvalidRequest(
                f"raw_input_contents has {len(raw)} entries but only {used} inputs take their data from it"
            )
        return InferRequest(
            model_name=message.model_name,
            model_version=message.model_version,
            id=message.id,
            parameters=self._params_from_proto(message.parameters),
            inputs=inputs,
            outputs=[RequestedOutput(o.name, self._params_from_proto(o.parameters)) for o in message.outputs],
        )

    def encode_response(self, response: InferResponse) -> _R:
        """The gRPC answer: every output's data in `raw_output_contents` (one entry per output, even empty)."""
        message, raw = self._encode_parts(response)
        cast(Any, message).raw_output_contents.extend(bytes(entry) for entry in raw)
        return message

    def encode_wire(self, response: InferResponse) -> _R | bytes:
        """The answer of a unary inference: the message, or for large outputs its serialized form with the raw
        outputs appended as raw_output_contents entries (the same bytes protobuf would write, one copy fewer)."""
        message, raw = self._encode_parts(response)
        sizes = [entry.nbytes if isinstance(entry, memoryview) else len(entry) for entry in raw]
        if sum(sizes) < _BIG:
            cast(Any, message).raw_output_contents.extend(bytes(entry) for entry in raw)
            return message
        return b"".join([message.SerializeToString(), *wire.field_entries(self.raw_output_field, raw)])

    def request_error(self, message: Any, exc: Exception) -> StreamError:
        """A stream's request that cannot be decoded: its error, with what identifies the request."""
        error = exc if isinstance(exc, OipError) else InvalidRequest(str(exc))
        request = InferRequest(model_name=message.model_name, model_version=message.model_version, id=message.id)
        return StreamError(error, final_response(request))

    def parser(self, message_type: type[_M]) -> Callable[[bytes], _M | _Malformed | _InferWire]:
        """The request deserializer of unary inference: large requests keep their raw contents as views."""
        plain = _parser(message_type)
        field = self.raw_input_field

        def parse(data: bytes) -> _M | _Malformed | _InferWire:
            if len(data) < _BIG:
                return plain(data)
            try:
                rest, raw = wire.split_field(data, field)
            except (ValueError, IndexError):  # not well-formed: protobuf says why
                return plain(data)
            message = plain(rest)
            return _InferWire(message, raw) if raw and not isinstance(message, _Malformed) else message

        return parse

    def _encode_parts(self, response: InferResponse) -> tuple[_R, list[bytes | memoryview]]:
        """The answer without its raw_output_contents, and those (views of the outputs' arrays where possible)."""
        message = self.response(model_name=response.model_name, model_version=response.model_version, id=response.id)
        reply = cast(Any, message)
        self._params_to_proto(response.parameters, reply.parameters, "response")
        raw: list[bytes | memoryview] = []
        for tensor in response.outputs:
            out = reply.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            self._params_to_proto(tensor.parameters, out.parameters, f"output '{tensor.name}'")
            if tensor.data is None:
                raw.append(b"")
                continue
            try:
                raw.append(codec.to_raw(tensor.data, tensor.datatype, name=tensor.name))
            except codec.CodecError as exc:
                raise ModelFailure(str(exc)) from None
        return message, raw

    def _params_from_proto(self, entries: Mapping[str, Any]) -> dict[str, Any]:
        return convert.params_from_proto(self.param_type, entries)

    def _params_to_proto(self, params: Mapping[str, Any], target: MutableMapping[str, Any], where: str) -> None:
        """Fill a parameters map: bool, int (int64, or uint64 above its range), float and str values."""
        try:
            convert.params_to_proto(self.param_type, params, target)
        except convert.ConvertError as exc:
            raise ModelFailure(f"{where} {exc}") from None


class ServicerBase:
    """What every RPC method of the generated `Servicer` does: decode, call the data plane, encode, and map
    errors to statuses. The subclass sets the service's table (`service`, `rpcs`, `infer`)."""

    service: ClassVar[str]
    rpcs: ClassVar[tuple[Rpc, ...]]
    infer: ClassVar[InferCodec[Any]]

    def __init__(self, dataplane: DataPlaneBase, settings: Settings) -> None:
        self.dataplane = dataplane
        self.settings = settings

    async def call(self, operation: Callable[[_Req], Awaitable[_Resp]], request: _Req, context: Context) -> _Resp:
        """An ordinary unary RPC: the data plane's reply to the request message."""
        try:
            return await operation(request)
        except Exception as exc:
            await _abort(context, exc)

    async def infer_call(
        self, operation: Callable[[InferRequest], Awaitable[InferResponse]], request: Any, context: Context
    ) -> Any:
        """Unary inference on the event loop: the response message, or its serialized bytes for large outputs
        (the handler's serializer passes bytes through)."""
        try:
            if isinstance(request, _InferWire):
                infer_request = self.infer.decode_request(request.message, self.settings, request.raw)
            else:
                infer_request = self.infer.decode_request(request, self.settings)
            infer_request.transport = "grpc"
            if self.settings.tracing:
                infer_request.trace = carrier(_metadata(context).get)
            return self.infer.encode_wire(await operation(infer_request))
        except Exception as exc:
            await _abort(context, exc)

    async def stream_call(
        self, rpc: Rpc, operation: Callable[[Any], AsyncIterator[Any]],
        requests: Iterator[Any] | AsyncIterator[Any], context: Context,
    ) -> AsyncIterator[Any]:
        """A streaming RPC (either side): the data plane's replies, as they come. Inference requests are decoded
        one by one (one that fails gives its error and the stream goes on), and its replies encoded, wrapped in
        the stream's response message when the spec declares one (errors then travel in its error field)."""
        replies_in = self._stream_requests(requests, context) if rpc.inference else _aiter(requests)
        try:
            replies = operation(replies_in)
        except Exception as exc:
            await _abort(context, exc)
        try:
            async for reply in replies:
                if not rpc.inference:
                    yield reply
                elif rpc.stream_response_field is None or rpc.stream_error_field is None:
                    if isinstance(reply, Exception):
                        await _abort(context, reply)
                    yield self.infer.encode_response(reply)
                else:
                    yield self._wrapped(rpc, reply)
        except Exception as exc:
            await _abort(context, exc)

    async def first_reply(self, rpc: Rpc, replies: AsyncIterator[_T], context: Context) -> _T:
        """The answer of a streaming RPC whose server side is unary: the first reply of `stream_call`."""
        async for reply in replies:
            return reply
        await _abort(context, ModelFailure(f"{rpc.name} gave no answer"))

    async def _stream_requests(
        self, requests: Iterator[Any] | AsyncIterator[Any], context: Context
    ) -> AsyncIterator[InferRequest | Exception]:
        settings = self.settings
        trace = carrier(_metadata(context).get) if settings.tracing else None
        async for message in _aiter(requests):
            try:
                decoded: InferRequest | Exception = self.infer.decode_request(message, settings)
            except (OipError, codec.CodecError) as exc:  # this request fails, the stream goes on
                decoded = self.infer.request_error(message, exc)
            if isinstance(decoded, InferRequest):
                decoded.transport, decoded.trace = "grpc", trace
            yield decoded

    def _wrapped(self, rpc: Rpc, reply: InferResponse | Exception) -> Message:
        infer_field, error_field = cast(str, rpc.stream_response_field), cast(str, rpc.stream_error_field)
        wrapped = rpc.response()
        if not isinstance(reply, Exception):
            try:
                getattr(wrapped, infer_field).CopyFrom(self.infer.encode_response(reply))
            except Exception as exc:
                reply = exc
        if isinstance(reply, Exception):  # the request failed; the stream goes on
            setattr(wrapped, error_field, reply.message if isinstance(reply, OipError) else _status(reply)[1])
            if isinstance(reply, StreamError):  # which request failed: id, model, final flag
                getattr(wrapped, infer_field).CopyFrom(self.infer.encode_response(reply.response))
        return wrapped


def create_server(servicer: ServicerBase) -> grpc.Server:
    """The gRPC server answering every RPC of `servicer`'s service from its data plane (see `grpc_threads`:
    grpcio's thread pool server; unary inference on a model that allows it runs wholly in the gRPC thread,
    everything else as the servicer's coroutines on this event loop); bind it with `add_insecure_port`. Call from
    the event loop.

    Messages are limited to `settings.max_request_bytes` each way (larger ones: RESOURCE_EXHAUSTED), and a port
    already in use is an error rather than shared, unless `settings.reuse_port` (the workers of `--workers N`).
    """
    dataplane, settings = servicer.dataplane, servicer.settings
    limit = settings.max_request_bytes
    metrics = getattr(dataplane, "metrics", None) if settings.metrics else None
    observe = _observer(servicer.service, metrics, settings.access_log)
    handlers = method_handlers(servicer, observe)
    fast = {rpc.name: _in_thread(dataplane, settings, servicer.infer, rpc.name, observe)
            for rpc in servicer.rpcs if rpc.fast}
    options = [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
    ]
    return threaded_server(
        servicer.service, handlers, fast, asyncio.get_running_loop(), settings.grpc_threads, options
    )


def _in_thread(
    dataplane: DataPlaneBase, settings: Settings, infer: InferCodec[Any], rpc: str, observe: Observe | None
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """The fast path. Unary inference wholly in the gRPC thread, for a model that allows it
    (`Pipeline.runs_in_thread`): the same decoding, pipeline, encoding and errors as the servicer's way
    (`ServicerBase.infer_call`); NOT_HERE for any other request. The common request takes the lean way
    (`grpc_unary.UnaryInfer`: the same checks, counts and errors, less work)."""
    pipeline = getattr(dataplane, "pipeline", None)
    decode_request, encode_wire = infer.decode_request, infer.encode_wire
    lean = UnaryInfer(pipeline, settings, encode_wire) if pipeline is not None else None
    request_type = infer.request

    def infer_in_thread(request: Any, context: grpc.ServicerContext) -> Any:
        if pipeline is None or isinstance(request, _Malformed):
            return NOT_HERE
        start, code, sent = time.perf_counter_ns(), "OK", 0
        trace = carrier(_metadata(context).get) if settings.tracing else None
        if lean is not None and type(request) is request_type:  # the common request: the lean way
            try:
                reply = lean(request, trace)
            except Exception as exc:
                status, details = _status(exc)
                code = str(status.name)
                context.abort(status, details)
            finally:
                if observe is not None and code != "OK":
                    observe(rpc, code, start, request, sent)
            if reply is not None:
                if observe is not None:
                    observe(rpc, code, start, request, _size(reply))
                return reply
        wire = request if isinstance(request, _InferWire) else None
        message = wire.message if wire is not None else request
        if not pipeline.runs_in_thread(message.model_name, message.model_version):
            return NOT_HERE
        try:
            infer_request = decode_request(message, settings, wire.raw if wire is not None else None)
            infer_request.transport = "grpc"
            infer_request.trace = trace
            reply = encode_wire(pipeline.infer_in_thread(infer_request))
            if observe is not None:
                sent = _size(reply)
            return reply
        except Exception as exc:
            status, details = _status(exc)
            code = str(status.name)
            context.abort(status, details)
        finally:
            if observe is not None:
                observe(rpc, code, start, request, sent)

    return infer_in_thread


def method_handlers(
    servicer: ServicerBase, observe: Observe | None = None
) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """The servicer's methods by RPC name, as grpc handlers. Unlike protoc's registration
    (`add_<Service>Servicer_to_server`), a request that does not parse as its message is answered
    INVALID_ARGUMENT by the servicer rather than UNKNOWN by grpc."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for rpc in servicer.rpcs:
        method = getattr(servicer, rpc.name)
        behavior = _OBSERVED[rpc.kind](_GUARDED[rpc.kind](method), rpc.name, observe)
        if rpc.fast:
            deserializer: Callable[[bytes], Any] = servicer.infer.parser(rpc.request)
            serializer: Callable[[Any], bytes] = _infer_serializer
        else:
            deserializer, serializer = _parser(rpc.request), rpc.response.SerializeToString
        make = getattr(grpc, f"{rpc.kind}_rpc_method_handler")
        handlers[rpc.name] = make(behavior, request_deserializer=deserializer, response_serializer=serializer)
    return handlers


class _Malformed:
    """What a request deserializes to when its bytes are not the message: the servicer refuses it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _parser(message_type: type[_M]) -> Callable[[bytes], _M | _Malformed]:
    def parse(data: bytes) -> _M | _Malformed:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return _Malformed(f"the request is not a valid {message_type.DESCRIPTOR.full_name}: {exc}")

    return parse


class _InferWire:
    """A large inference request: the message without its raw_input_contents, which are views of the bytes
    received (entries in order), so that the tensors are never copied out of them."""

    __slots__ = ("message", "raw")

    def __init__(self, message: Any, raw: list[memoryview]) -> None:
        self.message = message
        self.raw = raw


def _infer_serializer(reply: Any) -> bytes:
    return reply if isinstance(reply, bytes) else bytes(reply.SerializeToString())


async def _checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Malformed):
            await _abort(context, InvalidRequest(request.message))
        yield request


def _observer(service: str, metrics: Any, log_access: bool) -> Observe | None:
    """What counts and logs each answered call (None when neither is on)."""
    if metrics is None and not log_access:
        return None

    def observe(rpc: str, code: str, start: int, request: Any, sent: int) -> None:
        if metrics is not None:
            metrics.count("grpc", rpc, code)
        if log_access:
            duration_ms = (time.perf_counter_ns() - start) / 1e6
            received = _size(request)
            access_log.info(
                '"%s/%s" %s %.3f ms %d bytes in, %d bytes out', service, rpc, code, duration_ms, received, sent,
                extra={"access": {
                    "transport": "grpc", "operation": rpc, "status": code, "duration_ms": round(duration_ms, 3),
                    "request_bytes": received, "response_bytes": sent,
                }},
            )

    return observe


def _size(item: Any) -> int:
    """The serialized size of a request or reply (raw tensor bytes included)."""
    if isinstance(item, bytes | memoryview):
        return len(item)
    if isinstance(item, _InferWire):
        return int(item.message.ByteSize()) + sum(entry.nbytes for entry in item.raw)
    if isinstance(item, Message):
        return int(item.ByteSize())
    return 0


def _code(context: Context, exc: BaseException | None) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if exc is not None else "OK"


def _observed_unary(method: Callable[[Any, Context], Awaitable[Any]], rpc: str,
                    observe: Observe | None) -> Callable[[Any, Context], Awaitable[Any]]:
    if observe is None:
        return method

    async def observed(request: Any, context: Context) -> Any:
        start, failure, sent = time.perf_counter_ns(), None, 0
        try:
            reply = await method(request, context)
            sent = _size(reply)
            return reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            observe(rpc, _code(context, failure), start, request, sent)

    return observed


def _observed_stream(method: Callable[[Any, Context], AsyncIterator[Any]], rpc: str,
                     observe: Observe | None) -> Callable[[Any, Context], AsyncIterator[Any]]:
    if observe is None:
        return method

    async def observed(request: Any, context: Context) -> AsyncIterator[Any]:
        start, failure, sent = time.perf_counter_ns(), None, 0
        try:
            async for reply in method(request, context):
                sent += _size(reply)
                yield reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            observe(rpc, _code(context, failure), start, None, sent)

    return observed


def _metadata(context: Context) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


def _guard_unary_unary(method: Callable[[Any, Context], Awaitable[Any]]) -> Callable[[Any, Context], Awaitable[Any]]:
    async def guarded(request: Any, context: Context) -> Any:
        if isinstance(request, _Malformed):
            await _abort(context, InvalidRequest(request.message))
        return await method(request, context)

    return guarded


def _guard_unary_stream(
    method: Callable[[Any, Context], AsyncIterator[Any]]
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
        if isinstance(request, _Malformed):
            await _abort(context, InvalidRequest(request.message))
        async for reply in method(request, context):
            yield reply

    return guarded


def _guard_stream_unary(method: Callable[[Any, Context], Awaitable[Any]]) -> Callable[[Any, Context], Awaitable[Any]]:
    async def guarded(requests: Any, context: Context) -> Any:
        return await method(_checked(_aiter(requests), context), context)

    return guarded


def _guard_stream_stream(
    method: Callable[[Any, Context], AsyncIterator[Any]]
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def guarded(requests: Any, context: Context) -> AsyncIterator[Any]:
        async for reply in method(_checked(_aiter(requests), context), context):
            yield reply

    return guarded


# By the RPC's shape (`Rpc.kind`): what refuses its malformed requests, and what observes its calls.
_GUARDED: Final[dict[str, Callable[[Any], Any]]] = {
    "unary_unary": _guard_unary_unary, "unary_stream": _guard_unary_stream,
    "stream_unary": _guard_stream_unary, "stream_stream": _guard_stream_stream,
}
_OBSERVED: Final[dict[str, Callable[[Any, str, Observe | None], Any]]] = {
    "unary_unary": _observed_unary, "unary_stream": _observed_stream,
    "stream_unary": _observed_unary, "stream_stream": _observed_stream,
}


def _status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, OipError):
        return GRPC_CODE[exc.kind], exc.message
    if isinstance(exc, codec.CodecError):
        return GRPC_CODE[ErrorKind.INVALID_ARGUMENT], bounded(str(exc))
    log.error("unexpected error answering a gRPC request", exc_info=exc)
    return GRPC_CODE[ErrorKind.MODEL_FAILURE], f"internal server error ({type(exc).__name__})"


async def _abort(context: Context, exc: BaseException) -> NoReturn:
    if isinstance(exc, grpc.aio.AbortError):  # aborted already (a malformed request in a stream)
        raise exc
    code, message = _status(exc)
    await cast("grpc.aio.ServicerContext[Any, Any]", context).abort(code, message)


async def once(item: _T) -> AsyncIterator[_T]:
    """A stream of one item: the request of an RPC whose client side is unary, for `ServicerBase.stream_call`."""
    yield item


async def _aiter(source: Iterator[_T] | AsyncIterator[_T]) -> AsyncIterator[_T]:
    if isinstance(source, AsyncIterator):
        async for item in source:
            yield item
    else:
        for item in source:
            yield item
