"""The generated server over real sockets: `python -m oip serve` in a subprocess, REST (httpx) and gRPC (the
generated stubs) on loopback.

Every golden case of spec/examples that succeeds over both transports is sent both ways against a repository built
from spec/examples/models.yaml, and the two real answers must agree (the cases themselves are judged by the one
golden-case runner, `oip.conformance`, in test_conformance).
Then what the cases cannot express: the binary tensor data extension both ways, health bodies and the
not-ready status, draining on SIGTERM, the OpenAPI document, error bodies on unknown routes and methods, size
limits, and a huge shape refused without allocating.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import variants
import yaml
from google.protobuf import json_format
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import (
    EXAMPLES,
    SIMPLE_A,
    SIMPLE_B,
    STOP_TIMEOUT,
    TIMEOUT,
    Server,
    assert_error_body,
    build_repository,
    check_simple,
    grpc_call,
    running,
    server_env,
    simple_body,
    simple_grpc_request,
    start_server,
)

CASES = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "models.yaml")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server the golden cases run against: exactly the models of models.yaml."""
    root = tmp_path_factory.mktemp("cases")
    with running(build_repository(root / "models"), root) as server:
        yield server


@pytest.fixture(scope="module")
def extra_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`simple` plus the slow, broken, failing and byte_count models, with a 1 MiB message limit."""
    root = tmp_path_factory.mktemp("extra")
    repository = build_repository(root / "models", ("slow", "broken", "failing", "byte_count"),
                                  only=("simple", "identity_fp16", "identity_bytes"))
    with running(repository, root, "--max-request-bytes", str(1 << 20)) as server:
        yield server


# --- comparing answers ----------------------------------------------------------------------------------------


def load_case(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = yaml.safe_load(path.read_text())
    return case


def rest_call(http: httpx.Client, rest: dict[str, Any]) -> httpx.Response:
    if "raw_body" in rest:
        content: bytes | None = rest["raw_body"].encode()
    elif "body" in rest:
        content = json.dumps(rest["body"]).encode()
    else:
        content = None
    return http.request(rest["method"], rest["path"], content=content, headers=rest.get("headers"))


def rpc_types(operation: str) -> tuple[type[Any], type[Any]]:
    method = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[operation]
    return (getattr(pb, method.input_type.name), getattr(pb, method.output_type.name))


# --- the golden cases -------------------------------------------------------------------------------------------
# Every case is replayed over both transports by the one golden-case runner, `oip.conformance` (test_conformance).
# Here: for the cases that succeed both ways, the two transports' real answers agree, read without `oip.convert`
# (which writes the REST answers of ordinary operations, so it cannot judge them).

BOTH = [p for p in CASES if {"rest", "grpc"} <= load_case(p).keys() and load_case(p)["rest"]["status"] == 200]


def _as_message(api: Any, schema_name: str, body: Any, response_type: type[Any], inference: bool) -> Any:
    """The REST answer `body` read into the gRPC response message by protobuf's own JSON parser, after undoing
    the REST-only shapes the spec declares: an unwrapped body goes back into its field (a map keyed by `name`),
    REST-only properties go, and tensor `data` (REST) is left to `_tensors`."""
    schema = api.schema(schema_name)
    if schema.unwrap is not None:
        field = response_type.DESCRIPTOR.fields_by_name[schema.unwrap]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            body = {schema.unwrap: {item["name"]: item for item in body}}
        else:
            body = {schema.unwrap: body}
    else:
        body = {k: v for k, v in body.items()
                if any(p.name == k and p.field is not None for p in schema.properties)}
        if inference:
            body.pop("outputs", None)
    return json_format.ParseDict(body, response_type())


def _flat(data: Any) -> list[Any]:
    return [x for item in data for x in _flat(item)] if isinstance(data, list) else [data]


def _tensors_rest(body: dict[str, Any]) -> list[tuple[str, str, list[int], list[Any]]]:
    return [(o["name"], o["datatype"], o["shape"], _flat(o["data"])) for o in body["outputs"]]


def _tensors_grpc(reply: Any) -> list[tuple[str, str, list[int], list[Any]]]:
    out = []
    raw = list(reply.raw_output_contents)
    for o in reply.outputs:
        if o.datatype == "BYTES":
            values = [v.decode() for v in codec.from_raw(raw.pop(0), "BYTES", list(o.shape)).reshape(-1)]
        else:
            values = codec.from_raw(raw.pop(0), o.datatype, list(o.shape)).reshape(-1).tolist()
        out.append((o.name, o.datatype, list(o.shape), values))
    return out


@pytest.mark.parametrize("path", BOTH, ids=lambda p: p.stem)
def test_transports_agree(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, api: Any, path: Path) -> None:
    """The REST answer, read by protobuf's JSON parser (tensor data decoded apart), is the gRPC answer."""
    case = load_case(path)
    response = rest_call(http, case["rest"])
    assert response.status_code == 200, response.text
    rest_body = response.json() if response.content else None
    request_type, response_type = rpc_types(case["operation"])
    request = json_format.ParseDict(case["grpc"]["request"], request_type())
    code, reply = grpc_call(stub, case["operation"], request)
    assert code is grpc.StatusCode.OK, reply
    schema = api.operation(case["operation"]).rest[0].response
    if schema is None:  # an empty answer both ways
        assert rest_body is None and reply.ByteSize() == 0
        return
    if case.get("compare") == "keys":  # values that vary (server metadata): compare the keys of both answers
        printed = json_format.MessageToDict(reply, preserving_proto_field_name=True,
                                            always_print_fields_with_no_presence=True)
        assert set(printed) == set(rest_body)
        return
    inference = "raw_output_contents" in response_type.DESCRIPTOR.fields_by_name
    message = _as_message(api, schema, rest_body, response_type, inference)
    if inference:  # the tensors, decoded on each side
        assert _tensors_rest(rest_body) == _tensors_grpc(reply)
        reply = response_type.FromString(reply.SerializeToString())
        del reply.outputs[:]
        del reply.raw_output_contents[:]
    assert message == reply, f"REST read as gRPC: {message}\ngRPC: {reply}"


def test_every_case_runs_somewhere() -> None:
    assert len(CASES) > 50
    for path in CASES:
        assert {"rest", "grpc"} & load_case(path).keys(), path


# --- the binary tensor data extension ---------------------------------------------------------------------------


def binary_request(body: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(body).encode()
    return header + b"".join(chunks), {"Inference-Header-Content-Length": str(len(header)),
                                       "Content-Type": "application/octet-stream"}


def parse_binary_response(response: httpx.Response) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON header and every output as an array, whether it came as JSON data or binary data."""
    length = response.headers.get("inference-header-content-length")
    content = response.content
    header = json.loads(content[:int(length)] if length is not None else content)
    offset = int(length) if length is not None else len(content)
    arrays: dict[str, np.ndarray] = {}
    for output in header["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[output["name"]] = codec.from_json(output["data"], output["datatype"], output["shape"])
        else:
            assert "data" not in output
            arrays[output["name"]] = codec.from_raw(content[offset:offset + size], output["datatype"], output["shape"])
            offset += size
    assert offset == len(content)
    return header, arrays


def test_binary_inputs_and_outputs(http: httpx.Client) -> None:
    a = np.arange(16, dtype="<i4").reshape(1, 16)
    b = np.full((1, 16), 3, dtype="<i4")
    content, headers = binary_request({
        "id": "bin",
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
        ],
        "parameters": {"binary_data_output": True},
    }, a.tobytes(), b.tobytes())
    response = http.post("/v2/models/simple/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    header, arrays = parse_binary_response(response)
    assert header["id"] == "bin" and header["model_name"] == "simple" and header["model_version"] == "1"
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": 64}] * 2
    np.testing.assert_array_equal(arrays["OUTPUT0"], a + b)
    np.testing.assert_array_equal(arrays["OUTPUT1"], a - b)


def test_binary_and_json_mixed(http: httpx.Client) -> None:
    """A JSON input beside a binary one; one output binary (binary_data), the other JSON (listed without it)."""
    a = np.arange(16, dtype="<i4").reshape(1, 16)
    content, headers = binary_request({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": SIMPLE_B},
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}, {"name": "OUTPUT0"}],
        "parameters": {"binary_data_output": True},  # only for outputs not listed: none here
    }, a.tobytes())
    response = http.post("/v2/models/simple/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    header, arrays = parse_binary_response(response)
    assert [o["name"] for o in header["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    assert "data" not in header["outputs"][0] and header["outputs"][1]["data"] == [x + 1 for x in SIMPLE_A]
    np.testing.assert_array_equal(arrays["OUTPUT1"], a - 1)


def test_binary_bytes_and_fp16_round_trip(http: httpx.Client) -> None:
    words = np.array([b"", b"hello", "é".encode(), b"\x00\xff"], dtype=object)
    raw = bytes(codec.to_raw(words, "BYTES"))
    content, headers = binary_request({
        "inputs": [{"name": "INPUT0", "shape": [4], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }, raw)
    response = http.post("/v2/models/identity_bytes/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    _, arrays = parse_binary_response(response)
    assert arrays["OUTPUT0"].tolist() == words.tolist()

    halves = np.array([0.5, -1.25, 65504, 0], dtype="<f2")
    content, headers = binary_request({
        "inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP16", "parameters": {"binary_data_size": 8}}],
        "parameters": {"binary_data_output": True},
    }, halves.tobytes())
    response = http.post("/v2/models/identity_fp16/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    header, arrays = parse_binary_response(response)
    assert header["outputs"][0]["datatype"] == "FP16"
    np.testing.assert_array_equal(arrays["OUTPUT0"], halves)

    # FP16 has no JSON form: asking for the output as JSON is refused, and the server goes on.
    content, headers = binary_request({
        "inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP16", "parameters": {"binary_data_size": 8}}],
    }, halves.tobytes())
    assert_error_body(http.post("/v2/models/identity_fp16/infer", content=content, headers=headers), 400)


def test_raw_binary_request_without_json_header(http: httpx.Client, extra_server: Server) -> None:
    """Inference-Header-Content-Length: 0: the body is the data of the model's only input; outputs come binary."""
    values = np.array([0.5, -2.0, 3.25], dtype="<f4")
    response = http.post("/v2/models/identity_fp32/infer", content=values.tobytes(),
                         headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200, response.text
    header, arrays = parse_binary_response(response)
    assert header["outputs"][0]["shape"] == [3] and header["outputs"][0]["parameters"] == {"binary_data_size": 12}
    np.testing.assert_array_equal(arrays["OUTPUT0"], values)
    # The body's size must fit the declared shape; a model with two inputs cannot take one.
    assert_error_body(http.post("/v2/models/identity_fp32/infer", content=b"\0" * 6,
                                headers={"Inference-Header-Content-Length": "0"}), 400)
    assert_error_body(http.post("/v2/models/simple/infer", content=b"\0" * 128,
                                headers={"Inference-Header-Content-Length": "0"}), 400)
    with extra_server.clients() as (extra, _):
        # BYTES: the whole body is the one element of an input declared [1] (an image file, say).
        blob = bytes(range(256)) * 3
        response = extra.post("/v2/models/byte_count/infer", content=blob,
                              headers={"Inference-Header-Content-Length": "0"})
        assert response.status_code == 200, response.text
        assert parse_binary_response(response)[1]["OUTPUT0"].tolist() == [len(blob)]
        # A BYTES input of any other shape cannot say where its elements end.
        assert_error_body(extra.post("/v2/models/identity_bytes/infer", content=b"abc",
                                     headers={"Inference-Header-Content-Length": "0"}), 400)


def test_empty_binary_output_is_plain_json(http: httpx.Client) -> None:
    """A binary output of 0 bytes says binary_data_size 0 and adds nothing: the answer is plain JSON."""
    body = {"inputs": [{"name": "INPUT0", "shape": [0], "datatype": "FP32", "data": []}],
            "parameters": {"binary_data_output": True}}
    response = http.post("/v2/models/identity_fp32/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    assert response.json()["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_the_server_runs_on_the_python_it_was_asked_to(server: Server) -> None:
    """The suite's servers run on OIP_SERVER_PYTHON when it is set (tests/serving.py), as the test of the server at
    its declared floors has them (tests/package/test_dist.py), else on this python."""
    argv = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0].decode() == os.environ.get("OIP_SERVER_PYTHON", sys.executable), argv


def test_json_outputs_match_python_floats(http: httpx.Client) -> None:
    """FP32 JSON outputs print as the Python floats of the float32 values (as `codec.to_json` gives them)."""
    values = [0.1, 1 / 3, 1e-45, 3.4028234663852886e38, -0.0]
    body = {"inputs": [{"name": "INPUT0", "shape": [5], "datatype": "FP32", "data": values}]}
    response = http.post("/v2/models/identity_fp32/infer", json=body)
    assert response.status_code == 200, response.text
    expected = codec.to_json(np.array(values, dtype=np.float32))
    assert json.loads(response.text)["outputs"][0]["data"] == expected
    # the same digits: orjson writes an exponent as e38 or e+38, by its version
    assert json.dumps(expected, separators=(",", ":")).replace("e+", "e") in response.text.replace("e+", "e")


# --- health, readiness, repository -----------------------------------------------------------------------------


def test_health_bodies(http: httpx.Client) -> None:
    assert http.get("/v2/health/live").json() == {"live": True}
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.get("/v2/models/simple/ready").json() == {"name": "simple", "ready": True}
    assert http.get("/v2/models/simple/versions/1/ready").json() == {"name": "simple", "ready": True}
    assert_error_body(http.get("/v2/models/nope/ready"), 404)


def check_not_ready(server: Server, status: int) -> None:
    with server.clients() as (http, stub):
        assert http.get("/v2/health/live").json() == {"live": True}
        # `broken` failed to load: the server is not ready, and neither is the model; its ready, metadata and
        # inference answers name it and say why, over both transports.
        response = http.get("/v2/health/ready")
        assert (response.status_code, response.json()) == (status, {"ready": False})
        assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
        why = "model 'broken' has no ready version: version 1: failed to load: weights not found"
        assert assert_error_body(http.get("/v2/models/broken/ready"), status) == why
        assert assert_error_body(http.get("/v2/models/broken"), status) == why
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
        assert assert_error_body(http.post("/v2/models/broken/infer", json=body), status) == why
        infer = json_format.ParseDict({"model_name": "broken", "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [1]}}]},
            pb.ModelInferRequest())
        for operation, request in (("ModelReady", pb.ModelReadyRequest(name="broken")), ("ModelInfer", infer),
                                   ("ModelMetadata", pb.ModelMetadataRequest(name="broken"))):
            code, error = grpc_call(stub, operation, request)
            assert (code, error.details()) == (grpc.StatusCode.UNAVAILABLE, why), operation
        index = http.post("/v2/repository/index", json={}).json()
        broken = next(entry for entry in index if entry["name"] == "broken")
        assert broken["state"] == "UNAVAILABLE" and "weights not found" in broken["reason"]

        # Unloading a model makes it not ready; loading it again makes it ready.
        assert http.post("/v2/repository/models/simple/unload").status_code == 200
        response = http.get("/v2/models/simple/ready")
        assert (response.status_code, response.json()) == (status, {"name": "simple", "ready": False})
        assert_error_body(http.post("/v2/models/simple/infer", json=simple_body()), status)
        assert http.post("/v2/repository/models/simple/load").status_code == 200
        assert http.get("/v2/models/simple/ready").json() == {"name": "simple", "ready": True}
        check_simple(http, stub)


def test_not_ready_is_503_by_default(extra_server: Server) -> None:
    check_not_ready(extra_server, 503)


def test_not_ready_status_400(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", ("broken",), only=("simple",))
    with running(repository, tmp_path, "--not-ready-status", "400") as server:
        check_not_ready(server, 400)


# --- the OpenAPI document, routes and methods -------------------------------------------------------------------


def test_openapi_is_the_spec_and_the_models(http: httpx.Client, api: Any) -> None:
    """The spec's document, less the operations and tag of CUDA shared memory, the one extension this server does
    not serve (its operations answer 501), plus each ready model's inference (test_openapi_models checks those)."""
    response = http.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    enabled = set(http.get("/v2").json()["extensions"])
    assert "cuda_shared_memory" not in enabled
    spec = {**api.openapi, "tags": [t for t in api.openapi["tags"] if t["name"] != "cuda_shared_memory"],
            "paths": {p: item for p, item in api.openapi["paths"].items() if not p.startswith("/v2/cudasharedmemory")}}
    assert any(p.startswith("/v2/cudasharedmemory") for p in api.openapi["paths"])
    assert not any(p.startswith("/v2/cudasharedmemory") for p in doc["paths"])
    assert {k: v for k, v in doc.items() if k not in ("paths", "components", "tags")} == {
        k: v for k, v in spec.items() if k not in ("paths", "components", "tags")}
    # the spec's paths as they are, but the templated inference and generate: their model_name excludes the served
    # models, which their own paths answer first
    templated = {f"/v2/models/{{model_name}}/{version}{op}" for version in ("", "versions/{model_version}/")
                 for op in ("infer", "generate", "generate_stream")}
    assert templated <= spec["paths"].keys()
    assert {path: doc["paths"][path] for path in spec["paths"] if path not in templated} == {
        path: item for path, item in spec["paths"].items() if path not in templated}
    served = sorted(m["name"] for m in http.post("/v2/repository/index", json={"ready": True}).json())
    assert "simple" in served
    for path in templated:
        got, want = doc["paths"][path]["post"], spec["paths"][path]["post"]
        assert {k: v for k, v in got.items() if k != "parameters"} == {
            k: v for k, v in want.items() if k != "parameters"}
        assert [p["name"] for p in got["parameters"]] == [p["name"] for p in want["parameters"]]
        for mine, theirs in zip(got["parameters"], want["parameters"], strict=True):
            if mine["name"] == "model_name":
                assert mine["schema"] == {**theirs["schema"], "not": {"enum": served}}, mine
            else:
                assert mine == theirs
    added = doc["paths"].keys() - spec["paths"].keys()
    assert "/v2/models/simple/infer" in added and all(p.startswith("/v2/models/") and "{" not in p for p in added)
    schemas = doc["components"].pop("schemas")
    assert doc["components"] == {k: v for k, v in spec["components"].items() if k != "schemas"}
    assert {name: schemas[name] for name in spec["components"]["schemas"]} == spec["components"]["schemas"]
    assert doc["tags"][:len(spec["tags"])] == spec["tags"]
    docs = http.get("/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/nope", 404),
    ("GET", "/v2/", 404),
    ("GET", "/v2/models/simple/versions/1/nope", 404),
    ("POST", "/v2", 405),
    ("DELETE", "/v2/health/live", 405),
    ("PUT", "/v2/models/simple/infer", 405),
    ("GET", "/v2/models/simple/infer", 405),
    ("POST", "/v2/repository/index/extra", 404),
])
def test_unknown_routes_and_methods(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, method: str,
                                    path: str, status: int) -> None:
    message = assert_error_body(http.request(method, path), status)
    assert "detail" not in message
    check_simple(http, stub)


def test_unimplemented_operations(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """An operation of the spec the data plane does not implement has its route and method: 501 / UNIMPLEMENTED
    (CUDA shared memory: this server has no GPU stack)."""
    assert_error_body(http.get("/v2/cudasharedmemory/status"), 501)
    assert_error_body(http.get("/v2/cudasharedmemory/region/r/status"), 501)
    code, _ = grpc_call(stub, "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
    assert code is grpc.StatusCode.UNIMPLEMENTED
    check_simple(http, stub)


def test_an_rpc_added_to_the_spec_is_served_unimplemented(tmp_path: Path) -> None:
    """Add an RPC and its REST operation to a copy of the spec, rebuild: the server has its route and its method,
    both answering 501 / UNIMPLEMENTED until the data plane implements it."""
    package = variants.build("rpc_added", tmp_path)  # tests/specs/variants.py: one place for the change
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, package_dir=package.parent) as server, server.http_client() as http, \
            server.channel() as channel:
        assert "ServerLiveAgain" in assert_error_body(http.get("/v2/health/live_again"), 501)
        again: Any = channel.unary_unary("/inference.GRPCInferenceService/ServerLiveAgain")
        with pytest.raises(grpc.RpcError) as info:
            again(b"", timeout=TIMEOUT)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        check_simple(http, pb_grpc.GRPCInferenceServiceStub(channel))


def test_stream_infer(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """ModelStreamInfer: one wrapped response per request; a failed request is reported in error_message."""
    bad = pb.ModelInferRequest(model_name="nope")
    replies = list(stub.ModelStreamInfer(iter([simple_grpc_request(), bad, simple_grpc_request()]), timeout=TIMEOUT))
    assert [bool(r.error_message) for r in replies] == [False, True, False]
    assert replies[0].infer_response.model_name == "simple" and len(replies[0].infer_response.raw_output_contents) == 2


# --- limits ------------------------------------------------------------------------------------------------------


def test_huge_shape_without_data_is_refused_without_allocating(extra_server: Server) -> None:
    with extra_server.clients() as (http, stub):
        before = extra_server.rss_kib()
        huge = 1_000_000_000_000
        for body in (
            {"inputs": [{"name": "INPUT0", "shape": [huge], "datatype": "INT32"}]},
            {"inputs": [{"name": "INPUT0", "shape": [huge], "datatype": "INT32", "data": []}]},
            {"inputs": [{"name": "INPUT0", "shape": [huge], "datatype": "BYTES", "data": ["a"]}]},
        ):
            assert_error_body(http.post("/v2/models/slow/infer", json=body), 413)
        # Within the element limit but without the data: refused as invalid, still without allocating.
        body = {"inputs": [{"name": "INPUT0", "shape": [200_000_000], "datatype": "INT32", "data": [1]}]}
        assert_error_body(http.post("/v2/models/slow/infer", json=body), 400)
        content, headers = binary_request({"inputs": [{"name": "INPUT0", "shape": [200_000_000], "datatype": "INT32",
                                                       "parameters": {"binary_data_size": 4}}]}, b"\0\0\0\0")
        assert_error_body(http.post("/v2/models/slow/infer", content=content, headers=headers), 400)
        for datatype, raw in (("INT32", b"\0\0\0\0"), ("BYTES", b"\0\0\0\0")):
            request = pb.ModelInferRequest(model_name="slow", raw_input_contents=[raw])
            request.inputs.add(name="INPUT0", datatype=datatype, shape=[huge])
            assert grpc_call(stub, "ModelInfer", request)[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
            request.inputs[0].shape[:] = [200_000_000]
            assert grpc_call(stub, "ModelInfer", request)[0] is grpc.StatusCode.INVALID_ARGUMENT
        after = extra_server.rss_kib()
        assert after - before < 100 * 1024, (before, after)
        check_simple(http, stub)


def test_body_too_large_is_413(extra_server: Server) -> None:
    with extra_server.clients() as (http, stub):
        data = [0] * 600_000  # about 1.2 MB of JSON
        body = {"inputs": [{"name": "INPUT0", "shape": [len(data)], "datatype": "INT32", "data": data}]}
        assert_error_body(http.post("/v2/models/slow/infer", json=body), 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
            yield b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0'
            for _ in range(300):
                yield b"," + b"0," * 2048 + b"0"
            yield b"]}]}"

        assert_error_body(http.post("/v2/models/slow/infer", content=chunks()), 413)
        check_simple(http, stub)


def test_compressed_bodies_are_inflated_within_the_limit(extra_server: Server) -> None:
    import gzip
    import zlib

    with extra_server.clients() as (http, stub):
        body = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}
        raw = json.dumps(body).encode()
        for encoding, packed in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
            reply = http.post("/v2/models/slow/infer", content=packed, headers={"Content-Encoding": encoding})
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"] == [1, 2, 3]
        # A small body that would inflate past the limit is refused without inflating it all.
        bomb = gzip.compress(b'{"inputs": [' + b" " * (4 * 1024 * 1024) + b"]}")
        assert len(bomb) < 20_000
        assert_error_body(http.post("/v2/models/slow/infer", content=bomb, headers={"Content-Encoding": "gzip"}), 413)
        assert_error_body(http.post("/v2/models/slow/infer", content=b"not gzip",
                                    headers={"Content-Encoding": "gzip"}), 400)
        assert_error_body(http.post("/v2/models/slow/infer", content=raw, headers={"Content-Encoding": "br"}), 400)
        check_simple(http, stub)


def test_grpc_message_too_large(extra_server: Server) -> None:
    with extra_server.clients() as (http, stub):
        count = 300_000  # 1.2 MB of raw INT32
        request = pb.ModelInferRequest(model_name="slow", raw_input_contents=[bytes(4 * count)])
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[count])
        assert grpc_call(stub, "ModelInfer", request)[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
        check_simple(http, stub)


def test_model_failure_is_500_without_traceback(extra_server: Server) -> None:
    with extra_server.clients() as (http, stub):
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
        message = assert_error_body(http.post("/v2/models/failing/infer", json=body), 500)
        assert "the model cannot do this" in message
        code, error = grpc_call(stub, "ModelInfer", json_format.ParseDict(
            {"model_name": "failing", "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1],
                                                  "contents": {"int_contents": [1]}}]}, pb.ModelInferRequest()))
        assert code is grpc.StatusCode.INTERNAL and "Traceback" not in error.details()
        check_simple(http, stub)


# --- stopping ----------------------------------------------------------------------------------------------------


def wait_started(folder: Path, count: int) -> None:
    """Wait (bounded) until the slow model has started `count` requests."""
    deadline = time.monotonic() + TIMEOUT
    while len(list(folder.glob("started-*"))) < count:
        assert time.monotonic() < deadline, "the slow model did not start"
        time.sleep(0.01)


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    """SIGTERM while a slow request runs on each transport: both complete, new connections are refused, exit 0."""
    repository = build_repository(tmp_path / "models", ("slow",), only=("simple",))
    server = start_server(repository, tmp_path)
    results: dict[str, Any] = {}

    def rest_call_slow() -> None:
        body = {"parameters": {"delay": 3},
                "inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}
        try:
            results["rest"] = httpx.post(f"{server.url}/v2/models/slow/infer", json=body, timeout=TIMEOUT)
        except Exception as exc:  # reported by the assertions below
            results["rest"] = exc

    def grpc_call_slow() -> None:
        request = pb.ModelInferRequest(model_name="slow", raw_input_contents=[np.array([4, 5], "<i4").tobytes()])
        request.parameters["delay"].double_param = 3
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
        with server.channel() as channel:
            results["grpc"] = grpc_call(pb_grpc.GRPCInferenceServiceStub(channel), "ModelInfer", request)

    try:
        threads = [threading.Thread(target=rest_call_slow), threading.Thread(target=grpc_call_slow)]
        for thread in threads:
            thread.start()
        wait_started(repository / "slow", 2)  # both requests are in flight, each in its own worker thread
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TIMEOUT
        while True:  # new connections are refused while the two requests still run
            try:
                httpx.get(f"{server.url}/v2/health/live", timeout=1)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "the server still takes connections after SIGTERM"
            time.sleep(0.05)
        assert server.process.poll() is None and not results
        for thread in threads:
            thread.join(timeout=TIMEOUT)
        assert server.process.wait(timeout=STOP_TIMEOUT) == 0, server.log_text()
    finally:
        server.stop()
    rest = results["rest"]
    assert isinstance(rest, httpx.Response) and rest.status_code == 200, rest
    assert rest.json()["outputs"][0]["data"] == [1, 2, 3]
    code, reply = results["grpc"]
    assert code is grpc.StatusCode.OK, reply
    assert codec.from_raw(reply.raw_output_contents[0], "INT32", [2]).tolist() == [4, 5]
    log = server.log_text()
    assert "draining" in log and "Traceback" not in log, log


def test_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", ("slow",), only=())
    server = start_server(repository, tmp_path)
    body = {"parameters": {"delay": 20}, "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
    failures: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(f"{server.url}/v2/models/slow/infer", json=body, timeout=5)
        except httpx.TransportError as exc:  # expected: the server went away
            failures.append(exc)

    thread = threading.Thread(target=call)
    try:
        thread.start()
        wait_started(repository / "slow", 1)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TIMEOUT
        while "draining" not in server.log_text():  # the first signal is taken: the server drains
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=10) == 128 + signal.SIGTERM
        thread.join(timeout=TIMEOUT)
    finally:
        server.kill()
    assert failures and "stopping now" in server.log_text()


def test_serve_help() -> None:
    result = subprocess.run([sys.executable, "-m", "oip", "serve", "--help"], capture_output=True, text=True,
                            env=server_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    for option in ("--model-repository", "--http-port", "--grpc-port", "--not-ready-status", "--ports-file",
                   "--log-level", "--access-log", "--max-request-bytes"):
        assert option in result.stdout
