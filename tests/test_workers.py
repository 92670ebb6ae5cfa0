"""`serve --workers 2`: two server processes on the same ports under one supervisor.

How a test knows which worker answered: with `--log-format json --access-log` every REST request is logged with
the process id of the worker that served it, and the ports file lists the workers' pids. Requests over many new
connections must be served by both. Control-plane operations (repository load and unload, shared memory) made
over one connection must hold on every connection; statistics are the sum over the workers; a worker killed with
SIGKILL is replaced and the server keeps answering; SIGTERM drains both and the supervisor exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import (
    SIMPLE_A,
    SIMPLE_B,
    TIMEOUT,
    Server,
    build_repository,
    check_simple,
    simple_body,
    simple_grpc_request,
    start_server,
)

WORKERS = 2
CONNECTIONS = 40  # new connections per check: with two workers, both are all but certain to get some
SUMS = [a + b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("workers")
    repository = build_repository(root / "models", only=("simple", "identity_fp32"))
    server = start_server(repository, root / "run", "--workers", str(WORKERS), "--log-format", "json",
                          "--access-log", ready=("simple", "identity_fp32"))
    yield server
    if server.process.poll() is None:
        assert server.stop() == 0, server.log_text()


def worker_pids(server: Server) -> list[int]:
    ports = json.loads((server.log.parent / "ports.json").read_text())
    pids = ports["workers"]
    assert len(pids) == WORKERS and all(isinstance(p, int) for p in pids), ports
    return [int(p) for p in pids]


def answers_by_worker(server: Server, since: int) -> dict[int, dict[int, int]]:
    """Per worker pid, its logged REST inference answers after byte `since` of the log, by HTTP status."""
    counts: dict[int, dict[int, int]] = {}
    for line in server.log.read_bytes()[since:].decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        access = entry.get("logger") == "oip.access" and entry.get("transport") == "rest"
        if access and "/infer" in entry.get("path", ""):
            by_status = counts.setdefault(entry["pid"], {})
            by_status[entry["status"]] = by_status.get(entry["status"], 0) + 1
    return counts


def served_by(server: Server, since: int) -> dict[int, int]:
    """Per worker pid, how many REST inference requests it logged after byte `since` of the log."""
    return {pid: sum(by_status.values()) for pid, by_status in answers_by_worker(server, since).items()}


def infer_on_new_connections(server: Server, count: int, model: str = "simple", **body: Any) -> list[httpx.Response]:
    answers = []
    for _ in range(count):
        with server.http_client() as http:  # one connection each: the kernel picks the worker
            answers.append(http.post(f"/v2/models/{model}/infer", json=body or simple_body()))
    return answers


def log_size(server: Server) -> int:
    return server.log.stat().st_size


def wait_for_log(server: Server, since: int, count: int) -> None:
    """The access log is written after the answer: wait, bounded, until `count` infer lines are there."""
    deadline = time.monotonic() + TIMEOUT
    while sum(served_by(server, since).values()) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_requests_over_many_connections_reach_every_worker(cluster: Server) -> None:
    pids = worker_pids(cluster)
    since = log_size(cluster)
    answers = infer_on_new_connections(cluster, CONNECTIONS)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    assert all(a.json()["outputs"][0]["data"] == SUMS for a in answers)
    wait_for_log(cluster, since, CONNECTIONS)
    counts = served_by(cluster, since)
    assert sum(counts.values()) == CONNECTIONS, counts
    assert set(counts) == set(pids), (counts, pids)  # both workers served, and only the workers


def test_statistics_are_the_sum_over_workers(cluster: Server) -> None:
    with cluster.http_client() as http:
        before = http.get("/v2/models/identity_fp32/stats").json()["model_stats"][0]
    since = log_size(cluster)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}]}
    answers = infer_on_new_connections(cluster, CONNECTIONS, model="identity_fp32", **body)
    assert all(a.status_code == 200 for a in answers)
    wait_for_log(cluster, since, CONNECTIONS)
    assert len(served_by(cluster, since)) == WORKERS
    for _ in range(3):  # any worker may answer the statistics: each must give the sum
        with cluster.http_client() as http:
            after = http.get("/v2/models/identity_fp32/stats").json()["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == CONNECTIONS
        assert after["execution_count"] - before["execution_count"] == CONNECTIONS
        success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        assert success == CONNECTIONS
    with cluster.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name="identity_fp32"), timeout=TIMEOUT)
    assert reply.model_stats[0].inference_count - before["inference_count"] == CONNECTIONS


def test_unload_and_load_reach_every_worker(cluster: Server) -> None:
    with cluster.http_client() as http:
        assert http.post("/v2/repository/models/simple/unload").status_code == 200
    answers = infer_on_new_connections(cluster, CONNECTIONS)
    assert {a.status_code for a in answers} <= {400, 404, 503} and all("error" in a.json() for a in answers)
    for _ in range(10):
        with cluster.http_client() as http:
            assert http.get("/v2/models/simple/ready").status_code != 200
    with cluster.channel() as channel:  # gRPC connections too
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="simple"), timeout=TIMEOUT) == \
            pb.RepositoryModelLoadResponse()
    answers = infer_on_new_connections(cluster, CONNECTIONS)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no POSIX shared memory (/dev/shm) on this host")
def test_a_region_registered_on_one_connection_serves_every_connection(cluster: Server) -> None:
    import tritonclient.utils.shared_memory as shm

    key, size = f"/oip_workers_{os.getpid()}", 2 * 16 * 4
    handle = shm.create_shared_memory_region("in", key, size)
    try:
        shm.set_shared_memory_region(handle, [np.array(SIMPLE_A, dtype=np.int32), np.array(SIMPLE_B, dtype=np.int32)])
        with cluster.http_client() as http:
            response = http.post("/v2/systemsharedmemory/region/in/register", json={"key": key, "byte_size": size})
            assert response.status_code == 200, response.text
        body = {"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
             "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
             "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64,
                            "shared_memory_offset": 64}}]}
        since = log_size(cluster)
        answers = infer_on_new_connections(cluster, CONNECTIONS, **body)
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        assert all(a.json()["outputs"][0]["data"] == SUMS for a in answers)
        wait_for_log(cluster, since, CONNECTIONS)
        assert len(served_by(cluster, since)) == WORKERS
        with cluster.http_client() as http:
            assert http.post("/v2/systemsharedmemory/region/in/unregister").status_code == 200
        for _ in range(10):
            with cluster.http_client() as http:
                assert http.get("/v2/systemsharedmemory/status").json() == []
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_killed_worker_is_replaced_and_the_server_keeps_answering(cluster: Server) -> None:
    with cluster.http_client() as http:  # state the replacement must copy
        assert http.post("/v2/repository/models/identity_fp32/unload").status_code == 200
    victim = worker_pids(cluster)[0]
    os.kill(victim, signal.SIGKILL)
    failures = 0
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        try:
            answers = infer_on_new_connections(cluster, 1)
            assert answers[0].status_code == 200 and answers[0].json()["outputs"][0]["data"] == SUMS
        except httpx.TransportError:
            failures += 1  # a connection the dying worker had accepted
        pids = worker_pids(cluster)
        if victim not in pids and len(set(pids)) == WORKERS:
            break
        time.sleep(0.05)
    pids = worker_pids(cluster)
    assert victim not in pids, cluster.log_tail()
    assert failures <= 2, failures
    assert "exited with signal SIGKILL; starting it again" in cluster.log_text()
    # The replacement serves, and copied the control-plane state: identity_fp32 stays unloaded everywhere.
    since = log_size(cluster)
    answers = infer_on_new_connections(cluster, CONNECTIONS)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    wait_for_log(cluster, since, CONNECTIONS)
    assert set(served_by(cluster, since)) == set(pids)
    for _ in range(10):
        with cluster.http_client() as http:
            assert http.get("/v2/models/identity_fp32/ready").status_code != 200
    with cluster.http_client() as http:
        assert http.post("/v2/repository/models/identity_fp32/load").status_code == 200
    with cluster.clients() as (http, stub):
        check_simple(http, stub)


def test_sigterm_drains_every_worker_and_exits_zero(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS), ready=("simple",))
    pids = worker_pids(server)
    with server.channel() as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(simple_grpc_request(), timeout=TIMEOUT)
        assert len(reply.raw_output_contents) == 2
    assert server.stop() == 0, server.log_text()
    for pid in pids:  # no worker outlives the supervisor
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_metrics_are_the_sum_over_workers(cluster: Server) -> None:
    """Every nv_* sample of a scrape, whichever worker answers it, is the sum of what each worker served (from the
    access log, which names the worker of each answer), failures included; durations agree with the statistics
    (summed by another path), within the microsecond each worker rounds away."""
    from test_observability import count_before, resident_bytes, scrape, value

    labels = {"model": "simple", "version": "1"}
    reasons = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    before = scrape(cluster.url)
    with cluster.http_client() as http:
        stats_before = http.get("/v2/models/simple/stats").json()["model_stats"][0]
    since = log_size(cluster)
    bad = simple_body()
    bad["inputs"][0]["datatype"] = "FP32"  # refused by validation: REJECTED
    answers = infer_on_new_connections(cluster, CONNECTIONS) + infer_on_new_connections(cluster, CONNECTIONS, **bad)
    assert [a.status_code for a in answers] == [200] * CONNECTIONS + [400] * CONNECTIONS
    wait_for_log(cluster, since, 2 * CONNECTIONS)
    per_worker = answers_by_worker(cluster, since)
    # Each worker served successes and failures: a sum differs from any one worker's count, and from the largest.
    assert len(per_worker) == WORKERS and all(n.get(200) and n.get(400) for n in per_worker.values()), per_worker
    successes = sum(n.get(200, 0) for n in per_worker.values())
    rejected = sum(n.get(400, 0) for n in per_worker.values())
    assert (successes, rejected) == (CONNECTIONS, CONNECTIONS)
    for _ in range(3):  # whichever worker answers the scrape
        with cluster.http_client() as http:
            stats = http.get("/v2/models/simple/stats").json()["model_stats"][0]
        samples = scrape(cluster.url)

        def delta(name: str, now: dict[str, Any] = samples, **more: str) -> float:
            # The latency histogram has samples from a version's first success on; Triton's counters from its load.
            earlier = count_before if name.startswith("nv_inference_request_duration_seconds") else value
            return value(now, name, **labels, **more) - earlier(before, name, **labels, **more)

        def stats_delta(phase: str, now: dict[str, Any] = stats) -> int:
            return int(now["inference_stats"][phase]["ns"]) - int(stats_before["inference_stats"][phase]["ns"])

        checked = {"nv_inference_request_success": successes, "nv_inference_count": successes,
                   "nv_inference_exec_count": successes, "nv_inference_request_duration_seconds_count": successes}
        for name, expected in checked.items():
            assert delta(name) == expected, (name, delta(name), per_worker)
        failures = {reason: delta("nv_inference_request_failure", reason=reason) for reason in reasons}
        assert failures == {"REJECTED": rejected, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}, (failures, per_worker)
        assert value(samples, "nv_inference_pending_request_count", **labels) == 0
        for metric, phase in (("request", "success"), ("queue", "queue"), ("compute_input", "compute_input"),
                              ("compute_infer", "compute_infer"), ("compute_output", "compute_output")):
            name = f"nv_inference_{metric}_duration_us"
            # Each worker serves its ns // 1000: their sum is under the sum's // 1000 by less than WORKERS.
            summed = int(stats["inference_stats"][phase]["ns"]) // 1000
            assert 0 <= summed - value(samples, name, **labels) < WORKERS, (name, samples[name], stats)
            assert delta(name) > 0, name
            checked[name] = summed
        seconds = delta("nv_inference_request_duration_seconds_sum")
        assert seconds == pytest.approx(stats_delta("success") / 1e9, rel=1e-6), seconds
        buckets = {dict(key)["le"]: n for key, n in samples["nv_inference_request_duration_seconds_bucket"].items()
                   if dict(key)["model"] == "simple"}
        cumulative = [buckets[le] for le in sorted(buckets, key=float)]
        assert cumulative == sorted(cumulative) and cumulative[-1] == value(
            samples, "nv_inference_request_duration_seconds_count", **labels)
        assert delta("nv_inference_request_duration_seconds_bucket", le="+Inf") == successes
        # Every nv_* sample of the model is one checked above.
        served = {name for name, rows in samples.items() if name.startswith("nv_")
                  and any(dict(key).get("model") == "simple" for key in rows)}
        assert served == {*checked, "nv_inference_request_failure", "nv_inference_pending_request_count",
                          "nv_inference_request_duration_seconds_sum",
                          "nv_inference_request_duration_seconds_bucket"}, served
        # The process metrics: the workers' memory adds up; the interpreter is one, and so is the start time.
        rss = [resident_bytes(pid) for pid in per_worker]
        assert 1.2 * max(rss) < value(samples, "process_resident_memory_bytes") < 1.3 * sum(rss)
        assert list(samples["python_info"].values()) == [1]
        assert value(samples, "process_start_time_seconds") <= time.time()
