"""The gRPC form of inference: request messages to the data plane's tensors, its answers to response messages.

Inference decodes typed `contents` (`codec.from_contents_message`, which refuses a field that does not belong to
the datatype) or `raw_input_contents` (zero-copy `codec.from_raw`; entry i belongs to the i-th input without
contents, and a request may not use both forms) and answers in `raw_output_contents` only, one entry per output,
as Triton does. Answers are written as bytes from pieces kept once made (`InferCodec.serialize_response`), and large
requests keep their raw tensor bytes out of the protobuf message (`InferWire`), so tensor data is never copied into
or out of one. Request bytes that do not parse as the message become `Malformed`, which the servicer refuses with
INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, Final, Generic, TypeVar, cast

from google.protobuf.message import DecodeError, Message

from ... import codec, convert, extensions
from ...grpc import wire
from ..core.streaming import StreamError, final_response
from ..core.validation import tensor_elements
from ..errors import InvalidRequest, ModelFailure, failure
from ..settings import Settings
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor

__all__ = ["InferCodec", "InferWire", "Malformed", "message_parser", "message_size", "serialize_reply"]

_M = TypeVar("_M", bound=Message)
_R = TypeVar("_R", bound=Message)
_SHARED_MEMORY: Final = extensions.SHARED_MEMORY_REGION  # input parameters: data held by the shared memory extension
# Inference messages at least this large keep their raw tensor bytes out of the protobuf message: the request's
# are read as views of the received bytes, the response's are written after the serialized rest (no copies).
_BIG: Final = 1 << 16
_MAX_PIECES: Final = 4096  # serialized pieces of answers kept (`InferCodec.serialize_response`)


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
        # The response class called with its fields as keywords (protobuf's own stubs give `Message.__init__`
        # no keyword fields; each generated class has its own).
        self.new_response: Callable[..., _R] = response
        self.param_type = param_type
        self.raw_input_field = raw_input_field
        self.raw_output_field = raw_output_field
        self.raw_tag = wire.varint(raw_output_field << 3 | 2)  # the key of a raw_output_contents entry
        # Serialized pieces of answers (`serialize_response`), by what they are made of: the model's name and
        # version, an output's name, datatype and shape, a map of flags. Written by every thread that answers: an
        # entry is only ever added whole, and one lost to a concurrent clear is made again.
        self._heads: dict[tuple[str, str], bytes] = {}
        self._headers: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
        self._flags: dict[tuple[tuple[str, bool], ...], bytes] = {}

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
            tensor_elements(name, shape, limit)
            params = self.params_from_proto(tensor.parameters)
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
            parameters=self.params_from_proto(message.parameters),
            inputs=inputs,
            outputs=[RequestedOutput(o.name, self.params_from_proto(o.parameters)) for o in message.outputs],
        )

    def encode_response(self, response: InferResponse) -> _R:
        """The gRPC answer as a message: every output's data in `raw_output_contents` (one entry per output, even
        empty), as `serialize_response` writes it."""
        return self.response.FromString(self.serialize_response(response))

    def serialize_response(self, response: InferResponse) -> bytes:
        """The serialized gRPC answer: the bytes protobuf writes for its message (the fields in their order),
        joined from pieces kept once made, since they repeat from answer to answer (the model's name and version,
        each output's header, a parameters map of flags), and the outputs' raw bytes (a large output's straight
        from its array's memory: never copied into a protobuf message)."""
        parts: list[bytes | memoryview] = [self.head(response.model_name, response.model_version)]
        if response.id:
            parts.append(self.new_response(id=response.id).SerializeToString())
        if response.parameters:
            parts.append(self._parameters_piece(response.parameters))
        raws: list[bytes | memoryview] = []
        for tensor in response.outputs:
            if tensor.parameters:
                parts.append(self._output_header(tensor.name, tensor.datatype, tensor.shape, tensor.parameters))
            else:
                parts.append(self.header(tensor.name, tensor.datatype, tuple(tensor.shape)))
            if tensor.data is None:
                raws.append(b"")
                continue
            try:
                raws.append(codec.to_raw(tensor.data, tensor.datatype, name=tensor.name))
            except codec.CodecError as exc:
                raise ModelFailure(str(exc)) from None
        return b"".join(parts + wire.field_entries(self.raw_output_field, raws))

    def head(self, model_name: str, model_version: str) -> bytes:
        """The answer's first fields, serialized: the model's name and version."""
        head = self._heads.get((model_name, model_version))
        if head is None:
            if len(self._heads) >= _MAX_PIECES:  # names that keep changing: start over
                self._heads.clear()
            head = self.new_response(model_name=model_name, model_version=model_version).SerializeToString()
            self._heads[model_name, model_version] = head
        return head

    def header(self, name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
        """An output without parameters as an entry of the answer's `outputs`, serialized (its data goes in
        `raw_output_contents`)."""
        header = self._headers.get((name, datatype, shape))
        if header is None:
            if len(self._headers) >= _MAX_PIECES:  # shapes that keep changing: start over
                self._headers.clear()
            header = self._headers[name, datatype, shape] = self._output_header(name, datatype, shape, {})
        return header

    def _output_header(self, name: str, datatype: str, shape: Sequence[int], params: Mapping[str, Any]) -> bytes:
        message = cast(Any, self.response())
        out = message.outputs.add(name=name, datatype=datatype, shape=shape)
        self._params_to_proto(params, out.parameters, f"output '{name}'")
        return bytes(message.SerializeToString())

    def _parameters_piece(self, params: Mapping[str, Any]) -> bytes:
        """The response's parameters map, serialized; kept when its values are flags (`triton_final_response` on
        every response of a stream)."""
        flags = self._flags
        key: tuple[tuple[str, bool], ...] | None = tuple(params.items()) if len(params) <= 2 else None
        if key is not None:
            for _, value in key:
                if type(value) is not bool:  # kept by value, and 1 == True: flags only
                    key = None
                    break
            else:
                piece = flags.get(key)
                if piece is not None:
                    return piece
        message = cast(Any, self.response())
        self._params_to_proto(params, message.parameters, "response")
        piece = bytes(message.SerializeToString())
        if key is not None:
            if len(flags) >= _MAX_PIECES:
                flags.clear()
            flags[key] = piece
        return piece

    def request_error(self, message: Any, exc: Exception) -> StreamError:
        """A stream's request that cannot be decoded: its error, with what identifies the request."""
        error = failure(exc)
        request = InferRequest(model_name=message.model_name, model_version=message.model_version, id=message.id)
        return StreamError(error, final_response(request))

    def parser(self, message_type: type[_M]) -> Callable[[bytes], _M | Malformed | InferWire]:
        """The request deserializer of unary inference: large requests keep their raw contents as views."""
        plain = message_parser(message_type)
        field = self.raw_input_field

        def parse(data: bytes) -> _M | Malformed | InferWire:
            if len(data) < _BIG:
                return plain(data)
            try:
                rest, raw = wire.split_field(data, field)
            except (ValueError, IndexError):  # not well-formed: protobuf says why
                return plain(data)
            message = plain(rest)
            return InferWire(message, raw) if raw and not isinstance(message, Malformed) else message

        return parse

    def params_from_proto(self, entries: Mapping[str, Any]) -> dict[str, Any]:
        return convert.params_from_proto(self.param_type, entries)

    def _params_to_proto(self, params: Mapping[str, Any], target: MutableMapping[str, Any], where: str) -> None:
        """Fill a parameters map: bool, int (int64, or uint64 above its range), float and str values."""
        try:
            convert.params_to_proto(self.param_type, params, target)
        except convert.ConvertError as exc:
            raise ModelFailure(f"{where} {exc}") from None


class Malformed:
    """What a request deserializes to when its bytes are not the message: the servicer refuses it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def message_parser(message_type: type[_M]) -> Callable[[bytes], _M | Malformed]:
    """The request deserializer of a message type: bytes that do not parse become `Malformed`."""
    def parse(data: bytes) -> _M | Malformed:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {message_type.DESCRIPTOR.full_name}: {exc}")

    return parse


class InferWire:
    """A large inference request: the message without its raw_input_contents, which are views of the bytes
    received (entries in order), so that the tensors are never copied out of them."""

    __slots__ = ("message", "raw")

    def __init__(self, message: Any, raw: list[memoryview]) -> None:
        self.message = message
        self.raw = raw


def serialize_reply(reply: Any) -> bytes:
    return reply if isinstance(reply, bytes) else bytes(reply.SerializeToString())



def message_size(item: Any) -> int:
    """The serialized size of a request or reply (raw tensor bytes included)."""
    if isinstance(item, bytes | memoryview):
        return len(item)
    if isinstance(item, InferWire):
        return int(item.message.ByteSize()) + sum(entry.nbytes for entry in item.raw)
    if isinstance(item, Message):
        return int(item.ByteSize())
    return 0

