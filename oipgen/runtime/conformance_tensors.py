"""Inference requests derived from a model's metadata, in the three forms the protocol has (REST JSON, REST with
binary tensor data, gRPC with raw contents), and their answers decoded back to numpy arrays with this package's
codecs, for the protocol layer of the conformance suite (`conformance_protocol`).

A valid request gives each declared input its declared datatype and shape (a variable dimension, -1, is 2) and
small values every datatype holds exactly. `Request` can then be broken in one place (a wrong datatype, a wrong
shape, a missing or unknown input, an unknown output) to check that the server refuses it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from google.protobuf.message import Message

from . import codec, datatypes, framing
from .conformance_results import Answer

__all__ = ["Decoded", "Request", "TensorMeta", "decode_grpc", "decode_rest", "fits", "sample", "valid_request"]

VARIABLE_DIM = 2  # what a -1 of the metadata becomes in a request


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as model metadata declares it."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    array: npt.NDArray[Any]

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)


def sample(datatype: str, shape: Sequence[int]) -> npt.NDArray[Any]:
    """Small values of `datatype` in `shape` that every datatype holds exactly, and words for BYTES."""
    count = math.prod(shape)
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = [f"w{i}".encode() for i in range(count)]
        return array.reshape(shape)
    index = np.arange(count)
    if datatype == "BOOL":
        values: npt.NDArray[Any] = index % 2 == 0
    elif datatypes.BY_NAME[datatype].dtype.kind in "iu":
        values = index % 5 + 1
    else:
        values = (index % 5) * 0.5 + 0.25
    return np.asarray(values.reshape(shape)).astype(codec.dtype_of(datatype))


def fits(shape: Sequence[int], declared: Sequence[int]) -> bool:
    """Whether a tensor's shape matches a declared one (-1 matches any size)."""
    return len(shape) == len(declared) and all(d in (-1, s) for s, d in zip(shape, declared, strict=True))


@dataclass(frozen=True)
class Request:
    """An inference request: inputs, requested outputs (empty: all), id and parameters."""

    model: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...] = ()
    id: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    output_parameters: Mapping[str, Any] = field(default_factory=dict)  # for every requested output

    def but(self, **changes: Any) -> Request:
        return replace(self, **changes)

    def retyped(self, datatype: str) -> Request:
        """The first input with another datatype (values of that datatype, same shape)."""
        first = self.inputs[0]
        return self.but(inputs=(Tensor(first.name, datatype, sample(datatype, first.shape)), *self.inputs[1:]))

    def reshaped(self) -> Request:
        """The first input with one more dimension (of size 1): the same elements in a shape of another rank."""
        first = self.inputs[0]
        array = first.array.reshape((1, *first.array.shape))
        return self.but(inputs=(Tensor(first.name, first.datatype, array), *self.inputs[1:]))

    def with_unknown_input(self, name: str) -> Request:
        return self.but(inputs=(*self.inputs, Tensor(name, "INT32", sample("INT32", [1]))))

    def json_only(self) -> bool:
        """Whether every input travels as JSON `data` (FP16 and BF16 do not)."""
        return all(datatypes.BY_NAME[t.datatype].json for t in self.inputs)

    # --- REST ---------------------------------------------------------------------------------------------

    def rest_body(self, binary: bool, binary_outputs: Sequence[str] = ()) -> tuple[bytes, dict[str, str]]:
        """The REST body and its headers: inputs as JSON `data`, or as binary tensor data when `binary` (or when
        their datatype has no JSON form); the outputs named in `binary_outputs` asked for as binary data."""
        inputs: list[dict[str, Any]] = []
        chunks: list[bytes] = []
        for tensor in self.inputs:
            entry: dict[str, Any] = {"name": tensor.name, "shape": tensor.shape, "datatype": tensor.datatype}
            if binary or not datatypes.BY_NAME[tensor.datatype].json:
                raw = bytes(codec.to_raw(tensor.array, tensor.datatype))
                entry["parameters"] = {framing.BINARY_DATA_SIZE: len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = codec.to_json(tensor.array, tensor.datatype)
            inputs.append(entry)
        body: dict[str, Any] = {"inputs": inputs}
        if self.id is not None:
            body["id"] = self.id
        parameters = dict(self.parameters)
        outputs = []
        for name in self.outputs:
            wanted = dict(self.output_parameters)
            if name in binary_outputs:
                wanted[framing.BINARY_DATA] = True
            outputs.append({"name": name, "parameters": wanted} if wanted else {"name": name})
        if outputs:
            body["outputs"] = outputs
        elif binary_outputs:
            parameters[framing.BINARY_DATA_OUTPUT] = True
        if parameters:
            body["parameters"] = parameters
        return framing.join(json.dumps(body).encode(), chunks)

    # --- gRPC ---------------------------------------------------------------------------------------------

    def grpc_message(self, message_type: type[Message], version: str = "") -> Message:
        """The ModelInferRequest: every input as raw contents."""
        data: dict[str, Any] = {
            "model_name": self.model,
            "model_version": version,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in self.inputs],
            "outputs": [
                {"name": name, "parameters": {k: _parameter(v) for k, v in self.output_parameters.items()}}
                for name in self.outputs
            ],
            "parameters": {k: _parameter(v) for k, v in self.parameters.items()},
        }
        if self.id is not None:
            data["id"] = self.id
        message: Any = json_format.ParseDict(data, message_type())
        raw = message.raw_input_contents
        for tensor in self.inputs:
            raw.append(bytes(codec.to_raw(tensor.array, tensor.datatype)))
        return cast(Message, message)


def _parameter(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool_param": value}
    if isinstance(value, int):
        return {"int64_param": str(value)}
    if isinstance(value, float):
        return {"double_param": value}
    return {"string_param": str(value)}


def valid_request(model: str, inputs: Sequence[TensorMeta]) -> Request:
    """A request every model that declares `inputs` must accept."""
    tensors = []
    for meta in inputs:
        shape = [VARIABLE_DIM if d == -1 else d for d in meta.shape]
        tensors.append(Tensor(meta.name, meta.datatype, sample(meta.datatype, shape)))
    return Request(model, tuple(tensors))


# ---------------------------------------------------------------------------------------------------------------
# Answers


@dataclass
class Decoded:
    """An inference answer: model name and version, id (None: absent), and the outputs in answer order, each
    (name, datatype, shape, array). `problems` lists what could not be decoded."""

    model_name: str = ""
    model_version: str = ""
    id: str | None = None
    outputs: list[tuple[str, str, list[int], npt.NDArray[Any] | None]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        return {name: array for name, _, _, array in self.outputs if array is not None}


def _decode(decoded: Decoded, name: str, datatype: str, shape: Any, decode: Any) -> None:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        decoded.problems.append(f"output '{name}': shape {shape!r} is not a list of integers")
        decoded.outputs.append((name, datatype, [], None))
        return
    try:
        array = decode()
    except ValueError as exc:  # CodecError and FramingError are ValueErrors
        decoded.problems.append(f"output '{name}': {exc}")
        array = None
    decoded.outputs.append((name, datatype, shape, array))


def decode_rest(answer: Answer) -> Decoded:
    """The outputs of a REST inference answer, JSON `data` or binary tensor data alike."""
    decoded = Decoded()
    try:
        header, binary = framing.split(answer.body, answer.headers.get(framing.HEADER_LENGTH))
        body = json.loads(bytes(header))
    except ValueError as exc:
        decoded.problems.append(f"the body is not an inference response: {exc}")
        return decoded
    if not isinstance(body, dict) or not isinstance(body.get("outputs"), list):
        decoded.problems.append(f"the body has no `outputs` array: {answer.text(120)}")
        return decoded
    decoded.model_name = body.get("model_name", "")
    decoded.model_version = body.get("model_version", "")
    decoded.id = body.get("id")
    data = framing.BinaryData(binary)
    for output in body["outputs"]:
        if not isinstance(output, dict):
            decoded.problems.append(f"an output is not an object: {output!r}")
            continue
        name, datatype, shape = output.get("name", ""), output.get("datatype", ""), output.get("shape")
        size = (output.get("parameters") or {}).get(framing.BINARY_DATA_SIZE)

        def decode(output: Any = output, datatype: Any = datatype, shape: Any = shape, size: Any = size) -> Any:
            if size is not None:
                return codec.from_raw(data.take(size, f"output '{output.get('name')}'"), datatype, shape)
            if "data" not in output:
                raise ValueError("no `data` and no binary_data_size")
            return codec.from_json(output["data"], datatype, shape)

        _decode(decoded, name, datatype, shape, decode)
    try:
        data.finish()
    except ValueError as exc:
        decoded.problems.append(str(exc))
    return decoded


def decode_grpc(message: Message) -> Decoded:
    """The outputs of a ModelInferResponse: raw contents (entry i for the i-th output without typed contents) or
    typed contents."""
    response: Any = message
    decoded = Decoded(response.model_name, response.model_version, response.id or None)
    raw = list(response.raw_output_contents)
    for output in response.outputs:
        shape = [int(d) for d in output.shape]
        has_contents = output.HasField("contents") and any(
            len(getattr(output.contents, f)) for f in datatypes.CONTENTS_FIELDS
        )

        def decode(output: Any = output, shape: list[int] = shape, typed: bool = has_contents) -> Any:
            if typed:
                return codec.from_contents_message(output.contents, output.datatype, shape)
            if not raw:
                if math.prod(shape) == 0:
                    return codec.from_raw(b"", output.datatype, shape)
                raise ValueError("no contents and no raw_output_contents entry")
            return codec.from_raw(raw.pop(0), output.datatype, shape)

        _decode(decoded, output.name, output.datatype, shape, decode)
    return decoded
