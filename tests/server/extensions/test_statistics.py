"""Triton's statistics extension against the generated server: successes, failures and their times per model and
version, a batching model's executions, the same over REST and gRPC (tritonclient's get_inference_statistics), and
its errors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from extension_models import READY, as_rest, counted_body, serve_models
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import Server, assert_error_body, check_simple, grpc_call


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


def _stats(http: httpx.Client, path: str) -> dict[str, Any]:
    response = http.get(path)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


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
        assert http.post("/v2/models/counted/infer", json=counted_body(values)).status_code == 200
    request = pb.ModelInferRequest(model_name="counted")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    request.raw_input_contents.append(np.array([7, 8], dtype="<i4").tobytes())
    for _ in range(2):
        assert grpc_call(stub, "ModelInfer", request)[0] is grpc.StatusCode.OK
    # failures of the model's requests: wrong datatype, unknown output, reserved parameter (REST and gRPC)
    bad = counted_body([1])
    bad["inputs"][0]["datatype"] = "INT64"
    assert http.post("/v2/models/counted/infer", json=bad).status_code == 400
    assert http.post("/v2/models/counted/infer", json={**counted_body([1]), "outputs": [{"name": "NOPE"}]}
                     ).status_code == 400
    reserved = pb.ModelInferRequest()
    reserved.CopyFrom(request)
    reserved.parameters["triton_secret"].bool_param = True
    assert grpc_call(stub, "ModelInfer", reserved)[0] is grpc.StatusCode.INVALID_ARGUMENT
    # not the model's: an unknown model or version counts nowhere
    assert http.post("/v2/models/counted/versions/9/infer", json=counted_body([1])).status_code == 404
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
    body = {**counted_body([1]), "parameters": {"delay": 0.3}}
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
    assert http.post("/v2/models/counted/infer", json=counted_body([5])).status_code == 200
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


def test_a_phase_timed_across_threads_never_counts_below_zero() -> None:
    """Two threads' readings of the clock may cross: a phase that comes out negative counts as no time."""
    from oip.server.observe.statistics import ModelStats

    stats = ModelStats("m", "1")
    stats.record_alone(-5, 10, 20, -3, 30)  # queue, compute input, infer and output, the total
    stats.record_request(True, 2, 7, -1, -2, 4, -9)  # success, batch size, then the same five
    assert (stats.queue.ns, stats.compute_input.ns, stats.compute_infer.ns, stats.compute_output.ns,
            stats.success.ns) == (7, 10, 20, 4, 30)
    assert (stats.success.count, stats.queue.count, stats.inference_count, stats.execution_count) == (2, 2, 3, 1)
    run = stats.batches[1]
    assert (run.compute_input.ns, run.compute_infer.ns, run.compute_output.ns) == (10, 20, 0)
