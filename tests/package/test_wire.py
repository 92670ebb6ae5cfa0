"""The wire layer the clients and the server share: REST binary framing (`framing`), raw protobuf fields and the
REST form of messages (`grpc.wire`), and the codec as the one place arrays become datatypes.

Each is checked against an independent answer (protobuf's own serialization, hand-written bytes) and through both
sides, so that a client and a server built from the same package read each other's framing the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oip import codec, framing
from oip.client import errors, tensors
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import wire
from oip.server import Settings
from oip.server import rest as server_rest
from oip.server.core.validation import check_output
from oip.server.errors import InvalidRequest

SETTINGS = Settings()


# --- REST binary framing ----------------------------------------------------------------------------------------


def test_split_take_and_join_round_trip() -> None:
    body, headers = framing.join(b'{"x":1}', [b"abc", memoryview(b"de")])
    assert body == b'{"x":1}abcde'
    assert headers == {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": "7"}
    head, rest = framing.split(body, headers[framing.HEADER_LENGTH])
    assert bytes(head) == b'{"x":1}' and rest is not None
    data = framing.BinaryData(rest)
    assert bytes(data.take(3, "a")) == b"abc"
    with pytest.raises(framing.FramingError, match="unexpected additional binary data: 2 bytes"):
        data.finish()
    assert bytes(data.take(2, "b")) == b"de"
    data.finish()
    assert framing.join(b"{}", []) == (b"{}", {"Content-Type": "application/json"})
    assert framing.split(b"{}", None) == (b"{}", None)


@pytest.mark.parametrize(
    ("header_length", "message"),
    [
        ("x", "Inference-Header-Content-Length must be an integer, got 'x'"),
        ("99", "Inference-Header-Content-Length 99 is out of range for a body of 12 bytes"),
        ("-1", "Inference-Header-Content-Length -1 is out of range"),
    ],
)
def test_bad_header_lengths_read_the_same_on_both_sides(header_length: str, message: str) -> None:
    body = b'{"inputs":[]'  # 12 bytes
    with pytest.raises(InvalidRequest) as server_side:
        server_rest.decode_infer_request(body, header_length, SETTINGS)
    with pytest.raises(errors.ResponseError) as client_side:
        tensors.decode_rest_response(body, header_length)
    assert message in server_side.value.message
    assert message in str(client_side.value)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (8, "unexpected size for {where}: expecting 8 more bytes of binary data, 4 remain"),
        (-1, "{where}: 'binary_data_size' must be a non-negative integer, got -1"),
        ("4", "{where}: 'binary_data_size' must be a non-negative integer, got '4'"),
    ],
)
def test_bad_binary_sizes_read_the_same_on_both_sides(size: Any, message: str) -> None:
    request = (b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":%b}}]}'
               % str(size).encode() if not isinstance(size, str) else
               b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":"4"}}]}')
    response = request.replace(b'"inputs"', b'"outputs"')
    with pytest.raises(InvalidRequest) as server_side:
        server_rest.decode_infer_request(request + bytes(4), str(len(request)), SETTINGS)
    with pytest.raises(errors.ResponseError) as client_side:
        tensors.decode_rest_response(response + bytes(4), str(len(response)))
    assert server_side.value.message == message.format(where="input 'X'")
    assert str(client_side.value) == message.format(where="output 'X'")


def test_client_request_framing_is_what_the_server_reads() -> None:
    inputs = tensors.prepare_inputs({"A": np.arange(3, dtype=np.int16), "B": np.array([b"x", b""], dtype=object)})
    body, headers = tensors.encode_rest_request(inputs, binary=True)
    request, listed, default_binary = server_rest.decode_infer_request(
        body, headers[framing.HEADER_LENGTH], SETTINGS
    )
    assert [t.data.tolist() for t in request.inputs if t.data is not None] == [[0, 1, 2], [b"x", b""]]
    assert listed == {} and default_binary is True


# --- raw protobuf fields ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, 2**64 - 1])
def test_varints_are_protobufs(value: int) -> None:
    encoded = wire.varint(value)
    # A uint64 field (InferParameter.uint64_param, field 5) holds the varint after its tag.
    reference = pb.InferParameter(uint64_param=value).SerializeToString()
    assert reference == bytes([5 << 3]) + encoded
    assert wire.read_varint(encoded + b"\x00", 0) == (value, len(encoded))


def test_varint_errors() -> None:
    with pytest.raises(ValueError, match="varint too long"):
        wire.read_varint(b"\xff" * 11, 0)
    with pytest.raises(IndexError):
        wire.read_varint(b"\x80", 0)


def test_raw_entries_written_and_split_as_protobuf_does() -> None:
    entries = [b"\x01\x02", b"", bytes(range(200))]
    message = pb.ModelInferRequest(model_name="m", id="i")
    message.inputs.add(name="X", datatype="UINT8", shape=[2])
    number = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
    written = b"".join([message.SerializeToString(), *wire.field_entries(number, entries)])
    reference = pb.ModelInferRequest()
    reference.CopyFrom(message)
    reference.raw_input_contents.extend(entries)
    assert written == reference.SerializeToString()
    rest, found = wire.split_field(written, number)
    assert pb.ModelInferRequest.FromString(rest) == message
    assert [bytes(entry) for entry in found] == entries
    assert all(isinstance(entry, memoryview) for entry in found)
    with pytest.raises(ValueError, match="truncated"):
        wire.split_field(written[:-1], number)
    with pytest.raises(ValueError, match="unexpected wire type 3"):
        wire.split_field(bytes([1 << 3 | 3]), number)


def test_with_defaults_completes_every_field_without_presence() -> None:
    message = pb.ModelStatistics(name="m", inference_stats=pb.InferStatistics(success=pb.StatisticDuration(count=2)))
    out: dict[str, Any] = {"name": "m", "inference_stats": {"success": {"count": 2}}}
    wire.with_defaults(out, message)
    assert out["version"] == "" and out["last_inference"] == 0 and out["batch_stats"] == []
    assert out["inference_stats"]["success"] == {"count": 2, "ns": 0}
    assert "fail" not in out["inference_stats"]  # a message field that is absent stays absent


# --- arrays to datatypes: one rule for the clients and the server ----------------------------------------------


@pytest.mark.parametrize(
    ("array", "datatype", "expected"),
    [
        (np.array([1, 2], np.int64), "INT8", [1, 2]),
        (np.array([1.0, -3.0]), "INT32", [1, -3]),
        (np.array([True, False]), "FP32", [1.0, 0.0]),
        (np.array([0, 1]), "BOOL", [False, True]),
        (np.array(["a", "é"]), "BYTES", [b"a", "é".encode()]),
        (np.array([1.5], ">f8"), "FP64", [1.5]),
    ],
)
def test_one_conversion_rule(array: Any, datatype: str, expected: list[Any]) -> None:
    from oip.server.model import Model, TensorSpec

    converted = codec.as_datatype(array, datatype)
    assert converted.dtype == codec.dtype_of(datatype) and converted.tolist() == expected
    # The client encodes with it ...
    assert codec.from_raw(codec.to_raw(array, datatype), datatype, [len(expected)]).tolist() == expected

    # ... and the server converts what a model returns with it.
    class Returns(Model):
        name = "returns"
        inputs = ()
        outputs = (TensorSpec("OUT", datatype, [len(expected)]),)

    tensor = check_output(Returns(), Returns.outputs[0], {"OUT": array})
    assert tensor.data is not None and tensor.data.tolist() == expected


@pytest.mark.parametrize(
    ("array", "datatype", "message"),
    [
        (np.array([300]), "INT8", r"INT8 element 0 is out of range \[-128, 127\]: 300"),
        (np.array([0.5]), "INT32", r"INT32 element 0 is not a whole number: 0\.5"),
        (np.array([2]), "BOOL", "values other than 0 and 1 cannot be BOOL"),
        (np.array([1]), "BYTES", "a int64 array cannot be BYTES"),
        (np.array([1e300]), "FP32", "values out of range for FP32"),
    ],
)
def test_one_refusal_rule(array: Any, datatype: str, message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.as_datatype(array, datatype)
    with pytest.raises(codec.CodecError, match=message):
        codec.to_raw(array, datatype)
