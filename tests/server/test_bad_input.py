"""Bad input, over both transports: every case of spec-digest §13 (and its neighbours) that applies to this
server gets its documented status with an `{"error": "..."}` body (REST) or its status code (gRPC), and the
server stays up: after each one it is live and answers a correct inference over REST and gRPC."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from google.protobuf import json_format
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import (
    SIMPLE_A,
    SIMPLE_B,
    TIMEOUT,
    Server,
    assert_error_body,
    build_repository,
    check_simple,
    grpc_call,
    running,
)

LIMIT = 1 << 20  # the server's --max-request-bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("bad_input")
    with running(build_repository(root / "models", ("failing",)), root, "--max-request-bytes", str(LIMIT)) as server:
        yield server


# --- REST ---------------------------------------------------------------------------------------------------------


def tensor(name: Any = "INPUT0", shape: Any = (1, 16), datatype: Any = "INT32", data: Any = SIMPLE_A,
           **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "shape": list(shape) if isinstance(shape, tuple) else shape,
                           "datatype": datatype}
    if data is not None:
        out["data"] = data
    out.update(extra)
    return out


def simple(*inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A `simple` request: the given inputs, or the two correct ones."""
    body = {"inputs": list(inputs) or [tensor(), tensor("INPUT1", data=SIMPLE_B)]}
    body.update(extra)
    return body


INPUT1 = tensor("INPUT1", data=SIMPLE_B)


def binary(header: dict[str, Any], data: bytes, length: int | str | None = None) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + data, {"Inference-Header-Content-Length": str(len(text) if length is None else length)}


I32 = np.arange(16, dtype="<i4").tobytes()
BIN0 = tensor(data=None, parameters={"binary_data_size": 64})

# (id, method, path, body: JSON value | (bytes, headers) | None, status)
REST: list[tuple[str, str, str, Any, int]] = [
    # the body itself
    ("malformed_json", "POST", "/v2/models/simple/infer", (b'{"inputs": [', {}), 400),
    ("empty_body", "POST", "/v2/models/simple/infer", (b"", {}), 400),
    ("whitespace_body", "POST", "/v2/models/simple/infer", (b"  \n", {}), 400),
    ("body_array", "POST", "/v2/models/simple/infer", [simple()], 400),
    ("body_string", "POST", "/v2/models/simple/infer", "inputs", 400),
    ("invalid_utf8", "POST", "/v2/models/simple/infer", (b'{"id": "\xff\xfe", "inputs": []}', {}), 400),
    ("trailing_garbage", "POST", "/v2/models/simple/infer", (json.dumps(simple()).encode() + b"}", {}), 400),
    ("response_as_request", "POST", "/v2/models/simple/infer",
     {"id": "42", "outputs": [{"name": "OUTPUT0", "shape": [1, 16], "datatype": "INT32", "data": SIMPLE_A}]}, 400),
    ("inputs_not_array", "POST", "/v2/models/simple/infer", {"inputs": {"INPUT0": SIMPLE_A}}, 400),
    ("input_not_object", "POST", "/v2/models/simple/infer", {"inputs": [1, 2]}, 400),
    ("too_large", "POST", "/v2/models/simple/infer", (b" " * (LIMIT + 1), {}), 413),
    # envelope fields (§13 #5, #11)
    ("id_number", "POST", "/v2/models/simple/infer", simple(id=42), 400),
    ("id_object", "POST", "/v2/models/simple/infer", simple(id={"a": 1}), 400),
    ("parameters_not_object", "POST", "/v2/models/simple/infer", simple(parameters=[1]), 400),
    ("parameter_object", "POST", "/v2/models/simple/infer", simple(parameters={"p": {"a": 1}}), 400),
    ("parameter_array", "POST", "/v2/models/simple/infer", simple(parameters={"p": [1]}), 400),
    ("parameter_null", "POST", "/v2/models/simple/infer", simple(parameters={"p": None}), 400),
    # JSON null is no value of any field (unknown keys are ignored, whatever their value)
    ("id_null", "POST", "/v2/models/simple/infer", simple(id=None), 400),
    ("parameters_null", "POST", "/v2/models/simple/infer", simple(parameters=None), 400),
    ("outputs_null", "POST", "/v2/models/simple/infer", simple(outputs=None), 400),
    ("input_parameters_null", "POST", "/v2/models/simple/infer", simple(tensor(parameters=None), INPUT1), 400),
    ("input_data_null", "POST", "/v2/models/simple/infer",
     binary(simple(tensor(data=None, parameters={"binary_data_size": 64}) | {"data": None}, INPUT1), I32 * 4), 400),
    ("output_parameters_null", "POST", "/v2/models/simple/infer",
     simple(outputs=[{"name": "OUTPUT0", "parameters": None}]), 400),
    ("input_parameters_not_object", "POST", "/v2/models/simple/infer",
     simple(tensor(parameters="x"), INPUT1), 400),
    ("output_parameter_object", "POST", "/v2/models/simple/infer",
     simple(outputs=[{"name": "OUTPUT0", "parameters": {"p": {}}}]), 400),
    ("outputs_not_array", "POST", "/v2/models/simple/infer", simple(outputs={"name": "OUTPUT0"}), 400),
    ("output_not_object", "POST", "/v2/models/simple/infer", simple(outputs=["OUTPUT0"]), 400),
    ("output_without_name", "POST", "/v2/models/simple/infer", simple(outputs=[{"parameters": {}}]), 400),
    # tensors (§13 #17-#19, #22, #24-#33)
    ("missing_name", "POST", "/v2/models/simple/infer", simple({"shape": [1, 16], "datatype": "INT32",
                                                              "data": SIMPLE_A}, INPUT1), 400),
    ("name_number", "POST", "/v2/models/simple/infer", simple(tensor(name=0), INPUT1), 400),
    ("missing_datatype", "POST", "/v2/models/simple/infer",
     simple({"name": "INPUT0", "shape": [1, 16], "data": SIMPLE_A}, INPUT1), 400),
    ("missing_shape", "POST", "/v2/models/simple/infer",
     simple({"name": "INPUT0", "datatype": "INT32", "data": SIMPLE_A}, INPUT1), 400),
    ("shape_not_array", "POST", "/v2/models/simple/infer", simple(tensor(shape=16), INPUT1), 400),
    ("shape_strings", "POST", "/v2/models/simple/infer", simple(tensor(shape=["1", "16"]), INPUT1), 400),
    ("shape_booleans", "POST", "/v2/models/simple/infer", simple(tensor(shape=[True, 16]), INPUT1), 400),
    ("shape_float", "POST", "/v2/models/simple/infer", simple(tensor(shape=[1.0, 16]), INPUT1), 400),
    ("negative_dim", "POST", "/v2/models/simple/infer", simple(tensor(shape=[-1, 16]), INPUT1), 400),
    ("huge_shape", "POST", "/v2/models/simple/infer", simple(tensor(shape=[10**12, 16], data=None), INPUT1), 413),
    ("dim_beyond_int64", "POST", "/v2/models/simple/infer", simple(tensor(shape=[2**63, 1]), INPUT1), 400),
    ("unknown_datatype", "POST", "/v2/models/simple/infer", simple(tensor(datatype="INT322"), INPUT1), 400),
    ("datatype_number", "POST", "/v2/models/simple/infer", simple(tensor(datatype=8), INPUT1), 400),
    ("datatype_mismatch", "POST", "/v2/models/simple/infer", simple(tensor(datatype="INT64"), INPUT1), 400),
    ("data_too_short", "POST", "/v2/models/simple/infer", simple(tensor(data=SIMPLE_A[:-1]), INPUT1), 400),
    ("data_too_long", "POST", "/v2/models/simple/infer", simple(tensor(data=[*SIMPLE_A, 16]), INPUT1), 400),
    ("ragged_wrong_count", "POST", "/v2/models/simple/infer",
     simple(tensor(data=[SIMPLE_A[:8], SIMPLE_A[8:15]]), INPUT1), 400),
    ("data_scalar", "POST", "/v2/models/simple/infer", simple(tensor(data=5), INPUT1), 400),
    ("data_object", "POST", "/v2/models/simple/infer", simple(tensor(data={"a": 1}), INPUT1), 400),
    ("float_in_int32", "POST", "/v2/models/simple/infer", simple(tensor(data=[0.5] * 16), INPUT1), 400),
    ("fraction_among_whole_numbers", "POST", "/v2/models/simple/infer",
     simple(tensor(data=[1.0] * 15 + [1.5]), INPUT1), 400),
    ("uint8_whole_number_out_of_range", "POST", "/v2/models/identity_uint8/infer",
     {"inputs": [tensor(shape=[2], datatype="UINT8", data=[1.0, 300.0])]}, 400),
    ("int64_beyond_range_as_float", "POST", "/v2/models/identity_int64/infer",
     {"inputs": [tensor(shape=[1], datatype="INT64", data=[2.0**64])]}, 400),
    ("bool_as_whole_numbers", "POST", "/v2/models/identity_bool/infer",
     {"inputs": [tensor(shape=[2], datatype="BOOL", data=[0.0, 1.0])]}, 400),
    ("empty_shape_beyond_addressable", "POST", "/v2/models/identity_fp32/infer",
     {"inputs": [tensor(shape=[0, 2**62], datatype="FP32", data=[])]}, 400),
    ("bool_in_int32", "POST", "/v2/models/simple/infer", simple(tensor(data=[True] * 16), INPUT1), 400),
    ("string_in_int32", "POST", "/v2/models/simple/infer", simple(tensor(data=["1"] * 16), INPUT1), 400),
    ("null_in_int32", "POST", "/v2/models/simple/infer", simple(tensor(data=[None] * 16), INPUT1), 400),
    ("int32_overflow", "POST", "/v2/models/simple/infer", simple(tensor(data=[2**31] * 16), INPUT1), 400),
    ("uint8_out_of_range", "POST", "/v2/models/identity_uint8/infer",
     {"inputs": [tensor(shape=[2], datatype="UINT8", data=[1, 300])]}, 400),
    ("uint64_negative", "POST", "/v2/models/identity_uint64/infer",
     {"inputs": [tensor(shape=[1], datatype="UINT64", data=[-1])]}, 400),
    ("bool_as_integers", "POST", "/v2/models/identity_bool/infer",
     {"inputs": [tensor(shape=[2], datatype="BOOL", data=[0, 1])]}, 400),
    ("bytes_as_number", "POST", "/v2/models/identity_bytes/infer",
     {"inputs": [tensor(shape=[2], datatype="BYTES", data=["a", 1])]}, 400),
    ("fp16_json_input", "POST", "/v2/models/identity_fp16/infer",
     {"inputs": [tensor(shape=[2], datatype="FP16", data=[0.5, 1.25])]}, 400),
    ("bf16_json_input", "POST", "/v2/models/identity_bf16/infer",
     {"inputs": [tensor(shape=[2], datatype="BF16", data=[0.5, 1.25])]}, 400),
    ("fp16_json_output", "POST", "/v2/models/identity_fp16/infer",
     binary({"inputs": [tensor(shape=[2], datatype="FP16", data=None, parameters={"binary_data_size": 4})]},
            np.array([0.5, 1], "<f2").tobytes()), 400),
    ("fp32_out_of_range", "POST", "/v2/models/identity_fp32/infer",
     {"inputs": [tensor(shape=[1], datatype="FP32", data=[1e300])]}, 400),
    ("shape_mismatch", "POST", "/v2/models/simple/infer",
     simple(tensor(shape=[1, 15], data=SIMPLE_A[:15]), INPUT1), 400),
    ("rank_mismatch", "POST", "/v2/models/simple/infer", simple(tensor(shape=[16]), INPUT1), 400),
    ("scalar_shape", "POST", "/v2/models/identity_int32/infer", {"inputs": [tensor(shape=[], data=[1])]}, 400),
    # inputs and outputs against the model (§13 #8, #9; models.yaml conventions)
    ("missing_input", "POST", "/v2/models/simple/infer", simple(tensor()), 400),
    ("no_inputs", "POST", "/v2/models/simple/infer", {"inputs": []}, 400),
    ("duplicate_input", "POST", "/v2/models/simple/infer", simple(tensor(), tensor(), INPUT1), 400),
    ("unknown_input", "POST", "/v2/models/simple/infer", simple(tensor(), INPUT1, tensor("INPUT2")), 400),
    ("unknown_output", "POST", "/v2/models/simple/infer", simple(outputs=[{"name": "OUTPUT2"}]), 400),
    ("duplicate_output", "POST", "/v2/models/simple/infer",
     simple(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), 400),
    # the binary tensor data extension (§13 #39-#43)
    ("binary_output_flag_not_bool", "POST", "/v2/models/simple/infer",
     simple(parameters={"binary_data_output": "yes"}), 400),
    ("binary_data_not_bool", "POST", "/v2/models/simple/infer",
     simple(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]), 400),
    ("binary_size_without_header", "POST", "/v2/models/simple/infer",
     (json.dumps(simple(BIN0, INPUT1)).encode() + I32, {}), 400),
    ("binary_size_without_header_or_bytes", "POST", "/v2/models/simple/infer", simple(BIN0, INPUT1), 400),
    ("binary_size_negative", "POST", "/v2/models/simple/infer",
     binary(simple(tensor(data=None, parameters={"binary_data_size": -4}), INPUT1), I32), 400),
    ("binary_size_string", "POST", "/v2/models/simple/infer",
     binary(simple(tensor(data=None, parameters={"binary_data_size": "64"}), INPUT1), I32), 400),
    ("binary_size_and_data", "POST", "/v2/models/simple/infer",
     binary(simple(tensor(parameters={"binary_data_size": 64}), INPUT1), I32), 400),
    ("no_data_at_all", "POST", "/v2/models/simple/infer", simple(tensor(data=None), INPUT1), 400),
    ("binary_too_few_bytes", "POST", "/v2/models/simple/infer", binary(simple(BIN0, INPUT1), I32[:-4]), 400),
    ("binary_too_many_bytes", "POST", "/v2/models/simple/infer", binary(simple(BIN0, INPUT1), I32 + b"\0"), 400),
    ("binary_size_not_the_shape", "POST", "/v2/models/simple/infer",
     binary(simple(tensor(data=None, parameters={"binary_data_size": 60}), INPUT1), I32[:60]), 400),
    ("header_length_not_integer", "POST", "/v2/models/simple/infer",
     binary(simple(BIN0, INPUT1), I32, length="ten"), 400),
    ("header_length_beyond_body", "POST", "/v2/models/simple/infer",
     binary(simple(BIN0, INPUT1), I32, length=10**6), 400),
    ("header_length_negative", "POST", "/v2/models/simple/infer", binary(simple(BIN0, INPUT1), I32, length=-1), 400),
    # No JSON header: the body is the single input's data, so a model with two inputs cannot take it.
    ("header_length_zero_two_inputs", "POST", "/v2/models/simple/infer",
     (I32 + I32, {"Inference-Header-Content-Length": "0"}), 400),
    ("header_length_zero_size_not_the_shape", "POST", "/v2/models/identity_int32/infer",
     (I32[:-1], {"Inference-Header-Content-Length": "0"}), 400),
    ("header_length_cuts_json", "POST", "/v2/models/simple/infer", binary(simple(BIN0, INPUT1), I32, length=20), 400),
    ("binary_bytes_truncated", "POST", "/v2/models/identity_bytes/infer",
     binary({"inputs": [tensor(shape=[1], datatype="BYTES", data=None, parameters={"binary_data_size": 6})]},
            b"\x05\0\0\0ab"), 400),
    ("binary_bool_not_0_or_1", "POST", "/v2/models/identity_bool/infer",
     binary({"inputs": [tensor(shape=[2], datatype="BOOL", data=None, parameters={"binary_data_size": 2})]},
            b"\x01\x02"), 400),
    # models and versions (§13 #14, #15, #52)
    ("unknown_model", "POST", "/v2/models/nope/infer", simple(), 404),
    ("unknown_version", "POST", "/v2/models/simple/versions/2/infer", simple(), 404),
    ("non_numeric_version", "POST", "/v2/models/simple/versions/v1/infer", simple(), 404),
    # the model the path names comes first, whatever the body (its meaning depends on the model)
    ("unknown_model_malformed_body", "POST", "/v2/models/nope/infer", (b"{", {}), 404),
    ("unknown_model_body_not_a_request", "POST", "/v2/models/nope/infer", {"inputs": 7}, 404),
    ("unknown_version_malformed_body", "POST", "/v2/models/simple/versions/2/infer", (b"[1,", {}), 404),
    ("unknown_model_raw_binary_body", "POST", "/v2/models/nope/infer",
     (b"\0" * 8, {"Inference-Header-Content-Length": "0"}), 404),
    ("unknown_model_bad_binary_header", "POST", "/v2/models/nope/infer",
     (b"{}", {"Inference-Header-Content-Length": "x"}), 404),
    ("metadata_unknown_model", "GET", "/v2/models/nope", None, 404),
    ("metadata_unknown_version", "GET", "/v2/models/simple/versions/7", None, 404),
    ("ready_unknown_model", "GET", "/v2/models/nope/ready", None, 404),
    ("ready_unknown_version", "GET", "/v2/models/simple/versions/7/ready", None, 404),
    # the model repository extension
    ("load_unknown_model", "POST", "/v2/repository/models/nope/load", None, 404),
    ("unload_unknown_model", "POST", "/v2/repository/models/nope/unload", None, 404),
    ("load_with_parameters", "POST", "/v2/repository/models/simple/load", {"parameters": {"config": "{}"}}, 501),
    ("load_parameter_object", "POST", "/v2/repository/models/simple/load", {"parameters": {"config": {}}}, 400),
    ("index_malformed", "POST", "/v2/repository/index", (b"{", {}), 400),
    ("index_array", "POST", "/v2/repository/index", [], 400),
    ("index_null", "POST", "/v2/repository/index", (b"null", {}), 400),
    ("index_ready_not_bool", "POST", "/v2/repository/index", {"ready": "yes"}, 400),
    # routes and methods (§13 #50, #57)
    ("wrong_method", "GET", "/v2/models/simple/infer", None, 405),
    ("wrong_method_health", "POST", "/v2/health/live", None, 405),
    ("unknown_path", "GET", "/v2/nope", None, 404),
    ("trailing_slash", "GET", "/v2/", None, 404),
    ("unimplemented_extension", "GET", "/v2/cudasharedmemory/status", None, 501),
    # the model itself
    ("model_failure", "POST", "/v2/models/failing/infer", {"inputs": [tensor(shape=[1], data=[1])]}, 500),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), [c[1:] for c in REST], ids=[c[0] for c in REST])
def test_rest(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, method: str, path: str, body: Any,
              status: int) -> None:
    if isinstance(body, tuple):
        content, headers = body
    else:
        content, headers = (None if body is None else json.dumps(body).encode()), {}
    assert_error_body(http.request(method, path, content=content, headers=headers), status)
    check_simple(http, stub)


# JSON that Python's own parser reads and RFC 8259 does not: each in a key every route reads (`id`).
NOT_RFC_8259 = {
    "nan": b'{"id": NaN}',
    "infinity": b'{"id": -Infinity}',
    "overflow": b'{"id": 1e400}',
    "lone_surrogate": b'{"id": "\\ud800"}',
}


def routes_with_json_bodies() -> list[str]:
    """Every route of the REST app that reads a JSON body, its path variables filled with what this server has."""
    from oip.server.rest import ENDPOINTS, REST_ONLY_ENDPOINTS

    names = {"model_name": "simple", "model_version": "1", "region_name": "r"}
    return [e.path.format(**names) for e in (*ENDPOINTS, *REST_ONLY_ENDPOINTS)
            if getattr(e, "body", "generate") is not None]


@pytest.mark.parametrize("body", list(NOT_RFC_8259.values()), ids=list(NOT_RFC_8259))
def test_every_json_body_is_read_as_rfc_8259_and_refused_400_alike(http: httpx.Client, body: bytes) -> None:
    """One strict JSON parser for every route (generate and generate_stream included): NaN, Infinity, a number
    that overflows a double and a lone surrogate are 400 "not valid JSON", never a value a model or an answer
    sees."""
    paths = routes_with_json_bodies()
    assert any(p.endswith("/generate_stream") for p in paths) and any(p.endswith("/infer") for p in paths)
    for path in paths:
        answer = http.post(path, content=body)
        assert answer.status_code == 400, (path, answer.status_code, answer.text)
        assert "is not valid JSON" in assert_error_body(answer, 400), (path, answer.text)


def test_generate_still_refuses_a_repeated_key(http: httpx.Client) -> None:
    for path in ("/v2/models/simple/generate", "/v2/models/simple/generate_stream"):
        message = assert_error_body(http.post(path, content=b'{"id": "a", "x": {"k": 1, "k": 2}}'), 400)
        assert message == "key 'k' appears more than once in the request body", message
        message = assert_error_body(http.post(path, content=b"[" * 1024 + b"]" * 1024), 400)
        assert "nested too deeply" in message or "must be a JSON object" in message, message


# --- gRPC ---------------------------------------------------------------------------------------------------------


def request(model: str = "simple", *inputs: dict[str, Any], raw: list[bytes] | None = None,
            **extra: Any) -> pb.ModelInferRequest:
    """A ModelInferRequest from proto3 JSON inputs (typed contents), plus raw contents as bytes."""
    message = json_format.ParseDict({"model_name": model, "inputs": list(inputs), **extra}, pb.ModelInferRequest())
    message.raw_input_contents.extend(raw or [])
    return message


def typed(name: str = "INPUT0", shape: Any = (1, 16), datatype: str = "INT32", field: str | None = "int_contents",
          values: Any = SIMPLE_A) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": [str(d) for d in shape]}
    if field is not None:
        out["contents"] = {field: values}
    return out


T1 = typed("INPUT1", values=SIMPLE_B)
RAW = [np.array(SIMPLE_A, "<i4").tobytes(), np.array(SIMPLE_B, "<i4").tobytes()]

GRPC: list[tuple[str, str, Any, grpc.StatusCode]] = [
    ("unknown_model", "ModelInfer", request("nope", typed(), T1), grpc.StatusCode.NOT_FOUND),
    ("empty_model_name", "ModelInfer", request("", typed(), T1), grpc.StatusCode.NOT_FOUND),
    ("unknown_version", "ModelInfer", request("simple", typed(), T1, model_version="2"), grpc.StatusCode.NOT_FOUND),
    ("non_numeric_version", "ModelInfer", request("simple", typed(), T1, model_version="v1"),
     grpc.StatusCode.NOT_FOUND),
    ("unknown_datatype", "ModelInfer", request("simple", typed(datatype="INT322"), T1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("datatype_mismatch", "ModelInfer", request("simple", typed(datatype="INT64", field="int64_contents"), T1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("shape_mismatch", "ModelInfer", request("simple", typed(shape=(1, 15), values=SIMPLE_A[:15]), T1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("rank_mismatch", "ModelInfer", request("simple", typed(shape=(16,)), T1), grpc.StatusCode.INVALID_ARGUMENT),
    ("negative_dim", "ModelInfer", request("simple", typed(shape=(-1, 16)), T1), grpc.StatusCode.INVALID_ARGUMENT),
    ("huge_shape", "ModelInfer", request("simple", typed(shape=(10**12, 16)), T1),
     grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("contents_too_short", "ModelInfer", request("simple", typed(values=SIMPLE_A[:-1]), T1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("contents_too_long", "ModelInfer", request("simple", typed(values=[*SIMPLE_A, 1]), T1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("raw_too_short", "ModelInfer", request("simple", typed(field=None), typed("INPUT1", field=None),
                                            raw=[RAW[0][:-4], RAW[1]]), grpc.StatusCode.INVALID_ARGUMENT),
    ("raw_too_long", "ModelInfer", request("simple", typed(field=None), typed("INPUT1", field=None),
                                           raw=[RAW[0] + b"\0\0\0\0", RAW[1]]), grpc.StatusCode.INVALID_ARGUMENT),
    ("contents_and_raw", "ModelInfer", request("simple", typed(), typed("INPUT1", field=None), raw=[RAW[1]]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("too_many_raw_entries", "ModelInfer", request("simple", typed(field=None), typed("INPUT1", field=None),
                                                   raw=[*RAW, RAW[0]]), grpc.StatusCode.INVALID_ARGUMENT),
    ("no_data", "ModelInfer", request("simple", typed(), typed("INPUT1", field=None)),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("contents_wrong_field", "ModelInfer",
     request("identity_uint32", typed(shape=(2,), datatype="UINT32", values=[1, 2])),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("contents_two_fields", "ModelInfer",
     request("identity_int32", {"name": "INPUT0", "datatype": "INT32", "shape": ["1"],
                                "contents": {"int_contents": [1], "fp32_contents": [1.0]}}),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("fp16_contents", "ModelInfer",
     request("identity_fp16", typed(shape=(2,), datatype="FP16", field="fp32_contents", values=[0.5, 1.25])),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("bf16_contents", "ModelInfer",
     request("identity_bf16", typed(shape=(2,), datatype="BF16", field="fp32_contents", values=[0.5, 1.25])),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("uint8_out_of_range", "ModelInfer",
     request("identity_uint8", typed(shape=(2,), datatype="UINT8", field="uint_contents", values=[1, 300])),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("int8_out_of_range", "ModelInfer",
     request("identity_int8", typed(shape=(1,), datatype="INT8", values=[-200])), grpc.StatusCode.INVALID_ARGUMENT),
    ("bool_raw_not_0_or_1", "ModelInfer",
     request("identity_bool", typed(shape=(2,), datatype="BOOL", field=None), raw=[b"\x00\x07"]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("bytes_raw_truncated", "ModelInfer",
     request("identity_bytes", typed(shape=(1,), datatype="BYTES", field=None), raw=[b"\x09\0\0\0abc"]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("bytes_raw_left_over", "ModelInfer",
     request("identity_bytes", typed(shape=(1,), datatype="BYTES", field=None), raw=[b"\x01\0\0\0ab"]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("missing_input", "ModelInfer", request("simple", typed()), grpc.StatusCode.INVALID_ARGUMENT),
    ("duplicate_input", "ModelInfer", request("simple", typed(), typed(), T1), grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown_input", "ModelInfer", request("simple", typed(), T1, typed("INPUT2")),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown_output", "ModelInfer", request("simple", typed(), T1, outputs=[{"name": "OUTPUT2"}]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("duplicate_output", "ModelInfer",
     request("simple", typed(), T1, outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("message_too_large", "ModelInfer",
     request("identity_uint8", typed(shape=(LIMIT + 1,), datatype="UINT8", field=None), raw=[bytes(LIMIT + 1)]),
     grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("model_failure", "ModelInfer", request("failing", typed(shape=(1,), values=[1])), grpc.StatusCode.INTERNAL),
    ("metadata_unknown_model", "ModelMetadata", pb.ModelMetadataRequest(name="nope"), grpc.StatusCode.NOT_FOUND),
    ("metadata_unknown_version", "ModelMetadata", pb.ModelMetadataRequest(name="simple", version="7"),
     grpc.StatusCode.NOT_FOUND),
    ("ready_unknown_model", "ModelReady", pb.ModelReadyRequest(name="nope"), grpc.StatusCode.NOT_FOUND),
    ("ready_unknown_version", "ModelReady", pb.ModelReadyRequest(name="simple", version="7"),
     grpc.StatusCode.NOT_FOUND),
    ("load_unknown_model", "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope"),
     grpc.StatusCode.NOT_FOUND),
    ("unload_unknown_model", "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="nope"),
     grpc.StatusCode.NOT_FOUND),
    ("unimplemented_extension", "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(),
     grpc.StatusCode.UNIMPLEMENTED),
]


@pytest.mark.parametrize(("method", "message", "code"), [c[1:] for c in GRPC], ids=[c[0] for c in GRPC])
def test_grpc(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, method: str, message: Any,
              code: grpc.StatusCode) -> None:
    got, error = grpc_call(stub, method, message)
    assert got is code, error
    assert error.details() and "Traceback" not in error.details()
    check_simple(http, stub)


def test_unknown_rpc(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, server: Server) -> None:
    """A method the service does not have (Triton's trace settings, say) is UNIMPLEMENTED."""
    with server.channel() as channel:
        call: Any = channel.unary_unary("/inference.GRPCInferenceService/TraceSetting")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=TIMEOUT)
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    check_simple(http, stub)


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe"], ids=["garbage", "invalid_utf8_name"])
def test_undecodable_message(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, server: Server,
                             data: bytes) -> None:
    """Bytes that are not a ModelInferRequest: INVALID_ARGUMENT, as any other malformed request."""
    with server.channel() as channel:
        unary: Any = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            unary(data, timeout=TIMEOUT)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    with server.channel() as channel:
        stream: Any = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as info:
            list(stream(iter([data]), timeout=TIMEOUT))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    check_simple(http, stub)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v2/models/simple/infer", simple(tensor(data=[*map(float, SIMPLE_A[:15]), 0.5]), INPUT1),
         "tensor 'INPUT0': INT32 element 15 must be an integer, got number 0.5"),
        ("/v2/models/identity_uint8/infer", {"inputs": [tensor(shape=[2], datatype="UINT8", data=[1.0, 300.0])]},
         "tensor 'INPUT0': UINT8 element 1 is out of range [0, 255]: 300.0"),
        ("/v2/models/identity_int64/infer", {"inputs": [tensor(shape=[1], datatype="INT64", data=[2**64])]},
         "tensor 'INPUT0': INT64 element 0 is out of range [-9223372036854775808, 9223372036854775807]: "
         "1.8446744073709552e+19"),  # the JSON parser reads integers beyond 64 bits as floats
        ("/v2/models/identity_fp32/infer", {"inputs": [tensor(shape=[0, 2**62], datatype="FP32", data=[])]},
         "tensor 'INPUT0': shape [0, 4611686018427387904] is too large: its non-zero dimensions times the element "
         "size exceed 2**63 bytes, even though the tensor is empty"),
    ],
    ids=["fraction", "uint8_range", "int64_range", "empty_huge_shape"],
)
def test_number_errors_name_tensor_index_and_value(http: httpx.Client, path: str, body: Any, message: str) -> None:
    """Refusals speak the protocol's words and name the tensor, the element and the value."""
    assert assert_error_body(http.post(path, json=body), 400) == message


def test_integral_numbers_are_accepted(http: httpx.Client) -> None:
    """JSON has one number type: INT32 data written as 0.0, 1.0, ... is the integers (as clients generated from
    the OpenAPI document send them); the answer is computed from them."""
    body = simple(tensor(data=[float(v) for v in SIMPLE_A]), tensor("INPUT1", data=[[float(v)] for v in SIMPLE_B]))
    response = http.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == [a + b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]
    assert outputs["OUTPUT1"] == [a - b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]
    # the reserved integer parameters alike: classification 2.0 is 2 (a free-form parameter keeps its number)
    classified = simple(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2.0}}])
    response = http.post("/v2/models/simple/infer", json=classified)
    assert response.status_code == 200, response.text
    assert len(response.json()["outputs"][0]["data"]) == 2 and response.json()["outputs"][0]["datatype"] == "BYTES"
    refused = simple(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2.5}}])
    assert "expected an integer, got 2.5" in assert_error_body(http.post("/v2/models/simple/infer", json=refused), 400)
    big = {"inputs": [tensor(shape=[3], datatype="UINT64", data=[0.0, 2.0**53, 2**64 - 1])]}
    response = http.post("/v2/models/identity_uint64/infer", json=big)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [0, 2**53, 2**64 - 1]


def test_unknown_keys_are_ignored_even_null(http: httpx.Client) -> None:
    """Keys the protocol does not have are ignored, whatever their value; null refuses only the protocol's fields."""
    body = simple(tensor(note=None), INPUT1, extra=None, outputs=[{"name": "OUTPUT0", "note": None}])
    response = http.post("/v2/models/simple/infer", json=body)
    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["OUTPUT0"]


LONG = "n" * 60_000


def _clipped(message: str) -> None:
    assert len(message) < 1200, len(message)
    assert "n" * 200 + "... (60000 characters)" in message, message[:400]


def test_echoed_values_are_clipped(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """A 60,000-character name comes back cut to 200 characters, saying how long it was: REST and gRPC, in the
    path, in the body, and through the codec's own errors."""
    _clipped(assert_error_body(http.post(f"/v2/models/{LONG}/infer", json=simple()), 404))
    _clipped(assert_error_body(http.post("/v2/models/simple/infer", json=simple(tensor(name=LONG), INPUT1)), 400))
    _clipped(assert_error_body(http.post("/v2/models/simple/infer",
                                         json=simple(tensor(name=LONG, data=[0.5] * 16), INPUT1)), 400))
    _clipped(assert_error_body(http.get(f"/v2/models/{LONG}"), 404))
    code, error = grpc_call(stub, "ModelInfer", request(LONG, typed(), T1))
    assert code is grpc.StatusCode.NOT_FOUND
    _clipped(error.details())
    code, error = grpc_call(stub, "ModelInfer", request("simple", typed(name=LONG, values=[1] * 16), T1))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    _clipped(error.details())
    check_simple(http, stub)


@pytest.mark.parametrize(
    "raw",
    [b"GARBAGE\r\n\r\n", b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"GET /v2 HTTP/9.9\r\n\r\n",
     b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"],
    ids=["request_line", "header", "version", "content_length"],
)
def test_malformed_http_answers_error_json(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub,
                                           server: Server, raw: bytes) -> None:
    """Requests that are not HTTP never reach the app: the HTTP layer answers 400 with the same error body."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"content-type: application/json" in head.lower(), head
    assert list(json.loads(body)) == ["error"] and "not valid HTTP" in json.loads(body)["error"], body
    check_simple(http, stub)


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _send_header_of(server: Server, size: int) -> bytes:
    """A health request whose `tracestate` header is `size` bytes, sent at once (as much as the server takes, in a
    thread): the whole answer, read meanwhile until the server closes."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT) as sock:
        head = f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\ntraceparent: {TRACEPARENT}\r\ntracestate: ".encode()

        def send() -> None:
            with contextlib.suppress(OSError):  # the server may close before it all went out
                sock.sendall(head)
                piece = b"k=" + b"v" * 65534
                for start in range(0, size, len(piece)):
                    sock.sendall(piece[: size - start])
                sock.sendall(b"\r\nConnection: close\r\n\r\n")

        sending = threading.Thread(target=send)
        sending.start()
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        sending.join(TIMEOUT)
        return answer


def test_a_64_mb_tracestate_is_refused_431_and_memory_stays_flat(
        server: Server, http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """The request line and headers are bounded (--http-max-header-bytes, 64 KiB by default): beyond, 431 with an
    error body and the connection closed, having held about the limit and one read: eight 64 MB headers leave
    the server's RSS where it was (uvicorn alone held each whole, +158 MB)."""
    assert _send_header_of(server, 60_000).startswith(b"HTTP/1.1 200 ")  # under the limit: served
    before = server.rss_kib()
    for size in (70_000, *[64 * 1024 * 1024] * 8):
        answer = _send_header_of(server, size)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), (size, answer[:300])
        assert b"content-type: application/json" in head.lower(), head
        assert json.loads(body) == {"error": "the request line and headers exceed 65536 bytes "
                                             "(--http-max-header-bytes)"}, body
    grown = server.rss_kib() - before
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB"
    check_simple(http, stub)


def test_grpc_metadata_beyond_the_header_limit_is_refused(
        http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """The same limit bounds a gRPC call's metadata: the call is refused with RESOURCE_EXHAUSTED, and calls
    within it are served (grpcio's own default would refuse anything over 16 KiB)."""
    live = stub.ServerLive(pb.ServerLiveRequest(), metadata=[("tracestate", "k=" + "v" * 60_000)], timeout=TIMEOUT)
    assert live.live
    for size in (70_000, 8 * 1024 * 1024):
        with pytest.raises(grpc.RpcError) as refused:
            stub.ServerLive(pb.ServerLiveRequest(), metadata=[("tracestate", "k=" + "v" * size)], timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    check_simple(http, stub)


def test_bad_input_leaves_no_traceback(server: Server) -> None:
    """The server logged no traceback for the client's mistakes (only for the model failures, by design)."""
    log = server.log_text()
    for block in log.split("Traceback")[1:]:
        assert "the model cannot do this" in block, block[:2000]


def test_models_still_all_ready(http: httpx.Client) -> None:
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert {m["state"] for m in http.post("/v2/repository/index").json()} == {"READY"}


def _http_answer(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One HTTP answer (head, body by Content-Length) read from a keep-alive connection."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-body"
        rest += chunk
    buffer[:] = rest[length:]
    return head, rest[:length]


def _timed_out(sock: socket.socket) -> float:
    """Read until the server closes the connection: it must have answered 408 with an error body; the wait."""
    start = time.monotonic()
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    waited = time.monotonic() - start
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert "did not arrive within 0.5 seconds" in json.loads(body)["error"], body
    return waited


def test_slow_headers_answer_408_and_busy_connections_stay(tmp_path: Path) -> None:
    """--http-header-timeout: a request line and headers that take longer than the timeout (from the connection's
    start, or from the first byte of a later request) get 408 with an error body; a keep-alive connection whose
    requests arrive whole is never cut, however long it lives (about 4 s)."""
    with running(build_repository(tmp_path / "models", only=("simple",)), tmp_path,
                 "--http-header-timeout", "0.5", "--http-max-header-bytes", "4096") as server:
        assert _send_header_of(server, 3000).startswith(b"HTTP/1.1 200 ")
        assert b"exceed 4096 bytes" in _send_header_of(server, 5000)  # the flag sets the limit
        address = ("127.0.0.1", server.http_port)
        with socket.create_connection(address, timeout=TIMEOUT) as sock:  # nothing at all
            assert 0.4 < _timed_out(sock) < TIMEOUT
        with socket.create_connection(address, timeout=TIMEOUT) as sock:  # a first line, then nothing
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            assert 0.4 < _timed_out(sock) < TIMEOUT
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            buffer = bytearray()
            started = time.monotonic()
            answered = 0
            while time.monotonic() - started < 1.6:  # whole requests for over three timeouts: all answered
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                head, body = _http_answer(sock, buffer)
                assert head.startswith(b"HTTP/1.1 200 "), head
                assert json.loads(body) == {"live": True}
                answered += 1
                time.sleep(0.2)
            assert answered >= 6
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")  # a later request that stalls mid-headers
            assert 0.4 < _timed_out(sock) < TIMEOUT
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
            assert http.post("/v2/models/simple/infer", json=simple()).status_code == 200
