"""The gRPC clients' machinery: channels, calls, errors and the inference messages. `grpc.py` (rendered from the
spec) holds what the spec decides: the service's stub, the inference messages' types and raw fields
(`InferMessages`), and one method per operation, each calling the ways of `GrpcClientBase` (sync) or
`AsyncGrpcClientBase` (grpc.aio).

Inference sends `raw_input_contents` (the arrays' bytes, no per-element work) and reads `raw_output_contents`
or typed `contents`, whichever the server answers with.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from types import TracebackType
from typing import Any, ClassVar, Final, Generic, Self, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from .. import convert
from ..grpc import wire
from ._shared import Headers, merge, read_answer
from .errors import InvalidArgument, OipClientError, ResponseError, from_grpc
from .propagation import with_trace_context
from .tensors import (
    CONTENTS,
    NONE,
    RAW,
    Entry,
    InferRequest,
    InferResult,
    Inputs,
    Outputs,
    Param,
    Parameters,
    PreparedInput,
    RequestedOutput,
    prepare_inputs,
    raw_bytes,
    raw_data,
    requested_outputs,
)

__all__ = [
    "MAX_MESSAGE_SIZE", "ZERO_COPY_BYTES", "AsyncGrpcClientBase", "GrpcClientBase", "InferMessages", "answer",
]

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Q = TypeVar("_Q", bound=Message)
_P = TypeVar("_P", bound=Message)
_REGISTERED: Final[dict[str, Any]] = {"_registered_method": True}  # as the generated stub registers its methods

MAX_MESSAGE_SIZE: Final = 2**31 - 1
"""The default message size limit each way: as large as gRPC allows."""
ZERO_COPY_BYTES: Final = 1 << 16
"""From this many bytes of raw tensor data up, inference messages are written and read around protobuf: the
tensors' bytes go from the arrays into the message bytes in one copy, and outputs are views of the answer's bytes
(protobuf would copy each tensor three times on the way out and twice on the way in). Smaller messages go
through protobuf, which is faster for them."""


def answer(schema: str, reply: Any, rest_only: Mapping[str, Any]) -> Any:
    """The REST body of `schema` for the reply `reply`, read as a REST answer is (`_shared.read_answer`)."""
    try:
        converted = convert.proto_to_rest(schema, reply, **rest_only)
    except (ValueError, TypeError, KeyError) as exc:
        raise ResponseError(f"the server's answer does not convert to {schema}: {exc}") from None
    return read_answer(schema, converted, rest_only)


class InferMessages(Generic[_Q, _P]):
    """The inference messages of the spec, `_Q` the request and `_P` the response: their parameters maps' value
    type (`param_type`, full name) and the repeated bytes fields that carry raw tensor data, as (name, number)
    (protobuf wire format: tag = number << 3 | 2)."""

    def __init__(
        self, request: type[_Q], response: type[_P], *, param_type: str, raw_input: tuple[str, int],
        raw_output: tuple[str, int],
    ) -> None:
        # Called with the message's fields as keywords: a factory of `_Q` to the type checker (protobuf's own
        # stubs give `Message.__init__` no keyword fields; each generated class has its own).
        self.request: Callable[..., _Q] = request
        self.response = response
        self.param_type = param_type
        self.raw_input, self.raw_input_field = raw_input
        self.raw_output, self.raw_output_field = raw_output
        self.request_name = request.DESCRIPTOR.full_name
        self.response_name = response.DESCRIPTOR.full_name

    def encode_request(
        self,
        model: str,
        version: str,
        inputs: Sequence[PreparedInput],
        outputs: Sequence[RequestedOutput] = (),
        *,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> _Q:
        """The inference request message: every input's data in the raw input field."""
        request = self._header(model, version, inputs, outputs, request_id, parameters)
        getattr(request, self.raw_input).extend(raw_bytes(tensor) for tensor in inputs)
        return request

    def encode_request_bytes(
        self,
        model: str,
        version: str,
        inputs: Sequence[PreparedInput],
        outputs: Sequence[RequestedOutput] = (),
        *,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> bytes:
        """The serialized inference request, as `encode_request(...).SerializeToString()` gives it, written with
        one copy of the tensor data when there is much of it (see ZERO_COPY_BYTES)."""
        request = self._header(model, version, inputs, outputs, request_id, parameters)
        chunks = [raw_data(tensor) for tensor in inputs]
        if sum(len(chunk) if isinstance(chunk, bytes) else chunk.nbytes for chunk in chunks) < ZERO_COPY_BYTES:
            getattr(request, self.raw_input).extend(
                chunk if isinstance(chunk, bytes) else chunk.tobytes() for chunk in chunks
            )
            return request.SerializeToString()
        # The raw entries, after the other fields: a parser reads them in order all the same.
        return b"".join([request.SerializeToString(), *wire.field_entries(self.raw_input_field, chunks)])

    def decode_response_bytes(self, data: bytes) -> InferResult:
        """The result of a serialized inference response; raw outputs are views of `data` when there is much of
        it (see ZERO_COPY_BYTES)."""
        if len(data) < ZERO_COPY_BYTES:
            try:
                return self.decode_response(self.response.FromString(data))
            except DecodeError as exc:
                raise ResponseError(f"the server's answer is not a valid {self.response_name}: {exc}") from None
        message, raw = self._split_raw(data)
        return self.decode_response(message, raw)

    def decode_response(self, response: _P, raw: Sequence[bytes | memoryview] | None = None) -> InferResult:
        """The result of an inference response message.

        With one raw output entry per output (Triton and this package's server always answer so, MLServer when the
        request was raw, with empty typed contents beside), output i reads entry i; otherwise each output reads
        its typed `contents` when they hold data (MLServer's answer to a typed request), else the next raw entry.
        """
        message = cast(Any, response)
        if raw is None:
            raw = getattr(message, self.raw_output)
        outputs = message.outputs
        entries: list[Entry] = []
        if len(raw) == len(outputs):  # one raw entry per output (Triton, this package's server, MLServer asked raw)
            for output, data in zip(outputs, raw, strict=True):
                entries.append(
                    (output.name, output.datatype, tuple(output.shape), self._params(output.parameters), RAW, data)
                )
        else:  # typed contents, with raw entries (if any) for the outputs without contents, in order
            next_raw = 0
            for output in outputs:
                params = self._params(output.parameters)
                shape = tuple(output.shape)
                if output.HasField("contents") and output.contents.ListFields():
                    entries.append((output.name, output.datatype, shape, params, CONTENTS, output.contents))
                elif next_raw < len(raw):
                    entries.append((output.name, output.datatype, shape, params, RAW, raw[next_raw]))
                    next_raw += 1
                else:
                    entries.append((output.name, output.datatype, shape, params, NONE, None))
        return InferResult(
            model_name=message.model_name,
            model_version=message.model_version,
            id=message.id,
            parameters=self._params(message.parameters),
            entries=entries,
        )

    def stream_result(self, response: _P, error: str, raise_errors: bool) -> InferResult:
        """A stream's answer: its result, or (`raise_errors`) its error raised."""
        if error and raise_errors:
            raise OipClientError(error)
        result = self.decode_response(response)
        result.error = error
        return result

    def stream_request(
        self, model: str, version: str, item: InferRequest | Inputs, datatypes: Mapping[str, str] | None
    ) -> _Q:
        """The request message of one item of a stream (an `InferRequest`, or inputs as `infer` takes them)."""
        if not isinstance(item, InferRequest):
            item = InferRequest(item)
        return self.encode_request(
            model, version, prepare_inputs(item.inputs, datatypes), requested_outputs(item.outputs),
            request_id=item.id, parameters=item.parameters,
        )

    def _header(
        self,
        model: str,
        version: str,
        inputs: Sequence[PreparedInput],
        outputs: Sequence[RequestedOutput],
        request_id: str,
        parameters: Parameters | None,
    ) -> _Q:
        request = self.request(model_name=model, model_version=version, id=request_id)
        message = cast(Any, request)
        if parameters:
            self._set_params(message.parameters, parameters, "request")
        tensors = message.inputs
        for tensor in inputs:
            entry = tensors.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            if tensor.parameters:
                self._set_params(entry.parameters, tensor.parameters, f"input '{tensor.name}'")
        for output in outputs:
            wanted = message.outputs.add(name=output.name)
            if output.parameters:
                self._set_params(wanted.parameters, output.parameters, f"output '{output.name}'")
        return request

    def _split_raw(self, data: bytes) -> tuple[_P, list[memoryview]]:
        """The message without its raw output entries, parsed by protobuf, and those entries as views of `data`."""
        try:
            rest, raw = wire.split_field(data, self.raw_output_field)
            return self.response.FromString(rest), raw
        except (ValueError, IndexError, DecodeError) as exc:
            raise ResponseError(f"the server's answer is not a valid {self.response_name}: {exc}") from None

    def _set_params(self, target: MutableMapping[str, Any], params: Parameters, where: str) -> None:
        """Fill a parameters map: bool, int (int64, or uint64 above its range), float and str values."""
        try:
            convert.params_to_proto(self.param_type, params, target)
        except convert.ConvertError as exc:
            raise InvalidArgument(f"{where} {exc}") from None

    def _params(self, entries: Mapping[str, Any]) -> dict[str, Param]:
        return convert.params_from_proto(self.param_type, entries) if entries else {}


def _channel_options(
    max_message_size: int,
    keepalive_time_ms: int | None,
    keepalive_timeout_ms: int | None,
    keepalive_permit_without_calls: bool,
    options: Sequence[tuple[str, Any]],
) -> list[tuple[str, Any]]:
    args: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.max_receive_message_length", max_message_size),
    ]
    if keepalive_time_ms is not None:
        args.append(("grpc.keepalive_time_ms", keepalive_time_ms))
    if keepalive_timeout_ms is not None:
        args.append(("grpc.keepalive_timeout_ms", keepalive_timeout_ms))
    if keepalive_permit_without_calls:
        args.append(("grpc.keepalive_permit_without_calls", 1))
    return args + list(options)


class _GrpcBase:
    """What both gRPC clients hold besides their channel; the generated class sets the service's table
    (`_stub_type`, `_messages`, `_infer_method`)."""

    _stub_type: ClassVar[type[Any]]  # the service's stub class
    _messages: ClassVar[InferMessages[Any, Any]]
    _infer_method: ClassVar[str]  # /package.Service/Method of unary inference

    def __init__(
        self,
        target: str,
        timeout: float | None,
        headers: Headers | None,
        compression: grpc.Compression | None,
        channel: grpc.Channel | grpc.aio.Channel,
        owned: bool,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.headers = {key.lower(): value for key, value in (headers or {}).items()}
        self.compression = compression
        self._owned = owned
        self.channel = channel
        self._stub: Any = self._stub_type(channel)
        # Unary inference with the messages as bytes, written and read by `InferMessages.encode_request_bytes`
        # and `decode_response_bytes` rather than by the stub's protobuf (de)serializers
        self._infer: grpc.UnaryUnaryMultiCallable[bytes, bytes] = cast(
            "grpc.UnaryUnaryMultiCallable[bytes, bytes]", channel.unary_unary(self._infer_method, **_REGISTERED)
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _metadata(self, headers: Headers | None) -> tuple[tuple[str, str], ...] | None:
        given = {key.lower(): value for key, value in headers.items()} if headers else None
        merged = with_trace_context(merge(self.headers, given))
        return tuple(merged.items()) if merged else None


def _target(target: str) -> str:
    return target.split("://", 1)[1] if "://" in target else target


def _credentials(
    credentials: grpc.ChannelCredentials | None, ssl: bool, root_certificates: bytes | None,
    private_key: bytes | None, certificate_chain: bytes | None,
) -> grpc.ChannelCredentials | None:
    if credentials is None and (ssl or root_certificates or private_key or certificate_chain):
        return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return credentials


class GrpcClientBase(_GrpcBase):
    """A gRPC client of an Open Inference Protocol server (grpc).

    One channel per client; use it as a context manager or call `close()`.

    - `target`: `host:port` (a `scheme://` prefix is dropped).
    - `timeout`: seconds per call (None: no deadline); each method also takes `timeout=` (streams: no default).
    - `headers`: call metadata sent with every call (each method also takes `headers=`); keys are lower-cased.
    - TLS: `ssl=True` (system roots), or `root_certificates` / `private_key` / `certificate_chain` (PEM bytes), or
      ready `credentials`.
    - `max_message_size`: bytes each way (default: 2 GiB - 1, no practical limit; servers keep their own).
    - `keepalive_time_ms`, `keepalive_timeout_ms`, `keepalive_permit_without_calls`: HTTP/2 keepalive pings.
    - `options`: more channel arguments; `compression`: a `grpc.Compression` for every call.
    - `channel`: an existing grpc channel to use instead (not closed by `close()`).
    """

    channel: grpc.Channel

    def __init__(
        self,
        target: str = "127.0.0.1:8001",
        *,
        timeout: float | None = 60.0,
        headers: Headers | None = None,
        ssl: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_size: int = MAX_MESSAGE_SIZE,
        keepalive_time_ms: int | None = None,
        keepalive_timeout_ms: int | None = None,
        keepalive_permit_without_calls: bool = False,
        options: Sequence[tuple[str, Any]] = (),
        compression: grpc.Compression | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        owned = channel is None
        target = _target(target)
        if channel is None:
            args = _channel_options(
                max_message_size, keepalive_time_ms, keepalive_timeout_ms, keepalive_permit_without_calls, options
            )
            credentials = _credentials(credentials, ssl, root_certificates, private_key, certificate_chain)
            if credentials is not None:
                channel = grpc.secure_channel(target, credentials, options=args)
            else:
                channel = grpc.insecure_channel(target, options=args)
        super().__init__(target, timeout, headers, compression, channel, owned)

    def close(self) -> None:
        """Close the channel (unless it was given to the constructor)."""
        if self._owned:
            self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        headers: Headers | None,
        timeout: float | None,
    ) -> _Resp:
        try:
            return method(
                request, timeout=self._deadline(timeout), metadata=self._metadata(headers), compression=self.compression
            )
        except grpc.RpcError as exc:
            raise from_grpc(exc) from None

    def _infer_call(
        self, model: str, inputs: Inputs, outputs: Outputs | None, version: str, id: str,
        parameters: Parameters | None, datatypes: Mapping[str, str] | None, headers: Headers | None,
        timeout: float | None,
    ) -> InferResult:
        messages = self._messages
        request = messages.encode_request_bytes(
            model, version, prepare_inputs(inputs, datatypes), requested_outputs(outputs), request_id=id,
            parameters=parameters,
        )
        return messages.decode_response_bytes(self._call(self._infer, request, headers, timeout))

    def _stream_infer(
        self, method: Any, fields: tuple[str, str], model: str, requests: Iterable[InferRequest | Inputs],
        version: str, datatypes: Mapping[str, str] | None, headers: Headers | None, timeout: float | None,
        raise_errors: bool,
    ) -> Iterator[InferResult]:
        """The results of a streaming inference RPC (`method`, the stub's) whose answers carry the inference
        response and the error text in the fields named by `fields`."""
        messages = self._messages
        result_field, error_field = fields
        failed: list[BaseException] = []  # what went wrong while writing the requests (grpc only sees an end)

        def outgoing() -> Iterator[Any]:
            try:
                for item in requests:
                    yield messages.stream_request(model, version, item, datatypes)
            except Exception as exc:
                failed.append(exc)

        call = method(outgoing(), timeout=timeout, metadata=self._metadata(headers), compression=self.compression)
        try:
            for reply in call:
                yield messages.stream_result(getattr(reply, result_field), getattr(reply, error_field), raise_errors)
        except grpc.RpcError as exc:
            if failed:
                raise failed[0] from None
            raise from_grpc(exc) from None
        finally:
            call.cancel()
        if failed:
            raise failed[0]


class AsyncGrpcClientBase(_GrpcBase):
    """An asyncio gRPC client of an Open Inference Protocol server (grpc.aio).

    One channel per client; use it as an async context manager or call `await close()`.

    - `target`: `host:port` (a `scheme://` prefix is dropped).
    - `timeout`: seconds per call (None: no deadline); each method also takes `timeout=` (streams: no default).
    - `headers`: call metadata sent with every call (each method also takes `headers=`); keys are lower-cased.
    - TLS: `ssl=True` (system roots), or `root_certificates` / `private_key` / `certificate_chain` (PEM bytes), or
      ready `credentials`.
    - `max_message_size`: bytes each way (default: 2 GiB - 1, no practical limit; servers keep their own).
    - `keepalive_time_ms`, `keepalive_timeout_ms`, `keepalive_permit_without_calls`: HTTP/2 keepalive pings.
    - `options`: more channel arguments; `compression`: a `grpc.Compression` for every call.
    - `channel`: an existing grpc.aio channel to use instead (not closed by `close()`).
    """

    channel: grpc.aio.Channel

    def __init__(
        self,
        target: str = "127.0.0.1:8001",
        *,
        timeout: float | None = 60.0,
        headers: Headers | None = None,
        ssl: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_size: int = MAX_MESSAGE_SIZE,
        keepalive_time_ms: int | None = None,
        keepalive_timeout_ms: int | None = None,
        keepalive_permit_without_calls: bool = False,
        options: Sequence[tuple[str, Any]] = (),
        compression: grpc.Compression | None = None,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        owned = channel is None
        target = _target(target)
        if channel is None:
            args = _channel_options(
                max_message_size, keepalive_time_ms, keepalive_timeout_ms, keepalive_permit_without_calls, options
            )
            credentials = _credentials(credentials, ssl, root_certificates, private_key, certificate_chain)
            if credentials is not None:
                channel = grpc.aio.secure_channel(target, credentials, options=args)
            else:
                channel = grpc.aio.insecure_channel(target, options=args)
        super().__init__(target, timeout, headers, compression, channel, owned)

    async def close(self) -> None:
        """Close the channel (unless it was given to the constructor)."""
        if self._owned:
            await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        headers: Headers | None,
        timeout: float | None,
    ) -> _Resp:
        try:
            call = cast("grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]", method)
            return await call(
                request, timeout=self._deadline(timeout), metadata=self._metadata(headers), compression=self.compression
            )
        except grpc.RpcError as exc:
            raise from_grpc(exc) from None

    async def _infer_call(
        self, model: str, inputs: Inputs, outputs: Outputs | None, version: str, id: str,
        parameters: Parameters | None, datatypes: Mapping[str, str] | None, headers: Headers | None,
        timeout: float | None,
    ) -> InferResult:
        messages = self._messages
        request = messages.encode_request_bytes(
            model, version, prepare_inputs(inputs, datatypes), requested_outputs(outputs), request_id=id,
            parameters=parameters,
        )
        return messages.decode_response_bytes(await self._call(self._infer, request, headers, timeout))

    async def _stream_infer(
        self, method: Any, fields: tuple[str, str], model: str,
        requests: Iterable[InferRequest | Inputs] | AsyncIterable[InferRequest | Inputs], version: str,
        datatypes: Mapping[str, str] | None, headers: Headers | None, timeout: float | None, raise_errors: bool,
    ) -> AsyncGenerator[InferResult, None]:
        """The results of a streaming inference RPC (`method`, the stub's) whose answers carry the inference
        response and the error text in the fields named by `fields`."""
        messages = self._messages
        result_field, error_field = fields
        failed: list[BaseException] = []  # what went wrong while writing the requests (grpc only sees an end)

        async def outgoing() -> AsyncIterator[Any]:
            try:
                if isinstance(requests, AsyncIterable):
                    async for item in requests:
                        yield messages.stream_request(model, version, item, datatypes)
                else:
                    for item in requests:
                        yield messages.stream_request(model, version, item, datatypes)
            except Exception as exc:
                failed.append(exc)

        call = cast(
            "grpc.aio.StreamStreamCall[Any, Any]",
            method(outgoing(), timeout=timeout, metadata=self._metadata(headers), compression=self.compression),
        )
        try:
            async for reply in call:
                yield messages.stream_result(getattr(reply, result_field), getattr(reply, error_field), raise_errors)
        except grpc.RpcError as exc:
            if failed:
                raise failed[0] from None
            raise from_grpc(exc) from None
        finally:
            call.cancel()
        if failed:
            raise failed[0]
