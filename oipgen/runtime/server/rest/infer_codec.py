"""The REST form of inference: a request body (JSON, or a JSON header followed by binary tensor data) to the data
plane's request, and its response back, without pydantic models or Python lists of elements on the binary path.

The JSON header is parsed with orjson, tensor `data` decoded by `codec.from_json`, and binary tensor data
(`Inference-Header-Content-Length`, `binary_data_size`) is viewed in place with `codec.from_raw`. Outputs are
written as JSON `data` (orjson writes numpy arrays directly) or as binary data after the JSON header (`binary_data`
per requested output; `binary_data_output` for the outputs the request does not list, as Triton does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ... import bodies, codec, datatypes, extensions, framing
from ..core.dataplane_base import TENSOR_OPERATIONS
from ..core.validation import tensor_elements
from ..errors import InvalidRequest, ModelFailure, Unimplemented
from ..settings import Settings
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .body import json_kind, parse_json
from .endpoints import ENDPOINTS

__all__ = [
    "NO_BINARY",
    "BinaryParts",
    "answer_body",
    "binary_enabled",
    "binary_output",
    "decode_infer_request",
    "encode_infer_response",
    "infer_answer",
    "json_output",
    "parse_infer_body",
    "request_parameters",
]

_BINARY_OUTPUT: Final = framing.BINARY_DATA_OUTPUT  # request parameters: default for outputs not listed
_BINARY_SIZE: Final = framing.BINARY_DATA_SIZE  # input and output parameters: bytes in the binary part
_BINARY_DATA: Final = framing.BINARY_DATA  # requested-output parameters: this output as binary
_SHARED_MEMORY: Final = extensions.SHARED_MEMORY_REGION  # tensor parameters: data held by the shared memory extension
_INT_RANGE: Final = (-(2**63), 2**64 - 1)  # parameter integers: int64, or uint64 above int64's range


def _fields(schema: str) -> tuple[str, ...]:
    return tuple(f.prop for f in bodies.BINDINGS[schema].fields)


def _item_schema(schema: str, prop: str) -> str:
    return next(f.schema or "" for f in bodies.BINDINGS[schema].fields if f.prop == prop)


# The fields of an inference request, of its inputs and of its requested outputs, from the spec (none of them
# takes null).
_INFER_BODY: Final = next(e.body for e in ENDPOINTS if e.operation in TENSOR_OPERATIONS and e.body)
_REQUEST_FIELDS: Final = _fields(_INFER_BODY)
_INPUT_FIELDS: Final = _fields(_item_schema(_INFER_BODY, "inputs"))
_OUTPUT_FIELDS: Final = _fields(_item_schema(_INFER_BODY, "outputs"))
# The reserved parameters whose values are integers: JSON has one number type, so 16.0 is read as 16 for these
# (a free-form parameter keeps the number as it came: a double over gRPC).
_INTEGER_PARAMETERS: Final = frozenset({
    extensions.BINARY_DATA_SIZE, extensions.CLASSIFICATION, extensions.SHARED_MEMORY_BYTE_SIZE,
    extensions.SHARED_MEMORY_OFFSET,
})
_BINARY_EXTENSION: Final = extensions.PARAMETERS[_BINARY_SIZE]
NO_BINARY: Final = (
    f"the {_BINARY_EXTENSION} extension is not enabled on this server: send and ask for tensor data as JSON "
    f"'data' (no Inference-Header-Content-Length header or '{_BINARY_SIZE}', '{_BINARY_OUTPUT}' and "
    f"'{_BINARY_DATA}' false)"
)



def binary_enabled(settings: Settings) -> bool:
    """Whether the binary tensor data extension is on (`Settings.extensions`; None: every extension)."""
    return settings.extensions is None or _BINARY_EXTENSION in settings.extensions


def _parameters(value: Any, where: str) -> dict[str, Any]:
    """A parameters object: a JSON object of booleans, numbers and strings (a fresh dict, safe to change)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} parameters must be a JSON object, got {json_kind(value)}")
    for key, item in value.items():
        if isinstance(item, float) and key in _INTEGER_PARAMETERS and item.is_integer():
            value[key] = int(item)
            continue
        if isinstance(item, bool | float | str):
            continue
        if isinstance(item, int) and _INT_RANGE[0] <= item <= _INT_RANGE[1]:
            continue
        raise InvalidRequest(
            f"{where} parameter '{key}' has invalid type: parameter values are booleans, numbers or strings, "
            f"got {json_kind(item)}"
        )
    return value


def request_parameters(value: Any, binary_on: bool) -> tuple[dict[str, Any], bool]:
    """A request's `parameters` (a new dict: `value` is left as it is) without `binary_data_output`, and that flag:
    whether the outputs the request does not list are answered as binary data (`binary_on`: the extension is)."""
    parameters = _parameters(dict(value) if isinstance(value, dict) else value, "request")
    default_binary = bool(_flag(parameters, _BINARY_OUTPUT, "request"))
    if default_binary and not binary_on:
        raise Unimplemented(NO_BINARY)
    return parameters, default_binary


def _no_null(item: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    """InvalidRequest when one of the `fields` of `item` is JSON null: no field takes null (leave it out instead);
    keys the protocol does not have are ignored, whatever their value."""
    if None in item.values():
        key = next((k for k in fields if k in item and item[k] is None), None)
        if key is not None:
            raise InvalidRequest(f"{where}: '{key}' is null; leave the field out instead")


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        missing = f"needs '{key}'" if value is None else f"'{key}' must be a string, got {json_kind(value)}"
        raise InvalidRequest(f"{where} {missing}")
    return value


def _flag(params: dict[str, Any], key: str, where: str) -> bool | None:
    value = params.pop(key, None)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{where} parameter '{key}' must be a boolean, got {json_kind(value)}")
    return value


def parse_infer_body(raw: bytes | memoryview, header_length: str | None) -> tuple[Any, memoryview | None]:
    """An inference body's JSON (parsed: any JSON value) and its binary part (None without a header length)."""
    try:
        head, rest = framing.split(raw, header_length)
    except framing.FramingError as exc:
        raise InvalidRequest(str(exc)) from None
    if not len(head):
        raise InvalidRequest("the request body is empty; expected a JSON inference request")
    return parse_json(head, "the inference request"), rest


def decode_infer_request(
    raw: bytes | memoryview, header_length: str | None, settings: Settings,
    parsed: tuple[Any, memoryview | None] | None = None,
) -> tuple[InferRequest, dict[str, bool], bool]:
    """Decode an inference body: JSON, or a JSON header followed by binary tensor data (`parsed`: what
    `parse_infer_body` made of it already).

    Returns the request (model name and version still empty: they come from the path), whether each listed
    output is wanted as binary data, and the binary default for outputs the request does not list.
    """
    doc, rest = parse_infer_body(raw, header_length) if parsed is None else parsed
    binary = framing.BinaryData(rest)
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the inference request must be a JSON object, got {json_kind(doc)}")
    _no_null(doc, _REQUEST_FIELDS, "the inference request")

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {json_kind(request_id)}")
    binary_on = binary_enabled(settings)  # off: asking for binary data (true flags, binary_data_size) is 501
    parameters, default_binary = request_parameters(doc.get("parameters"), binary_on)

    items = doc.get("inputs")
    if not isinstance(items, list):
        raise InvalidRequest("the inference request needs 'inputs', an array of tensors" if items is None
                             else f"'inputs' must be an array, got {json_kind(items)}")
    inputs: list[Tensor] = []
    limit = settings.max_tensor_elements
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input {i} must be a JSON object, got {json_kind(item)}")
        where = f"input {i}"
        _no_null(item, _INPUT_FIELDS, where)
        name = _string(item, "name", where)
        where = f"input '{name}'"
        datatype = _string(item, "datatype", where)
        shape = item.get("shape")
        if shape is None:
            raise InvalidRequest(f"{where} needs 'shape'")
        tensor_elements(name, shape, limit)
        params = _parameters(item.get("parameters"), where)
        size = params.pop(_BINARY_SIZE, None)
        if size is not None and not binary_on:
            raise Unimplemented(NO_BINARY)
        data = item.get("data")
        array: npt.NDArray[Any] | None
        if size is not None:
            if data is not None:
                raise InvalidRequest(f"{where} must set only one of 'data' and 'binary_data_size', it sets both")
            try:
                chunk = binary.take(size, where)
            except framing.FramingError as exc:
                raise InvalidRequest(str(exc)) from None
            array = codec.from_raw(chunk, datatype, shape, name=name)
        elif data is not None:
            array = codec.from_json(data, datatype, shape, name=name)
        elif _SHARED_MEMORY in params:
            array = None  # the data plane reads it from the region
        else:
            raise InvalidRequest(f"{where} has no data: set 'data' or binary_data_size")
        inputs.append(Tensor(name, datatype, list(shape), array, params))
    try:
        binary.finish()
    except framing.FramingError as exc:
        raise InvalidRequest(str(exc)) from None

    listed: dict[str, bool] = {}
    outputs: list[RequestedOutput] = []
    wanted = doc.get("outputs")
    if wanted is not None:
        if not isinstance(wanted, list):
            raise InvalidRequest(f"'outputs' must be an array, got {json_kind(wanted)}")
        for i, item in enumerate(wanted):
            if not isinstance(item, dict):
                raise InvalidRequest(f"output {i} must be a JSON object, got {json_kind(item)}")
            _no_null(item, _OUTPUT_FIELDS, f"output {i}")
            name = _string(item, "name", f"output {i}")
            params = _parameters(item.get("parameters"), f"output '{name}'")
            listed[name] = bool(_flag(params, _BINARY_DATA, f"output '{name}'"))
            if listed[name] and not binary_on:
                raise Unimplemented(NO_BINARY)
            if listed[name] and _SHARED_MEMORY in params:
                raise InvalidRequest(f"output '{name}' can't set both '{_SHARED_MEMORY}' and '{_BINARY_DATA}'")
            outputs.append(RequestedOutput(name, params))

    infer_request = InferRequest(
        model_name="", id=request_id or "", parameters=parameters, inputs=inputs, outputs=outputs
    )
    return infer_request, listed, default_binary


def encode_infer_response(
    response: InferResponse, listed: Mapping[str, bool], default_binary: bool, *, parts: bool = False
) -> Response:
    """The REST answer: JSON, or a JSON header followed by the outputs asked for as binary data. With `parts` (the
    server writes bytes-like bodies as they are: `http.BUFFER_BODIES`), large binary outputs are sent from the
    model's arrays (`BinaryParts`)."""
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for tensor in response.outputs:
        parameters = dict(tensor.parameters)
        if tensor.data is None:  # written to shared memory: no data here, as Triton answers
            entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
            if parameters:
                entry["parameters"] = parameters
        elif listed.get(tensor.name, default_binary):
            entry = binary_output(tensor.name, tensor.datatype, tensor.shape, tensor.data, chunks, parameters)
        else:
            entry = json_output(tensor.name, tensor.datatype, tensor.shape, tensor.data, parameters)
        outputs.append(entry)
    return infer_answer(answer_body(response.model_name, response.model_version, response.id, response.parameters,
                                    outputs), chunks, parts)


def answer_body(model_name: str, model_version: str, request_id: str, parameters: dict[str, Any] | None,
                outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """An inference answer's JSON: the model, the request's id and the response parameters if any, the outputs."""
    body: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id:
        body["id"] = request_id
    if parameters:
        body["parameters"] = parameters
    body["outputs"] = outputs
    return body


def json_output(name: str, datatype: str, shape: list[int], data: npt.NDArray[Any] | None,
                parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """An output of the answer with its data as JSON (`parameters`, if any, before it)."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if parameters:
        entry["parameters"] = parameters
    entry["data"] = _json_data(name, datatype, data)
    return entry


def binary_output(name: str, datatype: str, shape: list[int], data: npt.NDArray[Any],
                  chunks: list[bytes | memoryview], parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """An output of the answer with its data in the binary part: its bytes appended to `chunks` (none when empty),
    its entry returned (`binary_data_size` last in its parameters)."""
    try:
        raw = codec.to_raw(data, datatype, name=name)
    except codec.CodecError as exc:
        raise ModelFailure(str(exc)) from None
    size = framing.size_of(raw)
    if size:
        chunks.append(raw)
    return {"name": name, "datatype": datatype, "shape": shape,
            "parameters": {**(parameters or {}), _BINARY_SIZE: size}}


def infer_answer(body: dict[str, Any], chunks: list[bytes | memoryview], parts: bool) -> Response:
    """The answer of the JSON `body` followed by the binary `chunks` (none: all JSON). With `parts` (the server
    writes bytes-like bodies as they are: `http.BUFFER_BODIES`), large binary outputs are sent from the model's
    arrays (`BinaryParts`)."""
    header = _header(body)
    if chunks and parts and sum(framing.size_of(chunk) for chunk in chunks) >= _PARTS_FROM:
        return BinaryParts(header, chunks)
    return _Answer(*framing.join_raw(header, chunks))


def _header(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise ModelFailure(f"the model's response cannot be written as JSON: {exc}") from None


class _Answer(Response):
    """A whole inference answer with the headers `framing.join_raw` gives, then its content length: what `Response`
    would make of `framing.join`'s, without working them out again for every answer."""

    def __init__(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.body = body
        self.background = None
        self.raw_headers = [*headers, (b"content-length", str(len(body)).encode("latin-1"))]


_PARTS_FROM: Final = 1 << 16  # binary output bytes from which an answer is sent as its parts, not one body


class BinaryParts(Response):
    """A binary inference answer written as its parts: the JSON header, then each output's bytes as the data plane
    gave them (views of the model's arrays where possible), so the tensor data is never copied into one body.
    Below _PARTS_FROM bytes, one body costs less than a message per part."""

    def __init__(self, header: bytes, chunks: list[bytes | memoryview]) -> None:
        self.parts = [header, *chunks]
        self.size = sum(framing.size_of(part) for part in self.parts)
        super().__init__(None, headers={**framing.headers(header), "Content-Length": str(self.size)})

    async def send_parts(self, send: Send) -> None:
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await self.send_parts(send)


def _json_data(name: str, datatype: str, data: npt.NDArray[Any] | None) -> npt.NDArray[Any] | list[Any]:
    """Flat JSON `data` of an output: the array itself where orjson writes it as `to_json` would, else a list."""
    info = datatypes.BY_NAME.get(datatype)
    if info is not None and not info.json:
        raise InvalidRequest(
            f"output '{name}': sending {info.name} data via JSON is not supported; ask for it as binary data "
            "(binary_data: true)"
        )
    if data is None:
        return []
    if info is not None and isinstance(data, np.ndarray) and data.dtype == info.dtype and info.dtype.isnative:
        kind = info.dtype.kind
        if kind in "biu" or (kind == "f" and info.dtype.itemsize == 8):
            return np.ascontiguousarray(data).reshape(-1)
        if kind == "f":  # float32: widened, so the numbers read exactly as Python floats print them
            return data.astype(np.float64).reshape(-1)
    try:
        return codec.to_json(data, datatype, name=name)
    except codec.CodecError as exc:
        raise ModelFailure(str(exc)) from None
