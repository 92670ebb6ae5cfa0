"""`serve --workers 2`: two server processes on the same ports under one supervisor.

How a test knows which worker answered: with `--log-format json --access-log` every REST request is logged with
the process id of the worker that served it, and the ports file lists the workers' pids. Requests over many new
connections must be served by both. Control-plane operations (repository load and unload, shared memory) made
over one connection must hold on every connection; statistics are the sum over the workers; a worker killed with
SIGKILL is replaced and the server keeps answering; SIGTERM drains both and the supervisor exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
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
    START_TIMEOUT,
    TIMEOUT,
    Server,
    build_repository,
    check_simple,
    count_before,
    resident_bytes,
    scrape,
    server_env,
    simple_body,
    simple_grpc_request,
    start_server,
    value,
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


def test_a_temporary_folder_too_deep_for_a_socket_path_moves_the_control_sockets_to_tmp(tmp_path: Path) -> None:
    """With a TMPDIR so deep that no socket can be bound in it, the supervisor makes its private folder under /tmp
    and says so; the workers talk over it (an unload reaches both), and it is gone once the server stops."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS), ready=("simple",),
                          env={"TMPDIR": str(deep)})
    try:
        with server.http_client() as http:
            assert http.post("/v2/repository/models/simple/unload").status_code == 200
        answers = infer_on_new_connections(server, CONNECTIONS)
        assert {a.status_code for a in answers} <= {400, 404, 503}, [a.text for a in answers]
    finally:
        assert server.stop() == 0, server.log_text()
    said = re.search(r"control sockets are under (\S+): the temporary folder (\S+) is too deep", server.log_text())
    assert said is not None, server.log_text()
    assert Path(said[1]).parent == Path("/tmp") and said[2] == str(deep)
    assert not Path(said[1]).exists() and list(deep.iterdir()) == []


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


# On PYTHONPATH: a process started while `slow-start` exists in its folder first sleeps, before it imports anything
# of the server (so before a worker can handle SIGTERM).
SLOW_START = """
import time
from pathlib import Path

if (Path(__file__).parent / "slow-start").exists():
    (Path(__file__).parent / "starting").write_text("")
    time.sleep(20)
"""


def test_sigterm_while_a_replacement_worker_starts_exits_zero(tmp_path: Path) -> None:
    """SIGTERM reaches a worker the supervisor is starting again before that worker handles the signal (it is
    still starting Python): it dies of it, having served nothing, and the server still stops cleanly (exit 0)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_START)
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS), ready=("simple",),
                          env={"PYTHONPATH": os.pathsep.join([str(hook), server_env()["PYTHONPATH"]])})
    (hook / "slow-start").write_text("")
    os.kill(worker_pids(server)[1], signal.SIGKILL)
    deadline = time.monotonic() + START_TIMEOUT
    while not (hook / "starting").exists():
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.05)
    assert server.stop() == 0, server.log_text()
    assert "worker 1 stopped while it was starting" in server.log_text(), server.log_tail()


def test_metrics_are_the_sum_over_workers(cluster: Server) -> None:
    """Every nv_* sample of a scrape, whichever worker answers it, is the sum of what each worker served (from the
    access log, which names the worker of each answer), failures included; durations agree with the statistics
    (summed by another path), within the microsecond each worker rounds away."""
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


# --- the control plane under faults --------------------------------------------------------------------------------

# Its unload() first leaves an `unloading` file in its folder, then takes UNLOAD_SECONDS.
UNLOAD_SECONDS = 4.0
SLOW_UNLOAD = f'''
import time
from pathlib import Path

from oip.server.model import Model, TensorSpec


class SlowUnload(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        return {{"OUTPUT0": inputs["INPUT0"]}}

    def unload(self):
        (Path(self.path) / "unloading").write_text("")
        time.sleep({UNLOAD_SECONDS})
'''


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR shallow enough for the supervisor to make its folder of sockets in it (a test's own tmp_path may
    not be: `private_folder`)."""
    folder = Path(tempfile.mkdtemp(prefix="oip-test-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def control_sockets(tmp: Path) -> list[Path]:
    """The workers' control sockets, in the private folder the supervisor made under `tmp` (its TMPDIR)."""
    (folder,) = tmp.glob("oip-workers-*")
    return sorted(folder.glob("worker-*.sock"))


def wait_for_new_worker(server: Server, index: int, old: int, within: float) -> float:
    """Wait, up to `within` seconds, until the ports file names a worker other than `old` at `index`; how long."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        pids = worker_pids(server)
        if pids[index] != old and len(set(pids)) == WORKERS:
            return time.monotonic() - began
        time.sleep(0.1)
    raise AssertionError(f"worker {index} (pid {old}) was not replaced within {within}s\n{server.log_tail()}")


def reaching_a_live_worker(server: Server, method: str, path: str, within: float = 60.0) -> httpx.Response:
    """`method path` on a connection that reached a worker that answers. The kernel gives some new connections to
    a stopped worker, where they wait (or are reset when it is killed), so each one is first proven live with a
    quick health check, and the request then goes over that same kept-alive connection."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with server.http_client(timeout=8.0) as http:  # one request at a time: the idle connection is reused
            try:
                http.get("/v2/health/live", timeout=2.0)
            except httpx.TransportError:
                continue
            return http.request(method, path)
    raise AssertionError(f"no answer to {method} {path} within {within}s\n{server.log_tail()}")


def test_silent_control_connections_and_scrapes_leave_the_models_their_threads(tmp_path: Path, short_tmp: Path) -> None:
    """Connections to both workers' control sockets that never say anything (as a stopped peer or any process of
    the user could make), while /metrics is scraped (each scrape asks the other worker for its samples): the
    control plane answers on no model thread and gives up on a silent caller at the handshake's deadline, so a
    plain model with --model-threads 2 answers every request, and every scrape is answered."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = short_tmp
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS), "--model-threads", "2",
                          ready=("simple",), env={"TMPDIR": str(tmp)})
    silent: list[socket.socket] = []

    def say_nothing(count: int) -> None:
        for path in control_sockets(tmp):
            for _ in range(count):
                sock = socket.socket(socket.AF_UNIX)
                sock.settimeout(TIMEOUT)
                sock.connect(str(path))
                silent.append(sock)

    try:
        say_nothing(1)

        def scrape() -> int:
            with server.http_client() as http:
                return http.get("/metrics").status_code

        with ThreadPoolExecutor(12) as pool:
            scrapes = [pool.submit(scrape) for _ in range(8)]
            answers = [pool.submit(infer_on_new_connections, server, 1) for _ in range(20)]
            assert [s.result(timeout=TIMEOUT * 2) for s in scrapes] == [200] * 8
            assert [a.result(timeout=TIMEOUT * 2)[0].status_code for a in answers] == [200] * 20
        say_nothing(20)
        for sock in silent:  # each got the greeting and a challenge, then was closed at the handshake's deadline
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
            assert received.startswith(b"oip-control-1\0") and len(received) == 14 + 32, received
    finally:
        for sock in silent:
            sock.close()
        assert server.stop() == 0, server.log_text()


def test_a_stopped_worker_is_reported_skipped_and_replaced(tmp_path: Path) -> None:
    """SIGSTOP one worker of two. Scrapes the other answers wait for it at most a deadline (it is reported, then
    skipped); the supervisor, whose pings it no longer answers, kills it after UNRESPONSIVE_AFTER seconds and
    starts another, which serves. That one is stopped too, and a model unloaded: the worker that could not reach
    it in time says so, the supervisor replaces it at once (not UNRESPONSIVE_AFTER later), and the replacement
    copies the state: the model is unloaded on every connection."""
    from oip.server.process.supervisor import UNRESPONSIVE_AFTER

    repository = build_repository(tmp_path / "models", only=("simple", "identity_fp32"))
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS), "--log-format", "json",
                          "--access-log", ready=("simple", "identity_fp32"))
    try:
        stopped = worker_pids(server)[1]
        os.kill(stopped, signal.SIGSTOP)
        for _ in range(3):
            assert reaching_a_live_worker(server, "GET", "/metrics").status_code == 200
        assert "did not answer metric_families in time" in server.log_text(), server.log_tail()
        wait_for_new_worker(server, 1, stopped, UNRESPONSIVE_AFTER + START_TIMEOUT)
        assert f"(pid {stopped}) answered no ping for" in server.log_text(), server.log_tail()

        stopped = worker_pids(server)[1]
        os.kill(stopped, signal.SIGSTOP)
        answer = reaching_a_live_worker(server, "POST", "/v2/repository/models/identity_fp32/unload")
        assert answer.status_code == 200, answer.text
        took = wait_for_new_worker(server, 1, stopped, START_TIMEOUT)
        assert took < UNRESPONSIVE_AFTER, took
        assert f"(pid {stopped}) missed an operation that changes state" in server.log_text(), server.log_tail()
        since = log_size(server)
        assert all(a.status_code == 200 for a in infer_on_new_connections(server, CONNECTIONS))
        wait_for_log(server, since, CONNECTIONS)
        assert set(served_by(server, since)) == set(worker_pids(server))
        for _ in range(20):
            with server.http_client() as http:
                assert http.get("/v2/models/identity_fp32/ready").status_code != 200
    finally:
        for pid in worker_pids(server):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        assert server.stop() == 0, server.log_text()


def test_an_operation_during_a_restarted_workers_copy_applies_after_it(tmp_path: Path) -> None:
    """A restarted worker copies the others' state while its control socket already takes operations: a load
    answered during the copy (which here unloads `a_slow_unload`, UNLOAD_SECONDS long, before it reaches
    `identity_fp32`) is applied after the copy, not undone by it: every connection then sees the model ready."""
    repository = build_repository(tmp_path / "models", only=("simple", "identity_fp32"))
    (repository / "a_slow_unload").mkdir()
    (repository / "a_slow_unload" / "model.toml").write_text('class = "model:SlowUnload"\n')
    (repository / "a_slow_unload" / "model.py").write_text(SLOW_UNLOAD)
    marker = repository / "a_slow_unload" / "unloading"
    server = start_server(repository, tmp_path / "run", "--workers", str(WORKERS),
                          ready=("simple", "identity_fp32", "a_slow_unload"))
    try:
        with server.http_client() as http:
            for name in ("a_slow_unload", "identity_fp32"):  # the state a restarted worker must copy
                assert http.post(f"/v2/repository/models/{name}/unload").status_code == 200
        marker.unlink()
        victim = worker_pids(server)[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT
        while not marker.exists():  # the replacement is copying: it unloads a_slow_unload
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.02)
        with server.http_client() as http:  # only the other worker listens on the ports yet
            assert http.post("/v2/repository/models/identity_fp32/load").status_code == 200
        wait_for_new_worker(server, 1, victim, START_TIMEOUT)
        ready = []
        for _ in range(CONNECTIONS):
            with server.http_client() as http:
                ready.append(http.get("/v2/models/identity_fp32/ready").status_code)
        assert ready == [200] * CONNECTIONS, ready
    finally:
        assert server.stop() == 0, server.log_text()
