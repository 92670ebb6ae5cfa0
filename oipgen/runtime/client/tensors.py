"""Tensors for the clients: what `infer` takes (numpy arrays, lists, `Tensor`) and what it returns (`InferResult`),
and the REST encoding of an inference (JSON, or JSON plus binary tensor data) shared by both REST clients.

Datatypes follow the array's dtype (`codec.datatype_of`): numpy `str_`, `bytes_` and object arrays are BYTES,
`ml_dtypes.bfloat16` is BF16, float16 is FP16. Name another datatype with `Tensor(name, data, datatype=...)` or
`infer(..., datatypes={name: datatype})`; the values are then converted when no value changes meaning, as
`codec.as_datatype` converts them (integers to narrower integers that hold them, whole floats to integers, numbers
to any float type, 0 and 1 to BOOL).

Elements are never handled one by one in Python. JSON `data` is written by orjson straight from the array; binary
and raw data is the array's memory; decoded outputs are views of the response's bytes (read-only arrays: `.copy()`
one to change it). The common cases take one numpy step (an array already in its wire dtype, raw bytes of a
fixed-size type, a flat JSON list of numbers); everything else, and every check with its error message, is
`codec`'s (`to_raw`, `to_json`, `from_raw`, `from_json`, `from_contents_message`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt
import orjson

from .. import codec, datatypes, extensions, framing
from .errors import InvalidArgument, ResponseError

__all__ = [
    "BINARY_EXTENSION",
    "HEADER_LENGTH",
    "InferRequest",
    "InferResult",
    "Inputs",
    "OutputMetadata",
    "Outputs",
    "Param",
    "Parameters",
    "PreparedInput",
    "RequestedOutput",
    "Tensor",
    "decode_rest_response",
    "encode_rest_request",
    "prepare_inputs",
    "raw_bytes",
    "raw_data",
    "requested_outputs",
]

Array: TypeAlias = npt.NDArray[Any]
Param: TypeAlias = bool | int | float | str
"""A parameter value: the protocol's parameters are booleans, integers, floats and strings."""
Parameters: TypeAlias = Mapping[str, Param]

HEADER_LENGTH: Final = framing.HEADER_LENGTH
"""The binary tensor data extension's header: the byte length of the JSON part of the body."""
BINARY_EXTENSION: Final = "binary_tensor_data"
"""The name under which a server lists the binary tensor data extension in its metadata."""
_JSON_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY
# Dtypes orjson writes straight from an array's memory (native byte order, C-contiguous).
_ORJSON_KINDS: Final = "biuf"


@dataclass(frozen=True, slots=True)
class Tensor:
    """An input with its data and, optionally, an explicit datatype or per-input parameters.

    `data` is a numpy array or anything `numpy.asarray` takes (nested lists of numbers, strings or bytes); the
    shape is the array's. Without `datatype` the dtype decides (see the module's notes).
    """

    name: str
    data: Any
    datatype: str | None = None
    parameters: Parameters | None = None


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output to return, with per-output parameters (`classification`, ...).

    `binary` (REST only) asks for this output as binary tensor data (True) or JSON (False); None follows the
    request's choice.
    """

    name: str
    parameters: Parameters | None = None
    binary: bool | None = None


Inputs: TypeAlias = "Mapping[str, Any] | Iterable[Tensor]"
"""`{"INPUT0": array, ...}` (values may be `Tensor`s too), or a sequence of `Tensor`s."""
Outputs: TypeAlias = "Iterable[str | RequestedOutput]"


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One request of a stream (`stream_infer`): the arguments `infer` takes for one call."""

    inputs: Inputs
    outputs: Outputs | None = None
    id: str = ""
    parameters: Parameters | None = None


class OutputMetadata(NamedTuple):
    """An output of a result, without its data: name, datatype, shape and the server's parameters for it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, Param]


@dataclass(slots=True)
class PreparedInput:
    """An input ready to encode: its array, wire datatype and shape."""

    name: str
    datatype: str
    shape: list[int]
    array: Array
    parameters: dict[str, Param] | None


# --- inputs ---------------------------------------------------------------------------------------------------

# dtype -> wire datatype, filled by `codec.datatype_of` on first sight of each dtype (a dict lookup afterwards).
_DATATYPE_OF: dict[np.dtype[Any], str] = {}
# Fixed-size datatypes whose numpy dtype is the wire form on this machine (raw bytes are the array's memory),
# BOOL aside (its bytes must be 0 or 1: the codec checks them).
_NATIVE: Final[dict[str, np.dtype[Any]]] = {
    d.name: d.dtype for d in datatypes.DATATYPES if d.size and d.dtype.isnative and d.dtype.kind != "b"
}


# Datatypes whose JSON `data` numpy reads straight into the dtype, and the Python type of the first element that
# lets it (integers for integer types, numbers for floats); BOOL, BYTES and anything else go through the codec.
_JSON_FAST: Final[dict[str, tuple[np.dtype[Any], tuple[type, ...]]]] = {
    d.name: (d.dtype, (int,) if d.dtype.kind in "iu" else (int, float))
    for d in datatypes.DATATYPES
    if d.json and d.size and d.dtype.kind in "iuf"
}


def _datatype_of(array: Array) -> str:
    dtype = array.dtype
    found = _DATATYPE_OF.get(dtype)
    if found is None:
        found = codec.datatype_of(dtype)
        if len(_DATATYPE_OF) < 256:
            _DATATYPE_OF[dtype] = found
    return found



def _as_array(data: Any, name: str) -> Array:
    if isinstance(data, np.ndarray):
        return data
    try:
        array = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"input '{name}': cannot make an array of {type(data).__name__}: {exc}") from None
    if array.dtype.kind == "S":  # numpy's fixed-width bytes drop trailing NULs: keep Python's bytes as they are
        leaves = _leaves(data)
        objects = np.empty(len(leaves), dtype=object)
        objects[:] = leaves
        array = objects.reshape(array.shape)
    return array


def _leaves(data: Any) -> list[Any]:
    """The leaves of nested lists, row-major."""
    if isinstance(data, np.ndarray):
        return list(data.reshape(-1).tolist())
    if not isinstance(data, list | tuple):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_leaves(item) if isinstance(item, list | tuple | np.ndarray) else [item])
    return out


def prepare_inputs(inputs: Inputs, datatypes_by_name: Mapping[str, str] | None = None) -> list[PreparedInput]:
    """The inputs of a request as arrays with their wire datatypes; InvalidArgument for what cannot be sent."""
    items: Iterable[tuple[str, Any]]
    if isinstance(inputs, Mapping):
        items = inputs.items()
    else:
        items = ((t.name, t) if isinstance(t, Tensor) else _not_a_tensor(t) for t in inputs)
    prepared: list[PreparedInput] = []
    for key, value in items:
        datatype: str | None = None
        parameters: dict[str, Param] | None = None
        name = key
        data = value
        if isinstance(value, Tensor):
            name, data, datatype = value.name, value.data, value.datatype
            parameters = dict(value.parameters) if value.parameters else None
        if datatype is None and datatypes_by_name:
            datatype = datatypes_by_name.get(name)
        array = _as_array(data, name)
        try:
            if datatype is None:
                datatype = _datatype_of(array)
            else:
                codec.datatype_info(datatype, name=name)
        except codec.CodecError as exc:
            raise InvalidArgument(f"input '{name}': {exc}") from None
        prepared.append(PreparedInput(name, datatype, list(array.shape), array, parameters))
    return prepared


def _not_a_tensor(value: Any) -> tuple[str, Any]:
    raise InvalidArgument(
        f"inputs must be a mapping of name to array, or a sequence of Tensor; got a {type(value).__name__} item"
    )


def requested_outputs(outputs: Outputs | None) -> list[RequestedOutput]:
    """The outputs a request lists (names or `RequestedOutput`s), in order."""
    if outputs is None:
        return []
    if isinstance(outputs, str):
        return [RequestedOutput(outputs)]
    return [o if isinstance(o, RequestedOutput) else RequestedOutput(str(o)) for o in outputs]


def raw_data(tensor: PreparedInput) -> bytes | memoryview:
    """The raw little-endian form of an input: a view of the array's memory where it already is that form."""
    array = tensor.array
    if array.dtype == _NATIVE.get(tensor.datatype) and array.flags.c_contiguous:
        return array.reshape(-1).view(np.uint8).data  # already the wire form: a view of its memory, no copy
    try:
        return codec.to_raw(tensor.array, tensor.datatype, name=tensor.name)
    except codec.CodecError as exc:
        raise InvalidArgument(str(exc)) from None


def raw_bytes(tensor: PreparedInput) -> bytes:
    """The raw little-endian form of an input, as bytes (for protobuf)."""
    array = tensor.array
    if array.dtype == _NATIVE.get(tensor.datatype):
        return array.tobytes()  # already the wire form: its memory, row-major
    data = raw_data(tensor)
    return data if isinstance(data, bytes) else data.tobytes()


# --- REST -----------------------------------------------------------------------------------------------------


def _json_data(tensor: PreparedInput) -> Array | list[Any] | None:
    """The JSON `data` of an input: the array itself where orjson writes it, a list of strings for BYTES, None
    when JSON cannot carry it (FP16, BF16, BYTES that are not UTF-8)."""
    info = datatypes.BY_NAME[tensor.datatype]
    if not info.json:
        return None
    array = tensor.array
    if info.variable:
        try:
            return codec.to_json(array, tensor.datatype, name=tensor.name)
        except codec.CodecError:
            return None
    if array.dtype != info.dtype or not array.dtype.isnative or array.dtype.kind not in _ORJSON_KINDS:
        # another dtype (a list of Python ints for INT32, say): converted and range-checked by the codec
        array = codec.from_raw(raw_data(tensor), tensor.datatype, tensor.shape, name=tensor.name)
    return np.ascontiguousarray(array).reshape(-1)


def encode_rest_request(
    inputs: Sequence[PreparedInput],
    outputs: Sequence[RequestedOutput] = (),
    *,
    request_id: str = "",
    parameters: Parameters | None = None,
    binary: bool = False,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a REST inference request.

    With `binary`, tensor data travels after the JSON header (the binary tensor data extension) and every
    output is asked for as binary data; otherwise as JSON `data`, except for tensors JSON cannot carry (FP16,
    BF16, BYTES that are not UTF-8), which go binary in any case.
    """
    chunks: list[bytes | memoryview] = []
    tensors: list[dict[str, Any]] = []
    for tensor in inputs:
        entry: dict[str, Any] = {"name": tensor.name, "shape": tensor.shape, "datatype": tensor.datatype}
        params = tensor.parameters
        data = None if binary else _json_data(tensor)
        if data is None:
            raw = raw_data(tensor)
            params = dict(params) if params else {}
            params[framing.BINARY_DATA_SIZE] = framing.size_of(raw)
            chunks.append(raw)
        else:
            entry["data"] = data
        if params:
            entry["parameters"] = params
        tensors.append(entry)
    body: dict[str, Any] = {}
    if request_id:
        body["id"] = request_id
    request_params: dict[str, Any] = dict(parameters) if parameters else {}
    wanted: list[dict[str, Any]] = []
    for output in outputs:
        out: dict[str, Any] = {"name": output.name}
        out_params: dict[str, Any] = dict(output.parameters) if output.parameters else {}
        # An output written to a shared-memory region has no data in the answer, binary or not.
        in_region = extensions.SHARED_MEMORY_REGION in out_params
        as_binary = (binary and not in_region) if output.binary is None else output.binary
        if as_binary:
            out_params[framing.BINARY_DATA] = True
        if out_params:
            out["parameters"] = out_params
        wanted.append(out)
    if binary and not wanted:
        request_params[framing.BINARY_DATA_OUTPUT] = True
    if request_params:
        body["parameters"] = request_params
    body["inputs"] = tensors
    if wanted:
        body["outputs"] = wanted
    try:
        header = orjson.dumps(body, option=_JSON_OPTIONS)
    except TypeError as exc:
        raise InvalidArgument(f"the request cannot be written as JSON: {exc}") from None
    return framing.join(header, chunks)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ResponseError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def decode_rest_response(content: bytes, header_length: str | None) -> InferResult:
    """The result of a REST inference answer: JSON, or a JSON header of `header_length` bytes followed by the
    binary data of the outputs that have `binary_data_size`."""
    try:
        head, rest = framing.split(content, header_length)
    except framing.FramingError as exc:
        raise ResponseError(str(exc)) from None
    binary = framing.BinaryData(rest)
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise ResponseError(f"the inference response is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ResponseError(f"the inference response must be a JSON object, got {type(doc).__name__}")
    entries: list[Entry] = []
    outputs = doc.get("outputs") or ()
    if not isinstance(outputs, list):
        raise ResponseError(f"'outputs' must be a JSON array, got {type(outputs).__name__}")
    for out in outputs:
        if not isinstance(out, dict):
            raise ResponseError(f"an output must be a JSON object, got {type(out).__name__}")
        name, datatype, shape, params = out.get("name"), out.get("datatype"), out.get("shape"), out.get("parameters")
        if type(name) is not str or type(datatype) is not str or type(shape) is not list:
            raise ResponseError(f"an output needs a name, a datatype and a shape: {dict(out, data=...)!r}"[:500])
        size = None
        if params:
            if not isinstance(params, dict):
                raise ResponseError(f"output '{name}': parameters must be a JSON object")
            if framing.BINARY_DATA_SIZE in params:
                params = dict(params)
                size = params.pop(framing.BINARY_DATA_SIZE)
        if size == 0 and type(size) is int:  # an empty binary output (a body of nothing but JSON may have those)
            entries.append((name, datatype, tuple(shape), params or {}, RAW, b""))
        elif size is not None:
            try:
                data = binary.take(size, f"output '{name}'")
            except framing.FramingError as exc:
                raise ResponseError(str(exc)) from None
            entries.append((name, datatype, tuple(shape), params or {}, RAW, data))
        else:
            entries.append((name, datatype, tuple(shape), params or {}, JSON, out.get("data")))
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ResponseError("the response parameters must be a JSON object")
    return InferResult(
        model_name=str(doc.get("model_name") or ""),
        model_version=str(doc.get("model_version") or ""),
        id=str(doc.get("id") or ""),
        parameters=params,
        entries=entries,
    )


# --- results --------------------------------------------------------------------------------------------------

RAW: Final = 0
"""Output source: raw little-endian bytes (REST binary data, gRPC raw_output_contents)."""
JSON: Final = 1
"""Output source: JSON `data`."""
CONTENTS: Final = 2
"""Output source: a gRPC InferTensorContents message."""
NONE: Final = 3
"""Output source: no data at all (valid for an empty tensor only)."""


Entry: TypeAlias = "tuple[str, str, tuple[int, ...], Mapping[str, Param], int, Any]"
"""One output of a result as the decoders hand it over: name, datatype, shape, parameters, and where its data
is: (RAW, bytes), (JSON, data), (CONTENTS, an InferTensorContents message) or (NONE, None)."""


class InferResult:
    """The answer to an inference: the model that ran, the request id, parameters and the outputs.

    `as_numpy(name)` (or `result[name]`) decodes an output on first use; fixed-size outputs are read-only views
    of the response's bytes where the transport allows it, BYTES outputs object arrays of `bytes`. The same
    request gives the same result over REST (JSON or binary) and gRPC (raw or typed contents). `outputs` lists
    the outputs' metadata (`OutputMetadata`) in answer order. `error` is empty, except for a stream's answer to a
    request that failed when the stream was asked not to raise.
    """

    __slots__ = (
        "_arrays", "_entries", "_index", "_outputs", "error", "id", "model_name", "model_version", "parameters"
    )

    def __init__(
        self, *, model_name: str, model_version: str, id: str, parameters: dict[str, Param], entries: list[Entry]
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = parameters
        self._entries = entries
        self._arrays: list[Array | None] = [None] * len(entries)
        self._outputs: tuple[OutputMetadata, ...] | None = None
        self._index: dict[str, int] | None = None
        self.error = ""  # a stream's answer to a request that failed (stream_infer(..., raise_errors=False))

    def __repr__(self) -> str:
        outputs = ", ".join(f"{m.name}: {m.datatype}{list(m.shape)}" for m in self.outputs)
        head = f"model={self.model_name!r}, version={self.model_version!r}, id={self.id!r}"
        return f"InferResult({head}, outputs=[{outputs}])"

    @property
    def outputs(self) -> tuple[OutputMetadata, ...]:
        """Every output's metadata (name, datatype, shape, parameters), in answer order."""
        if self._outputs is None:
            self._outputs = tuple(OutputMetadata(e[0], e[1], e[2], e[3]) for e in self._entries)
        return self._outputs

    @property
    def names(self) -> list[str]:
        """The outputs' names, in answer order."""
        return [entry[0] for entry in self._entries]

    def output(self, name: str) -> OutputMetadata:
        """The metadata of output `name` (KeyError when the answer has no such output)."""
        return self.outputs[self._position(name)]

    def _position(self, name: str) -> int:
        index = self._index
        if index is None:
            entries = self._entries
            if len(entries) <= 8:  # a scan beats building a dict for the usual handful of outputs
                for i, entry in enumerate(entries):
                    if entry[0] == name:
                        return i
                index = {}
            else:
                index = self._index = {entry[0]: i for i, entry in enumerate(entries)}
        try:
            return index[name]
        except KeyError:
            names = ", ".join(self.names) or "none"
            raise KeyError(f"no output {name!r} in the result; outputs: {names}") from None

    def as_numpy(self, name: str) -> Array:
        """Output `name` as a numpy array of its shape (KeyError when the answer has no such output)."""
        i = self._position(name)
        array = self._arrays[i]
        if array is None:
            array = self._arrays[i] = self._decode(self._entries[i])
        return array

    __getitem__ = as_numpy

    def __contains__(self, name: object) -> bool:
        return any(entry[0] == name for entry in self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self._entries)

    def as_dict(self) -> dict[str, Array]:
        """Every output, decoded: name -> array."""
        return {entry[0]: self.as_numpy(entry[0]) for entry in self._entries}

    @staticmethod
    def _decode(entry: Entry) -> Array:
        name, datatype, shape, _, kind, payload = entry
        try:
            if kind == RAW:
                dtype = _NATIVE.get(datatype)
                if dtype is not None and min(shape, default=0) >= 0:
                    try:  # the common case in one step: a view of the bytes; the codec explains any mismatch
                        return np.frombuffer(payload, dtype=dtype).reshape(shape)
                    except ValueError:
                        pass
                return codec.from_raw(payload, datatype, shape, name=name)
            if kind == JSON and payload is not None:
                first = type(payload[0]) if type(payload) is list and payload else None
                fast = _JSON_FAST.get(datatype)
                if fast is not None and first in fast[1] and min(shape, default=0) >= 0:
                    try:  # a flat list of numbers, as servers write them: numpy reads it in one step
                        return np.array(payload, dtype=fast[0]).reshape(shape)
                    except (ValueError, TypeError, OverflowError):
                        pass  # nested, ragged, out of range or not numbers: the codec checks and explains
                return codec.from_json(payload, datatype, shape, name=name)
            if kind == CONTENTS:
                return codec.from_contents_message(payload, datatype, shape, name=name)
            if (kind == NONE or payload is None) and codec.element_count(shape, name=name) == 0:
                return np.empty(shape, dtype=codec.dtype_of(datatype))
        except codec.CodecError as exc:
            raise ResponseError(f"the server sent output data that does not decode: {exc}") from None
        raise ResponseError(f"output '{name}' has no data")
