"""The gRPC servicer's machinery: what each RPC method of the rendered `Servicer` (`service`) does, by the RPC's
shape, and the gRPC form of errors.

Methods only decode, call the data plane and encode; every rule of the protocol lives in the data plane.
- Ordinary RPCs hand their request message to the data plane and return its reply.
- Inference is decoded and encoded by the service's `InferCodec` (`infer_codec`).
- A data plane error maps to its status code (`GRPC_CODE`); anything unexpected is INTERNAL (`errors.failure`:
  logged, never sent with a traceback). Messages over `Settings.max_request_bytes` are RESOURCE_EXHAUSTED.
- Every answered call is counted (metrics) and logged (the access log) by an `Observe` (`observer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NoReturn, TypeAlias, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf.message import Message

from ... import codec
from ...grpc import wire
from ...grpc.wire import ONE_BYTE_VARINTS
from ..core.dataplane_base import DataPlaneBase
from ..core.streaming import StreamError
from ..errors import ErrorKind, InvalidRequest, ModelFailure, OipError, failure
from ..observe.access_log import log_access
from ..observe.metrics import Metrics
from ..observe.tracing import carrier
from ..settings import Settings
from ..types import InferRequest, InferResponse
from .infer_codec import InferCodec, InferWire, Malformed, message_parser, message_size, serialize_reply

__all__ = ["GRPC_CODE", "Context", "Observe", "Rpc", "ServicerBase", "metadata", "method_handlers", "observer",
           "once", "status"]

_T = TypeVar("_T")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
Context: TypeAlias = "grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]"

# Told about every answered call (metrics, access log): RPC name, code's name, start (perf_counter_ns), request,
# bytes sent.
Observe: TypeAlias = Callable[[str, str, int, Any, int], None]

GRPC_CODE: Final[dict[ErrorKind, grpc.StatusCode]] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.MODEL_FAILURE: grpc.StatusCode.INTERNAL,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


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



class ServicerBase:
    """What every RPC method of the generated `Servicer` does: decode, call the data plane, encode, and map
    errors to statuses. The subclass sets the service's table (`service`, `rpcs`, `infer`)."""

    service: ClassVar[str]
    rpcs: ClassVar[tuple[Rpc, ...]]
    infer: ClassVar[InferCodec[Any]]
    # Whether the spec marks the operation the standard gRPC health service answers from (`serving`).
    grpc_health: ClassVar[bool] = False

    def __init__(self, dataplane: DataPlaneBase, settings: Settings, tracing: bool = False) -> None:
        self.dataplane = dataplane
        self.settings = settings
        self.tracing = tracing  # inference requests carry the caller's trace context (gRPC metadata)

    async def serving(self) -> bool:
        """Whether the server is ready, for the standard gRPC health service (`health`): the answer of the operation
        the spec marks `x-oip-grpc-health`, which the subclass asks when `grpc_health`."""
        raise NotImplementedError("the spec marks no operation x-oip-grpc-health")

    async def call(self, operation: Callable[[_Req], Awaitable[_Resp]], request: _Req, context: Context) -> _Resp:
        """An ordinary unary RPC: the data plane's reply to the request message."""
        try:
            return await operation(request)
        except Exception as exc:
            await _abort(context, exc)

    async def infer_call(
        self, operation: Callable[[InferRequest], Awaitable[InferResponse]], request: Any, context: Context
    ) -> Any:
        """Unary inference on the event loop: the response, serialized (the handler's serializer passes bytes
        through)."""
        try:
            if isinstance(request, InferWire):
                infer_request = self.infer.decode_request(request.message, self.settings, request.raw)
            else:
                infer_request = self.infer.decode_request(request, self.settings)
            infer_request.transport = "grpc"
            if self.tracing:
                infer_request.trace = carrier(metadata(context).get)
            return self.infer.serialize_response(await operation(infer_request))
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
                    yield self.infer.serialize_response(reply)
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
        trace = carrier(metadata(context).get) if self.tracing else None
        async for message in _aiter(requests):
            try:
                decoded: InferRequest | Exception = self.infer.decode_request(message, settings)
            except (OipError, codec.CodecError) as exc:  # this request fails, the stream goes on
                decoded = self.infer.request_error(message, exc)
            if isinstance(decoded, InferRequest):
                decoded.transport, decoded.trace = "grpc", trace
            yield decoded

    def _wrapped(self, rpc: Rpc, reply: InferResponse | Exception) -> Message | bytes:
        """A stream's response message, serialized for a response (the inference response's bytes framed as the
        wrapper's field: no copy of the message into the wrapper), or with the error of a failed request."""
        infer_field = rpc.stream_response_field
        assert infer_field is not None  # a stream of inference responses, wrapped (`stream_call`)
        if not isinstance(reply, Exception):
            try:
                inner = self.infer.serialize_response(reply)
                size = len(inner)
                return b"".join((_field_tag(rpc.response, infer_field),
                                 ONE_BYTE_VARINTS[size] if size < 0x80 else wire.varint(size), inner))  # one copy
            except Exception as exc:
                reply = exc
        error_field = cast(str, rpc.stream_error_field)
        wrapped = rpc.response()
        if isinstance(reply, Exception):  # the request failed; the stream goes on
            setattr(wrapped, error_field, failure(reply, "answering a gRPC stream").message)
            if isinstance(reply, StreamError):  # which request failed: id, model, final flag
                getattr(wrapped, infer_field).CopyFrom(self.infer.encode_response(reply.response))
        return wrapped


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
            serializer: Callable[[Any], bytes] = serialize_reply
        else:  # a streaming inference's responses may come serialized (`ServicerBase._wrapped`)
            deserializer = message_parser(rpc.request)
            serializer = serialize_reply if rpc.inference else rpc.response.SerializeToString
        make = getattr(grpc, f"{rpc.kind}_rpc_method_handler")
        handlers[rpc.name] = make(behavior, request_deserializer=deserializer, response_serializer=serializer)
    return handlers


async def _checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Malformed):
            await _abort(context, InvalidRequest(request.message))
        yield request


def observer(service: str, metrics: Metrics | None, access_log: bool) -> Observe | None:
    """What counts and logs each answered call (None when neither is on)."""
    if metrics is None and not access_log:
        return None

    def observe(rpc: str, code: str, start: int, request: Any, sent: int) -> None:
        if metrics is not None:
            metrics.count("grpc", rpc, code)
        if access_log:
            log_access("grpc", rpc, f"{service}/{rpc}", code, start, message_size(request), sent)

    return observe


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
        start, raised, sent = time.perf_counter_ns(), None, 0
        try:
            reply = await method(request, context)
            sent = message_size(reply)
            return reply
        except BaseException as exc:
            raised = exc
            raise
        finally:
            observe(rpc, _code(context, raised), start, request, sent)

    return observed


def _observed_stream(method: Callable[[Any, Context], AsyncIterator[Any]], rpc: str,
                     observe: Observe | None) -> Callable[[Any, Context], AsyncIterator[Any]]:
    if observe is None:
        return method

    async def observed(request: Any, context: Context) -> AsyncIterator[Any]:
        start, raised, sent = time.perf_counter_ns(), None, 0
        try:
            async for reply in method(request, context):
                sent += message_size(reply)
                yield reply
        except BaseException as exc:
            raised = exc
            raise
        finally:
            observe(rpc, _code(context, raised), start, None, sent)

    return observed


_TAGS: dict[tuple[type[Message], str], bytes] = {}


def _field_tag(message: type[Message], field: str) -> bytes:
    """The key of a length-delimited field of `message`, serialized."""
    tag = _TAGS.get((message, field))
    if tag is None:
        tag = _TAGS[message, field] = wire.varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)
    return tag


def metadata(context: Context) -> dict[str, str]:
    return metadata_of(context.invocation_metadata())


def metadata_of(pairs: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """A call's text metadata by key (binary `-bin` values left out)."""
    return {key: value for key, value in pairs or () if isinstance(value, str)}


def _guard_unary_unary(method: Callable[[Any, Context], Awaitable[Any]]) -> Callable[[Any, Context], Awaitable[Any]]:
    async def guarded(request: Any, context: Context) -> Any:
        if isinstance(request, Malformed):
            await _abort(context, InvalidRequest(request.message))
        return await method(request, context)

    return guarded


def _guard_unary_stream(
    method: Callable[[Any, Context], AsyncIterator[Any]]
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
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


def status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and details answering a call that raised `exc` (`errors.failure`)."""
    reason = failure(exc, "answering a gRPC request")
    return GRPC_CODE[reason.kind], reason.message


async def _abort(context: Context, exc: BaseException) -> NoReturn:
    if isinstance(exc, grpc.aio.AbortError):  # aborted already (a malformed request in a stream)
        raise exc
    code, message = status(exc)
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
