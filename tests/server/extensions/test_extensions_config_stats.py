"""Triton's model configuration, statistics and classification extensions, and the reserved parameter keys.

One `python -m oip serve` (loopback, ephemeral ports) for the module, over `simple` (spec/examples/models.yaml),
`failing` and `slow` (tests/serving.py) and the models below. tritonclient (http and grpc) calls the extensions
as its users do (get_model_config, get_inference_statistics, class_count); the REST bodies are compared with the
gRPC messages (the same data: REST is the proto3 JSON form with 64-bit integers as numbers and every field
written out, as Triton writes these bodies and perf_analyzer reads them). The data plane is also driven directly
where no socket is needed (model.toml declarations, disabled extensions, value formatting).
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server import DataPlane, InvalidRequest, Model, ModelRepository, Settings, Tensor, TensorSpec, Unimplemented
from oip.server.core.classification import classify
from oip.server.model import DynamicBatching
from oip.server.types import InferRequest, RequestedOutput
from serving import Server, assert_error_body, build_repository, check_simple, grpc_call, running
from tritonclient.utils import InferenceServerException

MODELS = {
    # Identity on four FP32 scores, answered in several datatypes; SCORES has class labels.
    "scores": ("Scores", '''
import numpy as np

from oip.server.model import Model, TensorSpec


class Scores(Model):
    inputs = [TensorSpec("INPUT0", "FP32", [4])]
    outputs = [
        TensorSpec("SCORES", "FP32", [4], labels=["cat", "dog", "bird"]),
        TensorSpec("WIDE", "FP64", [4]),
        TensorSpec("COUNTS", "INT64", [4]),
        TensorSpec("SMALL", "UINT8", [4]),
        TensorSpec("FLAGS", "BOOL", [4]),
        TensorSpec("HALF", "FP16", [4]),
        TensorSpec("TEXT", "BYTES", [4]),
    ]

    def infer(self, inputs, parameters):
        x = inputs["INPUT0"]
        return {
            "SCORES": x,
            "WIDE": x.astype(np.float64),
            "COUNTS": np.round(x * 10).astype(np.int64),
            "SMALL": np.clip(np.round(x * 10), 0, 255).astype(np.uint8),
            "FLAGS": x > 0,
            "HALF": x.astype(np.float16),
            "TEXT": np.array([str(v).encode() for v in x.tolist()], dtype=object),
        }
'''),
    # A model that batches: tensors declared without the batch dimension.
    "batched": ("Batched", '''
from oip.server.model import Model, TensorSpec


class Batched(Model):
    max_batch_size = 4
    inputs = [TensorSpec("INPUT0", "FP32", [3]), TensorSpec("INPUT1", "FP32", [3])]
    outputs = [TensorSpec("OUTPUT0", "FP32", [3], labels=["a", "b", "c"])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"]}
'''),
    # Always answers a batch of one, whatever it was given: a model failure for larger batches.
    "wrong_batch": ("WrongBatch", '''
import numpy as np

from oip.server.model import Model, TensorSpec


class WrongBatch(Model):
    max_batch_size = 4
    inputs = [TensorSpec("INPUT0", "INT32", [2])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [2])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": np.zeros((1, 2), dtype=np.int32)}
'''),
    # Identity, used only by the statistics tests (so its counters are theirs alone).
    "counted": ("Counted", '''
from oip.server.model import Model, TensorSpec


class Counted(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": inputs["INPUT0"]}
'''),
    # Declarations in model.toml (see TOML below); never run.
    "configured": ("Configured", '''
from oip.server.model import Model, TensorSpec


class Configured(Model):
    platform = "onnxruntime_onnx"
    inputs = [TensorSpec("IMAGE", "UINT8", [3, -1, -1]), TensorSpec("NAME", "BYTES", [1])]
    outputs = [TensorSpec("LOGITS", "FP16", [1000])]

    def infer(self, inputs, parameters):
        raise NotImplementedError
'''),
}
TOML = {
    "configured": 'max_batch_size = 8\ndecoupled = true\n'
                  '[dynamic_batching]\nmax_queue_delay_microseconds = 250\npreferred_batch_size = [4, 8]\n',
}
READY = ("simple", "failing", "slow", *MODELS)
MODEL_THREADS = 3  # --model-threads: the instance count the configuration reports for plain infer() models
SCORES = np.array([0.5, 3.3, 2.4, -1.0], dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("extensions")
    repository = build_repository(work / "models", extra=("failing", "slow"), only=("simple",))
    for name, (cls, source) in MODELS.items():
        folder = repository / name
        folder.mkdir()
        (folder / "model.toml").write_text(f'class = "model:{cls}"\n' + TOML.get(name, ""))
        (folder / "model.py").write_text(textwrap.dedent(source))
    with running(repository, work, "--model-threads", str(MODEL_THREADS), ready=READY) as server:
        yield server


def as_rest(message: Message) -> Any:
    """A message's JSON as the REST bodies of these extensions write it: proto field names, every field without
    presence at its default too, 64-bit integers as numbers (proto3 JSON makes them strings)."""
    out = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    return _numbers(out, message)


def _numbers(out: dict[str, Any], message: Message) -> dict[str, Any]:
    wide = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    for field in message.DESCRIPTOR.fields:
        if field.name not in out:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    _numbers(out[field.name][str(key)], item)
        elif field.message_type is not None:
            if field.is_repeated:
                for item, entry in zip(out[field.name], value, strict=True):
                    _numbers(item, entry)
            else:
                _numbers(out[field.name], value)
        elif field.cpp_type in wide:
            out[field.name] = [int(v) for v in out[field.name]] if field.is_repeated else int(out[field.name])
    return out


def _texts(array: Any) -> list[Any]:
    """BYTES output elements as str (tritonclient gives bytes for binary data, str for JSON)."""
    return [v.decode() if isinstance(v, bytes) else v for v in np.asarray(array).reshape(-1).tolist()]


def _stats(http: httpx.Client, path: str) -> dict[str, Any]:
    response = http.get(path)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _counted_body(values: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}


# --- server metadata ---------------------------------------------------------------------------------------------


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


# --- statistics ---------------------------------------------------------------------------------------------------


ZERO = {"count": 0, "ns": 0}
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def test_statistics_count_successes_and_failures(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    before = _stats(http, "/v2/models/counted/stats")["model_stats"]
    assert before == [{
        "name": "counted", "version": "1", "last_inference": 0, "inference_count": 0, "execution_count": 0,
        "inference_stats": dict.fromkeys(DURATIONS, ZERO), "batch_stats": [], "memory_usage": [],
        "response_stats": {},
    }]
    start_ms = time.time_ns() // 1_000_000
    for values in ([1, 2, 3], [4], []):
        assert http.post("/v2/models/counted/infer", json=_counted_body(values)).status_code == 200
    request = pb.ModelInferRequest(model_name="counted")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    request.raw_input_contents.append(np.array([7, 8], dtype="<i4").tobytes())
    for _ in range(2):
        assert grpc_call(stub, "ModelInfer", request)[0] is grpc.StatusCode.OK
    # failures of the model's requests: wrong datatype, unknown output, reserved parameter (REST and gRPC)
    bad = _counted_body([1])
    bad["inputs"][0]["datatype"] = "INT64"
    assert http.post("/v2/models/counted/infer", json=bad).status_code == 400
    assert http.post("/v2/models/counted/infer", json={**_counted_body([1]), "outputs": [{"name": "NOPE"}]}
                     ).status_code == 400
    reserved = pb.ModelInferRequest()
    reserved.CopyFrom(request)
    reserved.parameters["triton_secret"].bool_param = True
    assert grpc_call(stub, "ModelInfer", reserved)[0] is grpc.StatusCode.INVALID_ARGUMENT
    # not the model's: an unknown model or version counts nowhere
    assert http.post("/v2/models/counted/versions/9/infer", json=_counted_body([1])).status_code == 404
    end_ms = time.time_ns() // 1_000_000

    (after,) = _stats(http, "/v2/models/counted/stats")["model_stats"]
    stats = after["inference_stats"]
    assert (after["name"], after["version"]) == ("counted", "1")
    assert stats["success"]["count"] == 5 and stats["fail"]["count"] == 3
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == 5, phase
    assert stats["cache_hit"] == ZERO and stats["cache_miss"] == ZERO
    assert after["inference_count"] == 5 and after["execution_count"] == 5
    assert [b["batch_size"] for b in after["batch_stats"]] == [1]
    batch = after["batch_stats"][0]
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert batch[phase]["count"] == 5 and batch[phase]["ns"] == stats[phase]["ns"], phase
    assert start_ms <= after["last_inference"] <= end_ms
    phases = sum(stats[p]["ns"] for p in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert stats["compute_infer"]["ns"] > 0 and phases <= stats["success"]["ns"]
    assert stats["fail"]["ns"] > 0


def test_statistics_time_the_model(http: httpx.Client) -> None:
    """A model that takes 0.3 s: compute_infer holds it, the other phases do not."""
    body = {**_counted_body([1]), "parameters": {"delay": 0.3}}
    assert http.post("/v2/models/slow/infer", json=body).status_code == 200
    (stats,) = _stats(http, "/v2/models/slow/versions/1/stats")["model_stats"]
    infer = stats["inference_stats"]
    assert infer["compute_infer"]["count"] == 1 and infer["compute_infer"]["ns"] >= 300_000_000
    assert infer["success"]["ns"] >= infer["compute_infer"]["ns"]
    for phase in ("queue", "compute_input", "compute_output"):
        assert infer[phase]["ns"] < 200_000_000, phase


def test_statistics_of_a_failing_model(http: httpx.Client, triton_grpc: grpcclient.InferenceServerClient) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    for _ in range(2):
        assert http.post("/v2/models/failing/infer", json=body).status_code == 500
    stats = triton_grpc.get_inference_statistics("failing").model_stats[0]
    assert stats.inference_stats.fail.count == 2 and stats.inference_stats.fail.ns > 0
    assert stats.inference_stats.success.count == 0 and stats.inference_stats.compute_infer.count == 0
    assert (stats.inference_count, stats.execution_count, stats.last_inference) == (0, 0, 0)


def test_statistics_of_a_batching_model(http: httpx.Client, triton_http: httpclient.InferenceServerClient) -> None:
    def body(rows: int) -> dict[str, Any]:
        data = list(range(rows * 3))
        return {"inputs": [{"name": n, "datatype": "FP32", "shape": [rows, 3], "data": data}
                           for n in ("INPUT0", "INPUT1")]}

    before = triton_http.get_inference_statistics("batched")["model_stats"][0]
    for rows in (3, 2, 3):
        assert http.post("/v2/models/batched/infer", json=body(rows)).status_code == 200
    after = triton_http.get_inference_statistics("batched")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 8
    assert after["execution_count"] - before["execution_count"] == 3
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert {size: count - old.get(size, 0) for size, count in sizes.items()} == {2: 1, 3: 2}


def test_statistics_over_grpc_equal_rest(triton_grpc: grpcclient.InferenceServerClient,
                                         stub: pb_grpc.GRPCInferenceServiceStub, http: httpx.Client) -> None:
    assert http.post("/v2/models/counted/infer", json=_counted_body([5])).status_code == 200
    for name, version, path in (("", "", "/v2/models/stats"), ("counted", "", "/v2/models/counted/stats"),
                                ("counted", "1", "/v2/models/counted/versions/1/stats")):
        reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=name, version=version), timeout=30)
        assert _stats(http, path) == as_rest(reply), path
    tc = triton_grpc.get_inference_statistics("counted").model_stats
    assert len(tc) == 1 and tc[0].name == "counted" and tc[0].inference_stats.success.count >= 1


def test_statistics_of_every_model(triton_http: httpclient.InferenceServerClient) -> None:
    stats = triton_http.get_inference_statistics()["model_stats"]
    assert sorted((s["name"], s["version"]) for s in stats) == sorted((name, "1") for name in READY)
    for entry in stats:
        assert set(entry["inference_stats"]) == set(DURATIONS)
        assert all(set(d) == {"count", "ns"} for d in entry["inference_stats"].values())


@pytest.mark.parametrize(("path", "request_", "status", "code"), [
    ("/v2/models/nope/stats", pb.ModelStatisticsRequest(name="nope"), 404, grpc.StatusCode.NOT_FOUND),
    ("/v2/models/counted/versions/2/stats", pb.ModelStatisticsRequest(name="counted", version="2"), 404,
     grpc.StatusCode.NOT_FOUND),
])
def test_statistics_errors(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, path: str,
                           request_: pb.ModelStatisticsRequest, status: int, code: grpc.StatusCode) -> None:
    assert_error_body(http.get(path), status)
    assert grpc_call(stub, "ModelStatistics", request_)[0] is code
    assert_error_body(http.delete("/v2/models/stats"), 405)
    code, _ = grpc_call(stub, "ModelStatistics", pb.ModelStatisticsRequest(version="1"))  # a version needs a name
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    check_simple(http, stub)


# --- classification -----------------------------------------------------------------------------------------------


def _scores_http(outputs: list[httpclient.InferRequestedOutput], data: Any = SCORES) -> Any:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.asarray(data, dtype=np.float32))
    return tensor, outputs


@pytest.mark.parametrize("binary", [True, False])
def test_classification_over_http(triton_http: httpclient.InferenceServerClient, binary: bool) -> None:
    tensor, outputs = _scores_http([
        httpclient.InferRequestedOutput("SCORES", binary_data=binary, class_count=2),
        httpclient.InferRequestedOutput("WIDE", binary_data=binary, class_count=3),
        httpclient.InferRequestedOutput("COUNTS", binary_data=binary, class_count=10),  # more than there are
        httpclient.InferRequestedOutput("SMALL", binary_data=binary, class_count=1),
        httpclient.InferRequestedOutput("FLAGS", binary_data=binary),  # no classification: the tensor itself
    ])
    result = triton_http.infer("scores", [tensor], outputs=outputs)
    # Triton's formatting (C++ std::to_string): floats with six decimals, integers as integers; labels by index
    assert _texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird"]
    assert _texts(result.as_numpy("WIDE")) == ["3.300000:1", "2.400000:2", "0.500000:0"]
    assert _texts(result.as_numpy("COUNTS")) == ["33:1", "24:2", "5:0", "-10:3"]
    assert _texts(result.as_numpy("SMALL")) == ["33:1"]
    response = result.get_response()
    shapes = {o["name"]: (o["datatype"], o["shape"]) for o in response["outputs"]}
    assert shapes == {"SCORES": ("BYTES", [2]), "WIDE": ("BYTES", [3]), "COUNTS": ("BYTES", [4]),
                      "SMALL": ("BYTES", [1]), "FLAGS": ("BOOL", [4])}
    assert result.as_numpy("FLAGS").tolist() == [True, True, True, False]


def test_classification_over_grpc(triton_grpc: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(SCORES)
    outputs = [grpcclient.InferRequestedOutput("SCORES", class_count=3), grpcclient.InferRequestedOutput("COUNTS")]
    result = triton_grpc.infer("scores", [tensor], outputs=outputs)
    assert _texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird", "0.500000:0:cat"]
    assert result.as_numpy("COUNTS").tolist() == [5, 33, 24, -10]
    output = result.get_output("SCORES")
    assert (output.datatype, list(output.shape)) == ("BYTES", [3])


def test_classification_rest_equals_grpc(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 3.0, 3.0, 2.0]}],
            "outputs": [{"name": "SCORES", "parameters": {"classification": 4}}]}
    rest = http.post("/v2/models/scores/infer", json=body).json()["outputs"][0]
    # ties keep the lower index first; the fourth label is missing, so that entry has none
    assert rest == {"name": "SCORES", "datatype": "BYTES", "shape": [4],
                    "data": ["3.000000:1:dog", "3.000000:2:bird", "2.000000:3", "1.000000:0:cat"]}
    request = pb.ModelInferRequest(model_name="scores")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.raw_input_contents.append(np.array([1.0, 3.0, 3.0, 2.0], dtype="<f4").tobytes())
    request.outputs.add(name="SCORES").parameters["classification"].int64_param = 4
    reply = stub.ModelInfer(request, timeout=30)
    assert (reply.outputs[0].datatype, list(reply.outputs[0].shape)) == ("BYTES", [4])
    raw = reply.raw_output_contents[0]
    items, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset:offset + 4], "little")
        items.append(raw[offset + 4:offset + 4 + size].decode())
        offset += 4 + size
    assert items == rest["data"]


def test_classification_of_a_batching_model(triton_http: httpclient.InferenceServerClient) -> None:
    inputs = [httpclient.InferInput(name, [2, 3], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.array([[1, 3, 2], [5, 4, 6]], dtype=np.float32))
    inputs[1].set_data_from_numpy(np.zeros((2, 3), dtype=np.float32))
    result = triton_http.infer("batched", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 2)  # [batch, k]
    assert [_texts(row) for row in classes] == [["3.000000:1:b", "2.000000:2:c"], ["6.000000:2:c", "5.000000:0:a"]]


@pytest.mark.parametrize(("output", "value", "message"), [
    ("FLAGS", 2, "unsupported type 'BOOL'"),
    ("HALF", 2, "unsupported type 'FP16'"),
    ("TEXT", 2, "unsupported type 'BYTES'"),
    ("SCORES", "2", "expected an integer"),
    ("SCORES", 2.5, "expected an integer"),
    ("SCORES", True, "expected an integer"),
    ("SCORES", -1, "expected >= 0"),
])
def test_classification_errors(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, output: str, value: Any,
                               message: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
            "outputs": [{"name": output, "parameters": {"classification": value}}]}
    assert message in assert_error_body(http.post("/v2/models/scores/infer", json=body), 400)
    request = pb.ModelInferRequest(model_name="scores")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.raw_input_contents.append(SCORES.astype("<f4").tobytes())
    param = request.outputs.add(name=output).parameters["classification"]
    case = {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
    setattr(param, case, value)
    code, error = grpc_call(stub, "ModelInfer", request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
    check_simple(http, stub)


def test_classification_zero_means_none(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
            "outputs": [{"name": "COUNTS", "parameters": {"classification": 0}}]}
    output = http.post("/v2/models/scores/infer", json=body).json()["outputs"][0]
    assert (output["datatype"], output["data"]) == ("INT64", [5, 33, 24, -10])


# --- reserved parameters and the batching convention --------------------------------------------------------------


@pytest.mark.parametrize(("where", "parameters", "message"), [
    ("request", {"triton_secret": 1}, "reserved"),
    ("request", {"binary_data_output": "yes"}, "binary_data_output"),
    ("request", {"triton_enable_empty_final_response": "yes"}, "triton_enable_empty_final_response"),
    ("output", {"binary_data": 1}, "binary_data"),
    ("input", {"binary_data_size": "8"}, "binary_data_size"),
])
def test_reserved_parameters_of_the_wrong_type(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, where: str,
                                               parameters: dict[str, Any], message: str) -> None:
    body: dict[str, Any] = _counted_body([1, 2])
    if where == "request":
        body["parameters"] = parameters
    elif where == "output":
        body["outputs"] = [{"name": "OUTPUT0", "parameters": parameters}]
    else:
        body["inputs"][0]["parameters"] = parameters
    assert message in assert_error_body(http.post("/v2/models/counted/infer", json=body), 400)
    check_simple(http, stub)


def test_reserved_parameters_over_grpc(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    def call(key: str, case: str, value: Any) -> grpc.StatusCode:
        request = pb.ModelInferRequest(model_name="counted")
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([1], dtype="<i4").tobytes())
        setattr(request.parameters[key], case, value)
        return grpc_call(stub, "ModelInfer", request)[0]

    assert call("triton_anything", "string_param", "x") is grpc.StatusCode.INVALID_ARGUMENT
    assert call("triton_enable_empty_final_response", "bool_param", True) is grpc.StatusCode.OK  # allow-listed
    assert call("binary_data_output", "string_param", "x") is grpc.StatusCode.INVALID_ARGUMENT
    assert call("custom", "string_param", "x") is grpc.StatusCode.OK


def test_allowed_reserved_parameter_over_rest(http: httpx.Client) -> None:
    parameters = {"triton_enable_empty_final_response": True, "binary_data_output": False}
    body = {**_counted_body([3]), "parameters": parameters}
    response = http.post("/v2/models/counted/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [3]


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


# --- the data plane directly ---------------------------------------------------------------------------------------


def _run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


class Echo(Model):
    name = "echo"
    inputs = (TensorSpec("INPUT0", "INT32", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "INT32", [-1]),)

    def infer(self, inputs: Any, parameters: Any) -> Any:
        return {"OUTPUT0": inputs["INPUT0"]}


def test_disabled_extensions_are_unimplemented() -> None:
    async def scenario() -> None:
        repository = ModelRepository()
        repository.add(Echo())
        await repository.load_all()
        dp = DataPlane(repository, Settings(extensions=["model_repository", "binary_tensor_data", "parameters"]))
        with pytest.raises(Unimplemented):
            await dp.model_config(pb.ModelConfigRequest(name="echo"))
        with pytest.raises(Unimplemented):
            await dp.model_statistics(pb.ModelStatisticsRequest())
        tensor = Tensor("INPUT0", "INT32", [2], np.array([1, 2], dtype=np.int32))
        with pytest.raises(Unimplemented):
            await dp.model_infer(InferRequest("echo", inputs=[tensor],
                                              outputs=[RequestedOutput("OUTPUT0", {"classification": 1})]))
        # without classification the request runs, and is counted (statistics are kept, only not served)
        await dp.model_infer(InferRequest("echo", inputs=[tensor]))
        assert dp.statistics.for_model("echo", "1").success.count == 1

    _run(scenario())


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

    states = _run(scenario())
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


@pytest.mark.parametrize(("datatype", "values", "expected"), [
    ("FP32", [0.1, -2.5, 1e-7], ["0.100000:0", "0.000000:2", "-2.500000:1"]),
    ("FP64", [1e20, 3.0], ["100000000000000000000.000000:0", "3.000000:1"]),
    ("UINT64", [2**64 - 1, 0], ["18446744073709551615:0", "0:1"]),
    ("INT8", [-128, -5], ["-5:1", "-128:0"]),
    ("INT32", [7, 7, 7], ["7:0", "7:1", "7:2"]),
])
def test_classification_formatting(datatype: str, values: list[Any], expected: list[str]) -> None:
    spec = TensorSpec("OUT", datatype, [-1])
    model = Model("m", outputs=[spec])
    array = np.array(values, dtype=codec.dtype_of(datatype))
    tensor = classify(model, spec, Tensor("OUT", datatype, [len(values)], array), 5)
    assert (tensor.datatype, tensor.shape) == ("BYTES", [len(values)])
    assert [v.decode() for v in tensor.data.tolist()] == expected  # type: ignore[union-attr]


def test_classification_limit() -> None:
    spec = TensorSpec("OUT", "UINT8", [-1])
    with pytest.raises(InvalidRequest, match="too large"):
        big = Tensor("OUT", "UINT8", [1_000_001], np.zeros(1_000_001, np.uint8))
        classify(Model("m", outputs=[spec]), spec, big, 1)


# --- the generated clients ----------------------------------------------------------------------------------------


def test_generated_clients(server: Server, http: httpx.Client) -> None:
    """oip.client's REST and gRPC clients: model_config, model_statistics and classification, the same over both."""
    from oip.client import errors as client_errors
    from oip.client.grpc import GrpcClient
    from oip.client.rest import RestClient
    from oip.client.tensors import RequestedOutput as ClientOutput

    with RestClient(server.url, trust_env=False) as rest, GrpcClient(server.target) as grpc_client:
        for client in (rest, grpc_client):
            config = client.model_config("batched")
            assert (config.name, config.max_batch_size) == ("batched", 4)
            assert [(t.name, t.dims) for t in config.input or []] == [("INPUT0", [3]), ("INPUT1", [3])]
            assert config.model_transaction_policy is not None and config.model_transaction_policy.decoupled is False
            with pytest.raises(client_errors.NotFound):
                client.model_config("nope")
        assert rest.model_config("simple", "1") == grpc_client.model_config("simple", "1")

        assert http.post("/v2/models/counted/infer", json=_counted_body([1])).status_code == 200
        rest_stats = rest.model_statistics("counted")
        assert rest_stats == grpc_client.model_statistics("counted")
        (entry,) = rest_stats.model_stats
        assert entry.name == "counted" and entry.inference_stats is not None
        assert entry.inference_stats.success is not None and (entry.inference_stats.success.count or 0) >= 1
        every = {(s.name, s.version) for s in grpc_client.model_statistics().model_stats}
        assert every == {(name, "1") for name in READY}
        with pytest.raises(client_errors.NotFound):
            rest.model_statistics("nope")

        outputs = [ClientOutput("SCORES", parameters={"classification": 2})]
        for client in (rest, grpc_client):
            result = client.infer("scores", {"INPUT0": SCORES}, outputs=outputs)
            assert _texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird"]
            with pytest.raises(client_errors.InvalidArgument, match="unsupported type 'BOOL'"):
                client.infer("scores", {"INPUT0": SCORES}, outputs=[ClientOutput("FLAGS", {"classification": 1})])


def test_extensions_through_the_generated_clients(server: Server) -> None:
    """Model configuration, statistics and classification, as the generated clients give them."""
    from oip.client import GrpcClient, RequestedOutput, RestClient

    with RestClient(server.url) as rest, GrpcClient(server.target) as grpc_client:
        for client in (rest, grpc_client):
            config = client.model_config("scores")
            assert config.name == "scores" and [i.name for i in config.input or []] == ["INPUT0"]
            result = client.infer("scores", {"INPUT0": SCORES},
                                  [RequestedOutput("SCORES", {"classification": 2}), "COUNTS"])
            assert [x.decode() for x in result.as_numpy("SCORES").tolist()] == ["3.300000:1:dog", "2.400000:2:bird"]
            assert result.as_numpy("COUNTS").tolist() == [5, 33, 24, -10]
            stats = client.model_statistics("scores").model_stats
            assert [s.name for s in stats] == ["scores"] and (stats[0].inference_count or 0) >= 1
        assert rest.model_config("scores") == grpc_client.model_config("scores")
