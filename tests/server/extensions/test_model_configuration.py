"""Triton's model configuration extension against the generated server, and the declarations it reports.

tritonclient (http and grpc) reads the configuration as its users do (get_model_config); the REST body is compared
with the gRPC message (the same data: REST is the proto3 JSON form with 64-bit integers as numbers and every field
written out, as Triton writes these bodies and perf_analyzer reads them). The batch dimension a configuration
declares is enforced on requests and answers; model.toml and the model API's declarations are checked in process.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from extension_models import MODEL_THREADS, MODELS, as_rest, serve_models
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server import Model, ModelRepository, TensorSpec
from oip.server.model import DynamicBatching
from serving import Server, assert_error_body, check_simple, grpc_call
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


# --- server metadata ----------------------------------------------------------------------------------------------


def test_server_metadata_lists_the_extensions(triton_http: httpclient.InferenceServerClient,
                                              triton_grpc: grpcclient.InferenceServerClient) -> None:
    extensions = triton_http.get_server_metadata()["extensions"]
    for name in ("model_configuration", "statistics", "classification"):
        assert name in extensions
    assert list(triton_grpc.get_server_metadata().extensions) == extensions
    assert "cuda_shared_memory" not in extensions


# --- model configuration ------------------------------------------------------------------------------------------


SIMPLE_CONFIG = {
    "name": "simple",
    "platform": "oipgen_example",
    "backend": "python",
    "runtime": "",
    "version_policy": {"all": {}},
    "max_batch_size": 0,
    "input": [
        {"name": name, "data_type": "TYPE_INT32", "format": "FORMAT_NONE", "dims": [1, 16], "is_shape_tensor": False,
         "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}
        for name in ("INPUT0", "INPUT1")
    ],
    "output": [
        {"name": name, "data_type": "TYPE_INT32", "dims": [1, 16], "label_filename": "", "is_shape_tensor": False,
         "is_non_linear_format_io": False}
        for name in ("OUTPUT0", "OUTPUT1")
    ],
    "instance_group": [{"name": "simple_0", "count": MODEL_THREADS, "gpus": [], "kind": "KIND_CPU", "profile": [],
                        "passive": False, "host_policy": ""}],
    "default_model_filename": "",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {},
    "model_transaction_policy": {"decoupled": False},
}


def test_model_config_over_rest(triton_http: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    config = triton_http.get_model_config("simple")
    assert config == SIMPLE_CONFIG
    assert triton_http.get_model_config("simple", "1") == config
    raw = http.get("/v2/models/simple/config")
    assert raw.headers["content-type"].startswith("application/json")
    assert b'"dims":[1,16]' in raw.content  # int64 dims are JSON numbers, not strings
    # what perf_analyzer reads without checking that it exists
    assert config["model_transaction_policy"]["decoupled"] is False and "dynamic_batching" not in config


def test_model_config_over_grpc_equals_rest(triton_grpc: grpcclient.InferenceServerClient,
                                           stub: pb_grpc.GRPCInferenceServiceStub, http: httpx.Client) -> None:
    config = triton_grpc.get_model_config("simple").config
    assert config.name == "simple" and config.max_batch_size == 0 and list(config.input[0].dims) == [1, 16]
    assert config.input[0].data_type == 8  # TYPE_INT32 in Triton's own model_config.proto
    for name in ("simple", "scores", "batched", "configured"):
        for version in ("", "1"):
            reply = stub.ModelConfig(pb.ModelConfigRequest(name=name, version=version), timeout=30)
            path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/config"
            assert http.get(path).json() == as_rest(reply.config), (name, version)


def test_model_config_of_a_batching_model(http: httpx.Client, triton_http: httpclient.InferenceServerClient) -> None:
    config = http.get("/v2/models/batched/config").json()
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT0", [3]), ("INPUT1", [3])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT0", [3])]
    # metadata carries the batch dimension as -1 (perf_analyzer drops the first dimension when max_batch_size > 0)
    metadata = triton_http.get_model_metadata("batched")
    assert [t["shape"] for t in metadata["inputs"] + metadata["outputs"]] == [[-1, 3]] * 3


def test_model_config_from_model_toml(http: httpx.Client) -> None:
    config = http.get("/v2/models/configured/config").json()
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 8
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 250, "preserve_ordering": False,
        "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {},
    }
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("IMAGE", "TYPE_UINT8", [3, -1, -1]), ("NAME", "TYPE_STRING", [1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("LOGITS", "TYPE_FP16", [1000])]


@pytest.mark.parametrize(("path", "request_", "status", "code"), [
    ("/v2/models/nope/config", pb.ModelConfigRequest(name="nope"), 404, grpc.StatusCode.NOT_FOUND),
    ("/v2/models/simple/versions/7/config", pb.ModelConfigRequest(name="simple", version="7"), 404,
     grpc.StatusCode.NOT_FOUND),
])
def test_model_config_errors(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, path: str,
                             request_: pb.ModelConfigRequest, status: int, code: grpc.StatusCode) -> None:
    assert_error_body(http.get(path), status)
    assert grpc_call(stub, "ModelConfig", request_)[0] is code
    assert_error_body(http.post(path), 405)
    check_simple(http, stub)


def test_model_config_errors_through_tritonclient(triton_http: httpclient.InferenceServerClient,
                                                  triton_grpc: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="nope"):
        triton_http.get_model_config("nope")
    with pytest.raises(InferenceServerException, match="nope"):
        triton_grpc.get_model_config("nope")


# --- the batching convention --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shapes", "message"), [
    ([[5, 3], [5, 3]], "batch-size must be <= 4"),
    ([[0, 3], [0, 3]], "batch-size must be >= 1"),
    ([[2, 3], [3, 3]], "same batch size"),
    ([[3], [3]], "Expected [-1,3]"),
    ([[1, 4], [1, 4]], "Expected [-1,3]"),
])
def test_batch_dimension_is_validated(http: httpx.Client, shapes: list[list[int]], message: str) -> None:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": s, "data": [0.0] * int(np.prod(s))}
                       for n, s in zip(("INPUT0", "INPUT1"), shapes, strict=True)]}
    assert message in assert_error_body(http.post("/v2/models/batched/infer", json=body), 400)


def test_output_batch_must_match_the_request(http: httpx.Client) -> None:
    one = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    assert http.post("/v2/models/wrong_batch/infer", json=one).json()["outputs"][0]["shape"] == [1, 2]
    three = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [3, 2], "data": [1, 2] * 3}]}
    assert "batch of 3" in assert_error_body(http.post("/v2/models/wrong_batch/infer", json=three), 500)


# --- declarations, in process -------------------------------------------------------------------------------------


def test_model_toml_declarations(tmp_path: Path) -> None:
    source = textwrap.dedent(MODELS["counted"][1])
    tomls = {
        "good": 'max_batch_size = 2\ndecoupled = true\n[dynamic_batching]\npreferred_batch_size = [2]\n',
        "batching_needs_a_batch": '[dynamic_batching]\nmax_queue_delay_microseconds = 10\n',
        "preferred_too_large": 'max_batch_size = 2\n[dynamic_batching]\npreferred_batch_size = [4]\n',
        "bad_size": 'max_batch_size = -1\n',
        "bad_decoupled": 'decoupled = "yes"\n',
        "bad_key": 'max_batch_size = 2\n[dynamic_batching]\nmax_delay = 3\n',
    }
    for name, text in tomls.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.toml").write_text('class = "model:Counted"\n' + text)
        (tmp_path / name / "model.py").write_text(source)

    async def scenario() -> dict[str, tuple[str, str]]:
        repository = ModelRepository(tmp_path)
        await repository.load_all()
        model = repository.get("good")
        assert (model.max_batch_size, model.decoupled) == (2, True)
        assert model.dynamic_batching == DynamicBatching(0, (2,))
        return {s.name: (s.state.value, s.reason) for s in repository.index()}

    states = asyncio.run(scenario())
    assert states.pop("good") == ("READY", "")
    expected = {"batching_needs_a_batch": "max_batch_size >= 1", "preferred_too_large": "preferred_batch_size",
                "bad_size": "max_batch_size", "bad_decoupled": "decoupled", "bad_key": "max_delay"}
    for name, (state, reason) in states.items():
        assert state == "UNAVAILABLE" and expected[name] in reason, (name, reason)


def test_model_api_declarations() -> None:
    spec = TensorSpec.of({"name": "OUT", "datatype": "FP32", "shape": [3], "labels": ["a", "b"]})
    assert spec.labels == ("a", "b") and TensorSpec("X", "FP32", [1]).labels == ()
    with pytest.raises(ValueError, match="labels"):
        TensorSpec("X", "FP32", [1], labels="abc")
    with pytest.raises(ValueError, match="only outputs"):
        Model("m", inputs=[spec], outputs=[])
    model = Model("m", max_batch_size=4, dynamic_batching={"preferred_batch_size": [2, 4]}, decoupled=True)
    assert model.dynamic_batching == DynamicBatching(0, (2, 4)) and model.decoupled is True
    with pytest.raises(ValueError, match="max_batch_size >= 1"):
        Model("m", dynamic_batching=DynamicBatching())
    with pytest.raises(ValueError, match="decoupled"):
        Model("m", decoupled=1)  # type: ignore[arg-type]
