"""The gRPC answer written as bytes (`InferCodec.serialize_response`) against the same answer built field by field
with protobuf: the same bytes where protobuf's are unique (a map of one entry), the same message always."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.server import ModelFailure
from oip.server.grpc import INFER, infer_codec
from oip.server.grpc.infer_codec import InferCodec
from oip.server.types import InferResponse, Tensor

_KINDS = {bool: "bool_param", int: "int64_param", str: "string_param", float: "double_param"}


def fresh() -> InferCodec[Any]:
    """A codec of the service's messages with nothing kept yet."""
    return InferCodec(INFER.request, INFER.response, INFER.param_type, INFER.raw_input_field, INFER.raw_output_field)


def fill(target: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        setattr(target[key], _KINDS[type(value)], value)


def raw(tensor: Tensor) -> bytes:
    if tensor.data is None:
        return b""
    if tensor.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in tensor.data.reshape(-1).tolist())
    little = {"INT32": "<i4", "FP32": "<f4", "INT64": "<i8", "UINT8": "u1"}[tensor.datatype]
    return np.ascontiguousarray(tensor.data, dtype=little).tobytes()


def reference(response: InferResponse) -> bytes:
    """The answer as protobuf writes it, built field by field."""
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                    id=response.id)
    fill(message.parameters, response.parameters)
    for tensor in response.outputs:
        out = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        fill(out.parameters, tensor.parameters)
        message.raw_output_contents.append(raw(tensor))
    return bytes(message.SerializeToString())


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


ANSWERS = {
    "a decoupled model's response": InferResponse(
        "decoupled", "1", parameters={"triton_final_response": False}, outputs=[Tensor("OUT", "INT32", [1], ints(7))]
    ),
    "the empty final response": InferResponse("decoupled", "1", id="r-9", parameters={"triton_final_response": True}),
    "an id and two outputs": InferResponse("two", "", id="req-1", outputs=[
        Tensor("SUM", "FP32", [2, 2], np.arange(4, dtype=np.float32)),
        Tensor("TEXT", "BYTES", [2], np.array([b"ab", b""], dtype=object)),
    ]),
    "an output with no data": InferResponse(
        "m", "3", outputs=[Tensor("EMPTY", "INT32", [0]), Tensor("X", "INT32", [1], ints(1))]
    ),
    "an output with parameters": InferResponse("m", "3", outputs=[
        Tensor("OUT", "INT64", [1], np.array([5], np.int64), parameters={"note": "kept", "count": 2})
    ]),
    "a large output": InferResponse(
        "big", "1", outputs=[Tensor("OUT", "FP32", [1 << 15], np.ones(1 << 15, np.float32))]
    ),
    "a map of a flag and a number": InferResponse("m", "1", parameters={"x": True, "y": 1}),
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_an_answer_is_the_bytes_protobuf_writes(name: str) -> None:
    response = ANSWERS[name]
    codec = fresh()
    written = codec.serialize_response(response)
    expected = reference(response)
    assert pb.ModelInferResponse.FromString(written) == pb.ModelInferResponse.FromString(expected)
    if len(response.parameters) <= 1 and all(len(t.parameters) <= 1 for t in response.outputs):
        assert written == expected
    assert codec.serialize_response(response) == written  # again, from the pieces kept
    assert codec.encode_response(response) == pb.ModelInferResponse.FromString(expected)


def test_kept_pieces_follow_what_they_are_made_of() -> None:
    """A flag and the number 1, an output's name and shape under another datatype, another version of a model:
    each answer gets its own pieces, never one kept for an answer that only looks alike."""
    codec = fresh()
    answers = [
        InferResponse("m", "1", parameters={"x": True}, outputs=[Tensor("OUT", "INT32", [1], ints(1))]),
        InferResponse("m", "1", parameters={"x": 1}, outputs=[Tensor("OUT", "FP32", [1], np.ones(1, np.float32))]),
        InferResponse("m", "2", parameters={"x": False}, outputs=[Tensor("OUT", "INT32", [1], ints(1))]),
        InferResponse("m", "1", parameters={"x": True}, outputs=[Tensor("OUT", "INT32", [1], ints(1))]),
    ]
    for response in answers:
        assert codec.serialize_response(response) == reference(response)


def test_pieces_kept_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(infer_codec, "_MAX_PIECES", 2)
    codec = fresh()
    for n in range(6):
        response = InferResponse(f"m{n}", "1", parameters={f"flag{n}": True},
                                 outputs=[Tensor("OUT", "INT32", [n], ints(*range(n)))])
        assert codec.serialize_response(response) == reference(response)
    assert max(len(codec._heads), len(codec._headers), len(codec._flags)) <= 2


def test_an_answer_that_cannot_be_written_is_the_models_failure() -> None:
    codec = fresh()
    text = InferResponse("m", "1", outputs=[Tensor("OUT", "BYTES", [1], np.array([3.5], dtype=object))])
    with pytest.raises(ModelFailure, match="OUT"):
        codec.serialize_response(text)
    listed = InferResponse("m", "1", parameters={"x": [1, 2]})
    with pytest.raises(ModelFailure, match="response"):
        codec.serialize_response(listed)
    tagged = InferResponse("m", "1", outputs=[Tensor("OUT", "INT32", [1], ints(1), parameters={"x": object()})])
    with pytest.raises(ModelFailure, match="output 'OUT'"):
        codec.serialize_response(tagged)
