"""Prometheus metrics of the generated server, as served (read with Prometheus' own parser).

Triton's nv_inference_* counters agree exactly with the statistics extension for the same model and version
(durations: the statistics' ns // 1000), failures carry Triton's reason, a batch of n counts n inferences, a
decoupled model's first response is timed, requests are counted per transport, operation and answer, and a model's
own metrics come out with its labels; the process's own metrics, the separate metrics listener (the same registry
as /metrics on the REST port), and `--metrics off`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from observe_models import access_lines, fp32_body, observed_repository
from oip.grpc import grpc_service_pb2 as pb
from serving import (
    TIMEOUT,
    Server,
    assert_error_body,
    requests_answered,
    resident_bytes,
    scrape,
    simple_body,
    simple_grpc_request,
    start_server,
    value,
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return observed_repository(tmp_path_factory.mktemp("observability") / "models")


@pytest.fixture(scope="module")
def metered(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Metrics on (the default), with the histogram's buckets chosen, a separate metrics listener, access log."""
    server = start_server(repository, tmp_path_factory.mktemp("metered"), "--metrics-buckets", "0.002,0.5,0.001",
                          "--metrics-port", "0", "--access-log", "--log-format", "json",
                          ready=("simple", "batched", "words", "counting"))
    yield server
    assert server.stop() == 0, server.log_text()


def test_triton_counters_agree_with_statistics(metered: Server) -> None:
    with metered.clients() as (http, stub):
        for _ in range(5):
            assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
            stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT)
        bad = simple_body()
        bad["inputs"][0]["datatype"] = "FP32"
        for _ in range(3):  # refused by validation: REJECTED
            assert_error_body(http.post("/v2/models/simple/infer", json=bad), 400)
        stats = http.get("/v2/models/simple/versions/1/stats").json()["model_stats"][0]
    samples = scrape(metered.url)
    labels = {"model": "simple", "version": "1"}
    success = stats["inference_stats"]["success"]["count"]
    assert value(samples, "nv_inference_request_success", **labels) == success == 10
    assert value(samples, "nv_inference_count", **labels) == stats["inference_count"] == 10
    assert value(samples, "nv_inference_exec_count", **labels) == stats["execution_count"] == 10
    for metric, phase in (("request", "success"), ("queue", "queue"), ("compute_input", "compute_input"),
                          ("compute_infer", "compute_infer"), ("compute_output", "compute_output")):
        us = value(samples, f"nv_inference_{metric}_duration_us", **labels)
        assert us == stats["inference_stats"][phase]["ns"] // 1000 and us > 0, (metric, us, stats)
    failures = {reason: value(samples, "nv_inference_request_failure", **labels, reason=reason)
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert failures == {"REJECTED": 3, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert sum(failures.values()) == stats["inference_stats"]["fail"]["count"]
    assert value(samples, "nv_inference_pending_request_count", **labels) == 0


def test_model_failures_are_backend_and_a_batch_counts_its_size(metered: Server) -> None:
    with metered.http_client() as http:
        assert http.post("/v2/repository/models/broken_math/load").status_code == 200
        assert_error_body(http.post("/v2/models/broken_math/infer", json=fp32_body([1, 2])), 500)
        answer = http.post("/v2/models/batched/infer", json=fp32_body([1, 2, 3, 4, 5, 6], [3, 2]))
        assert answer.status_code == 200, answer.text
        stats = http.get("/v2/models/batched/stats").json()["model_stats"][0]
    samples = scrape(metered.url)
    assert value(samples, "nv_inference_request_failure", model="broken_math", version="1", reason="BACKEND") == 1
    assert value(samples, "nv_inference_count", model="batched", version="1") == stats["inference_count"] == 3
    assert value(samples, "nv_inference_exec_count", model="batched", version="1") == 1


def test_histograms_and_requests_by_transport(metered: Server) -> None:
    before = scrape(metered.url)
    with metered.clients() as (http, stub):
        assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
        assert http.post("/v2/models/nope/infer", json=simple_body()).status_code == 404
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(pb.ModelInferRequest(model_name="nope"), timeout=TIMEOUT)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT)
    after = scrape(metered.url)

    assert requests_answered(before, after, transport="rest", operation="model_infer", code="200") == 1
    assert requests_answered(before, after, transport="rest", operation="model_infer", code="404") == 1
    assert requests_answered(before, after, transport="grpc", operation="ModelInfer", code="NOT_FOUND") == 1
    assert requests_answered(before, after, transport="grpc", operation="ServerLive", code="OK") == 1
    # The buckets asked for, sorted, and +Inf; cumulative counts ending at the count.
    buckets = after["nv_inference_request_duration_seconds_bucket"]
    bounds = sorted(dict(key)["le"] for key in buckets if dict(key)["model"] == "simple")
    assert bounds == sorted(["0.001", "0.002", "0.5", "+Inf"])
    count = value(after, "nv_inference_request_duration_seconds_count", model="simple", version="1")
    assert value(after, "nv_inference_request_duration_seconds_bucket", model="simple", version="1", le="+Inf") == count
    assert count == value(after, "nv_inference_request_success", model="simple", version="1")


def test_time_to_first_response_of_a_decoupled_model(metered: Server) -> None:
    import tritonclient.grpc as grpcclient

    results: list[Any] = []
    client = grpcclient.InferenceServerClient(metered.target)
    try:
        client.start_stream(callback=lambda result, error: results.append(error or result))
        tensor = grpcclient.InferInput("TEXT", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"one two three"], dtype=object))
        client.async_stream_infer("words", [tensor])
        deadline = time.monotonic() + TIMEOUT
        while len(results) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        client.stop_stream()
        client.close()
    assert [r.as_numpy("WORD")[0] for r in results] == [b"one", b"two", b"three"]
    samples = scrape(metered.url)
    assert value(samples, "nv_inference_first_response_histogram_ms_count", model="words", version="1") == 1
    bounds = {dict(k)["le"] for k in samples["nv_inference_first_response_histogram_ms_bucket"]}
    assert bounds == {"1.0", "2.0", "500.0", "+Inf"}  # the seconds' bounds, in milliseconds (as Go writes floats)


def test_a_model_exports_its_own_metrics(metered: Server) -> None:
    with metered.http_client() as http:
        answer = http.post("/v2/models/counting/infer", json=fp32_body([1.5, -2.0]))
        assert answer.status_code == 200, answer.text
        http.post("/v2/models/counting/infer", json=fp32_body([3.0, 4.0]))
    samples = scrape(metered.url)
    labels = {"model": "counting", "version": "1"}
    assert value(samples, "counting_values_total", **labels, sign="positive") == 3
    assert value(samples, "counting_values_total", **labels, sign="other") == 1
    assert value(samples, "counting_last_sum", **labels) == 7.0
    assert samples["counting_busy"] == {tuple(sorted(labels.items())): 0}
    assert value(samples, "counting_request_values_bucket", **labels, le="1.0") == 0
    assert value(samples, "counting_request_values_bucket", **labels, le="2.0") == 2
    assert value(samples, "counting_request_values_sum", **labels) == 4
    assert not [name for name in samples if name.endswith("_created")]  # Triton's exposition has none


def test_the_process_metrics(metered: Server) -> None:
    samples = scrape(metered.url)
    rss = resident_bytes(metered.process.pid)
    assert 0.7 * rss < value(samples, "process_resident_memory_bytes") < 1.3 * rss
    assert value(samples, "process_cpu_seconds_total") > 0
    started = value(samples, "process_start_time_seconds")
    assert time.time() - 600 < started <= time.time()
    assert value(samples, "process_open_fds") > 0
    (info,) = samples["python_info"].values()
    assert info == 1
    assert samples["python_gc_collections_total"]


def test_the_separate_metrics_listener_and_the_access_log(metered: Server) -> None:
    ports = json.loads((metered.log.parent / "ports.json").read_text())
    assert httpx.get(f"http://127.0.0.1:{ports['metrics']}/v2/health/live", trust_env=False).status_code == 404
    with metered.clients() as (http, stub):
        http.post("/v2/models/simple/infer", json=simple_body(id="logged-rest"))
        request = simple_grpc_request()
        request.id = "logged-grpc"
        stub.ModelInfer(request, timeout=TIMEOUT)
    rest, grpc_line = access_lines(metered, "logged-rest", "logged-grpc")
    assert rest["transport"] == "rest" and rest["status"] == 200 and rest["path"] == "/v2/models/simple/infer"
    assert rest["request_bytes"] > 0 and rest["response_bytes"] > 0 and rest["duration_ms"] > 0
    assert grpc_line["transport"] == "grpc" and grpc_line["status"] == "OK" and grpc_line["operation"] == "ModelInfer"
    assert grpc_line["request_bytes"] == request.ByteSize() and grpc_line["response_bytes"] > 0
    # The separate listener serves the same registry as /metrics on the REST port: every sample of the server's
    # own and of the models' (the requests counted too, logged above: a scrape of the separate listener is no
    # request of the REST port, and one of the REST port is counted once answered).
    separate = scrape(f"http://127.0.0.1:{ports['metrics']}")
    served = scrape(metered.url)
    assert separate["nv_inference_request_success"][(("model", "simple"), ("version", "1"))] >= 2
    unchanging = {n for n in served if not n.startswith(("process_", "python_gc_"))}  # the process's own move on
    assert {n: separate.get(n) for n in unchanging} == {n: served[n] for n in unchanging}
    assert set(separate) == set(served)


def test_metrics_off(repository: Path, tmp_path: Path) -> None:
    server = start_server(repository, tmp_path, "--metrics", "off", ready=("simple",))
    try:
        with server.http_client() as http:
            assert_error_body(http.get("/metrics"), 404)
            assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
    finally:
        assert server.stop() == 0, server.log_text()
