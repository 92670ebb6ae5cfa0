"""The server under load and faults (marker `faults`), on loopback against `python -m oip serve` with the example
models (examples/models: `simple`, `identity_fp32`) and the suite's `slow` model:

- 64 concurrent clients mixing REST JSON, REST binary and gRPC on `simple`, every answer checked number by number,
  and the count of requests the server's statistics saw equal to the count sent; a second identical phase must not
  grow the server's resident memory by 50 MB or more.
- 200 slow clients sending a header a byte a second while others are served (p99 under 1 s); connections that are
  idle or too slow close after the documented timeouts (`--http-header-timeout`, `--http-keep-alive-seconds`).
- A storm of unloads and loads of one model while both it and another model serve inferences.
- 2,000 requests on one ModelStreamInfer stream; a stream cancelled halfway; 50 concurrent streams.
- SIGTERM with 32 slow requests in flight.
- A gzip bomb (300 MB of zeros, about 300 KB compressed) refused within a stated memory bound.

Bounded: the two load phases last FAULTS_SECONDS each (env OIP_FAULTS_SECONDS, default 20), the others a few
seconds; about 90 s in all on a quiet 2-core machine. Every server is started here and stopped by its pid.
The drivers of the load phases are bench/faults.py's (`make bench-scale` runs them too).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from conftest import ROOT
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import (
    TIMEOUT,
    Server,
    assert_error_body,
    build_repository,
    check_simple,
    running,
    start_server,
)

sys.path.insert(0, str(ROOT / "bench"))
import faults
import streams
from loadgen import reset_peak

pytestmark = pytest.mark.faults

FAULTS_SECONDS = float(os.environ.get("OIP_FAULTS_SECONDS", "20"))
HEADER_TIMEOUT = 3.0  # --http-header-timeout of the module's server
KEEP_ALIVE = 2  # --http-keep-alive-seconds of the module's server
BODY_TIMEOUT = 4.0  # --http-body-timeout of the module's server
RSS_GROWTH_LIMIT_KIB = 50 * 1024
# A refused gzip bomb may raise the server's peak resident memory by this much at most: the inflater keeps up to
# 16 MiB of output while a body's size is unknown, plus one 1 MiB chunk (rest.py); the rest is headroom for the
# interpreter's own allocations while answering.
BOMB_PEAK_LIMIT_KIB = 40 * 1024


def repository(root: Path, *extra: str) -> Path:
    """The example models `simple` and `identity_fp32` (copied from examples/models) and the suite's `extra`."""
    models = build_repository(root, extra, only=())
    for name in ("simple", "identity_fp32"):
        shutil.copytree(ROOT / "examples" / "models" / name, models / name)
    return models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("faults")
    started = start_server(repository(root / "models"), root / "run", "--http-header-timeout", str(HEADER_TIMEOUT),
                           "--http-keep-alive-seconds", str(KEEP_ALIVE), "--http-body-timeout", str(BODY_TIMEOUT),
                           ready=("simple", "identity_fp32"))
    yield started
    assert started.stop() == 0, started.log_text()
    assert "Traceback" not in started.log_text(), started.log_text()


def report(what: str, figures: dict[str, Any]) -> None:
    """The figures of a phase, in the test's output (`pytest -s -m faults` shows them)."""
    print(f"\n[faults] {what}: {json.dumps(figures, default=str)}")


def success_count(http: httpx.Client, model: str) -> tuple[int, int]:
    """The statistics extension's successful and failed request counts of `model` (summed over versions)."""
    stats = http.get(f"/v2/models/{model}/stats").json()["model_stats"]
    return (sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
            sum(int(s["inference_stats"]["fail"]["count"]) for s in stats))


# --- mixed load, twice ------------------------------------------------------------------------------------------


def test_mixed_load_is_exact_and_memory_stays_flat(server: Server) -> None:
    rest = f"127.0.0.1:{server.http_port}"
    with server.http_client() as http:
        before = success_count(http, "simple")
        rss = [server.rss_kib()]
        phases = []
        for seed in (0, 1_000):  # two identical phases (other random inputs)
            phases.append(faults.mixed_load(rest, server.target, clients=64, duration=FAULTS_SECONDS, seed=seed))
            rss.append(server.rss_kib())
        after = success_count(http, "simple")
    for number, phase in enumerate(phases, 1):
        report(f"mixed load, phase {number}", {k: v for k, v in phase.items() if k != "samples"})
        assert phase["errors"] == 0 and phase["wrong"] == 0, phase["samples"]
        assert all(kind["requests"] > 0 for kind in phase["kinds"].values()), phase["kinds"]
    report("server RSS (KiB) before, after phase 1, after phase 2", {"rss_kib": rss})
    sent = sum(phase["requests"] for phase in phases)
    assert after == (before[0] + sent, before[1]), (before, after, sent)  # the server saw every request, no failure
    assert rss[2] - rss[1] < RSS_GROWTH_LIMIT_KIB, rss


# --- slow and idle connections ----------------------------------------------------------------------------------


def test_slow_clients_do_not_stop_the_others(server: Server) -> None:
    figures = faults.slow_clients(f"127.0.0.1:{server.http_port}", slow=200, probes=8,
                                  duration=max(8.0, 2 * HEADER_TIMEOUT + 2))
    report("200 slow clients", figures)
    probe = figures["probe"]
    assert probe["errors"] == 0 and probe["wrong"] == 0, probe["samples"]
    assert probe["requests"] > 100 and probe["p99_ms"] < 1000.0, probe
    # Every slow connection was closed by the server after the header timeout, with a 408 and its error body.
    assert figures["slow_closed_by_server"] >= 200, figures
    assert set(figures["slow_answers"]) == {"HTTP/1.1 408 Request Timeout"}, figures["slow_answers"]
    # Timed from before each connection is made, so the server's clock for it starts later, never earlier; what may
    # still read early is the server's own clock (uvloop's time is taken once per pass of its loop): 0.2 s for that.
    closed = figures["slow_closed_after_s"]
    assert closed["min"] >= HEADER_TIMEOUT - 0.2 and closed["max"] <= HEADER_TIMEOUT + 2.0, closed
    with server.clients() as (http, stub):
        check_simple(http, stub)


async def _closed_after(port: int, send: bytes, count: int) -> list[tuple[float, bytes]]:
    """`count` connections that each send `send` and then nothing: per connection, the seconds until the server
    closed it and every byte it answered."""

    async def one() -> tuple[float, bytes]:
        start = time.monotonic()  # before the connection: the server's clock for it starts later, never earlier
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(send)
        received = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(65536), timeout=BODY_TIMEOUT + 10):
                received += chunk
        finally:
            writer.close()
        return time.monotonic() - start, received

    return await asyncio.gather(*(one() for _ in range(count)))


def test_idle_connections_close_after_the_documented_timeouts(server: Server) -> None:
    # Nothing sent at all: 408 with the error body after --http-header-timeout, then closed.
    silent = asyncio.run(_closed_after(server.http_port, b"", 20))
    # A complete request, then idle: the answer, then closed after --http-keep-alive-seconds.
    request = f"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1:{server.http_port}\r\n\r\n".encode()
    idle = asyncio.run(_closed_after(server.http_port, request, 20))
    # Headers and part of a body, then nothing: 408 with the error body after --http-body-timeout, then closed.
    stalled = asyncio.run(_closed_after(server.http_port, (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1:{server.http_port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"inputs\": ["
    ).encode(), 20))
    report("idle connections closed after (s)", {"silent": [round(s, 2) for s, _ in silent],
                                                  "keep_alive": [round(s, 2) for s, _ in idle],
                                                  "stalled_body": [round(s, 2) for s, _ in stalled]})
    for seconds, received in silent:
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), received
        assert list(json.loads(body)) == ["error"], received
        assert HEADER_TIMEOUT - 0.2 <= seconds <= HEADER_TIMEOUT + 2.0, seconds
    for seconds, received in idle:
        assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b'{"live":true}'), received
        assert KEEP_ALIVE - 0.2 <= seconds <= KEEP_ALIVE + 2.0, seconds
    for seconds, received in stalled:
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"request body paused" in body, received
        assert list(json.loads(body)) == ["error"], received
        assert BODY_TIMEOUT - 0.2 <= seconds <= BODY_TIMEOUT + 2.0, seconds
    with server.clients() as (http, stub):
        check_simple(http, stub)


# --- unload/load storm ------------------------------------------------------------------------------------------

STORMED = "identity_fp32"
# What a request to a model being unloaded or loaded may answer (documented in the README): the answer, or "not
# ready" (503 / UNAVAILABLE) while no version of it is loaded.
STORM_REST = {200, 503}
STORM_GRPC = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}


def _infer_loop(server: Server, model: str, transport: str, stop: threading.Event, outcomes: list[Any]) -> None:
    """Inferences on `model` until `stop`: each outcome is (status, detail); a wrong answer is ("wrong", ...)."""
    rng = np.random.default_rng(len(outcomes) + hash((model, transport)) % 1000)
    with server.http_client(timeout=10.0) as http, server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            if model == "simple":
                a = rng.integers(-1000, 1000, 16, dtype=np.int32)
                b = rng.integers(-1000, 1000, 16, dtype=np.int32)
                inputs = [("INPUT0", "INT32", [1, 16], a), ("INPUT1", "INT32", [1, 16], b)]
                want = [a + b]
            else:
                a = rng.random(64, dtype=np.float32)
                inputs = [("INPUT0", "FP32", [64], a)]
                want = [a]
            try:
                if transport == "rest":
                    body = {"inputs": [{"name": n, "datatype": d, "shape": s, "data": x.tolist()}
                                       for n, d, s, x in inputs]}
                    response = http.post(f"/v2/models/{model}/infer", json=body)
                    if response.status_code != 200:
                        outcomes.append((response.status_code, assert_error_body(response, response.status_code)))
                        continue
                    got = np.asarray(response.json()["outputs"][0]["data"], dtype=want[0].dtype)
                else:
                    request = pb.ModelInferRequest(model_name=model)
                    for n, d, s, x in inputs:
                        request.inputs.add(name=n, datatype=d, shape=s)
                        request.raw_input_contents.append(x.tobytes())
                    try:
                        reply = stub.ModelInfer(request, timeout=10.0)
                    except grpc.RpcError as exc:
                        outcomes.append((exc.code(), exc.details()))
                        continue
                    got = np.frombuffer(reply.raw_output_contents[0], dtype=want[0].dtype)
            except Exception as exc:  # a hang (timeout) or a broken connection: a failure
                outcomes.append(("failure", f"{type(exc).__name__}: {exc}"))
                continue
            ok = np.array_equal(got.ravel(), want[0].ravel())
            outcomes.append((200 if transport == "rest" else grpc.StatusCode.OK, "") if ok else ("wrong", str(got)))


def test_unload_load_storm(server: Server) -> None:
    duration = max(5.0, FAULTS_SECONDS / 2)
    stop = threading.Event()
    outcomes: dict[tuple[str, str], list[Any]] = {(m, t): [] for m in ("simple", STORMED) for t in ("rest", "grpc")}
    threads = [threading.Thread(target=_infer_loop, args=(server, m, t, stop, out)) for (m, t), out in outcomes.items()]
    cycles = 0
    control: list[tuple[str, int, str]] = []
    with server.http_client(timeout=30.0) as http, server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for thread in threads:
            thread.start()
        try:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                cycles += 1
                if cycles % 2:  # REST and gRPC in turn
                    for action in ("unload", "load"):
                        response = http.post(f"/v2/repository/models/{STORMED}/{action}")
                        control.append((action, response.status_code, response.text[:200]))
                else:
                    stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=STORMED), timeout=30)
                    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=STORMED), timeout=30)
                    control += [("unload", 200, "grpc"), ("load", 200, "grpc")]
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads), "an inference hung"
        assert http.post(f"/v2/repository/models/{STORMED}/load").status_code == 200
        assert http.get(f"/v2/models/{STORMED}/ready").status_code == 200
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1.5, 2.5, -3.0]}]}
        assert http.post(f"/v2/models/{STORMED}/infer", json=body).json()["outputs"][0]["data"] == [1.5, 2.5, -3.0]
        check_simple(http, stub)
    tallies = {f"{m}/{t}": {str(k): sum(1 for s, _ in out if s == k) for k in {s for s, _ in out}}
               for (m, t), out in outcomes.items()}
    report("unload/load storm", {"cycles": cycles, "seconds": duration, "outcomes": tallies})
    assert all(status == 200 for _, status, _ in control), [c for c in control if c[1] != 200][:5]
    for transport, good in (("rest", {200}), ("grpc", {grpc.StatusCode.OK})):
        seen = outcomes[("simple", transport)]
        assert seen and all(status in good for status, _ in seen), [o for o in seen if o[0] not in good][:5]
    for transport, allowed in (("rest", STORM_REST), ("grpc", STORM_GRPC)):
        seen = outcomes[(STORMED, transport)]
        bad = [o for o in seen if o[0] not in allowed]
        assert seen and not bad, bad[:5]
        assert any(status in (200, grpc.StatusCode.OK) for status, _ in seen), tallies  # it served in between


# --- streams ----------------------------------------------------------------------------------------------------


def _stream_request(index: int, tag: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple", id=f"{tag}-{index}")
    a = np.full(16, index, dtype="<i4")
    b = np.arange(16, dtype="<i4")
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(array.tobytes())
    return request


def _check_stream_reply(reply: pb.ModelStreamInferResponse, tag: str) -> int:
    """The index of the request a stream reply answers; its data must be exactly right."""
    assert not reply.error_message, reply.error_message
    response = reply.infer_response
    prefix, _, index = response.id.rpartition("-")
    assert prefix == tag, response.id
    got = codec.from_raw(response.raw_output_contents[0], "INT32", [16]).tolist()
    assert got == [int(index) + i for i in range(16)], (response.id, got)
    return int(index)


def test_two_thousand_requests_on_one_stream(server: Server) -> None:
    began = time.monotonic()
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        replies = stub.ModelStreamInfer((_stream_request(i, "one") for i in range(2000)), timeout=120)
        answered = [_check_stream_reply(reply, "one") for reply in replies]
    report("one stream, 2,000 requests", {"seconds": round(time.monotonic() - began, 2), "answers": len(answered)})
    assert sorted(answered) == list(range(2000))


def test_stream_cancelled_halfway_leaves_the_server_healthy(server: Server) -> None:
    with server.http_client() as http:
        before = success_count(http, "simple")
        with server.channel() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelStreamInfer((_stream_request(i, "cut") for i in range(100_000)), timeout=120)
            for answered, reply in enumerate(call, 1):
                _check_stream_reply(reply, "cut")
                if answered == 1000:
                    call.cancel()
                    break
            with pytest.raises(grpc.RpcError) as cancelled:
                next(call)
            assert cancelled.value.code() is grpc.StatusCode.CANCELLED
        with server.channel() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            check_simple(http, stub)
            again = [_check_stream_reply(r, "after") for r in stub.ModelStreamInfer(
                (_stream_request(i, "after") for i in range(100)), timeout=60)]
            assert sorted(again) == list(range(100))
        time.sleep(0.5)  # what the cancelled stream had taken in has finished
        success, failed = success_count(http, "simple")
    report("stream cancelled after 1,000 answers", {"served_in_all": success - before[0], "failed": failed - before[1]})
    # The server stopped taking the cancelled stream's requests: far fewer than its 100,000 were run.
    assert 1000 + 100 + 2 <= success - before[0] < 50_000, (before, success)
    assert failed == before[1]


def test_fifty_concurrent_streams(server: Server) -> None:
    results: dict[int, Any] = {}

    def stream(number: int) -> None:
        try:
            with server.channel() as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                tag = f"s{number}"
                replies = stub.ModelStreamInfer((_stream_request(i, tag) for i in range(100)), timeout=120)
                results[number] = sorted(_check_stream_reply(r, tag) for r in replies)
        except BaseException as exc:
            results[number] = exc

    began = time.monotonic()
    threads = [threading.Thread(target=stream, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    report("50 concurrent streams of 100 requests", {"seconds": round(time.monotonic() - began, 2)})
    assert sorted(results) == list(range(50))
    assert all(answers == list(range(100)) for answers in results.values()), results


# --- large REST streams (generate_stream) -----------------------------------------------------------------------

STREAM_GRACE = 3.0

# Decoupled, an async generator that never awaits: counts up to `count` (a request parameter), one response per
# number; when its generator is closed or ends, writes `closed-<numbers sent>` into its folder.
COUNTER = '''
from pathlib import Path

import numpy as np

from oip.server.model import Model, TensorSpec


class Counter(Model):
    inputs = [TensorSpec("START", "INT64", [1])]
    outputs = [TensorSpec("N", "INT64", [1])]
    decoupled = True

    async def infer(self, inputs, parameters):
        sent = 0
        try:
            for n in range(int(inputs["START"][0]), int(parameters["count"])):
                yield {"N": np.array([n], dtype=np.int64)}
                sent += 1
        finally:
            (Path(self.path) / f"closed-{sent}").write_text("")
'''


def test_fifty_large_streams_leave_the_server_live_and_sigterm_stops_it_within_its_grace(tmp_path: Path) -> None:
    """50 clients read 500,000-word streams of `text_stream` (a model that never awaits) as fast as they can:
    all 50 begin, the server keeps answering /v2/health/live while every stream still runs (each gives the event
    loop a turn every 0.1 ms), and SIGTERM stops it within --graceful-shutdown-seconds, the streams cut."""
    models = repository(tmp_path / "models")
    shutil.copytree(ROOT / "examples" / "models" / "text_stream", models / "text_stream")
    server = start_server(models, tmp_path / "run", "--graceful-shutdown-seconds", str(STREAM_GRACE),
                          ready=("text_stream",))
    try:
        rest = f"127.0.0.1:{server.http_port}"
        with streams.streaming(rest, 50, 500_000) as readers:
            deadline = time.monotonic() + 60
            while not all(readers.events):  # every stream has begun: the requests' reading and splitting is done
                assert time.monotonic() < deadline, readers.events
                time.sleep(0.05)
            latencies, unanswered = streams.probe(rest, 3.0)
            running = sum(not ended for ended in readers.ended)
            events = sum(readers.events)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            code = server.process.wait(timeout=STREAM_GRACE + 15)
            exited = time.monotonic() - signalled
    finally:
        server.kill()
    ordered = sorted(latencies)
    report("50 streams of 500,000 words", {
        "probes": len(latencies), "probe_ms_p50": round(ordered[len(ordered) // 2] * 1000, 1) if ordered else None,
        "probe_ms_max": round(ordered[-1] * 1000, 1) if ordered else None, "events": events,
        "exit_after_s": round(exited, 2)})
    assert not unanswered and len(latencies) >= 10, (len(latencies), server.log_tail())
    assert running == 50, running  # the probes were answered while all 50 streamed
    assert code == 0, server.log_text()
    assert exited < STREAM_GRACE + 5, exited


def test_a_client_gone_mid_stream_closes_the_models_generator(tmp_path: Path) -> None:
    """A client that goes away after the first event of a 10,000,000-response stream (from a model that never
    awaits): the server notices at once and closes the model's generator, far from its end."""
    models = repository(tmp_path / "models")
    (models / "counter").mkdir()
    (models / "counter" / "model.toml").write_text('class = "model:Counter"\ndecoupled = true\n')
    (models / "counter" / "model.py").write_text(COUNTER)
    with running(models, tmp_path / "run", ready=("counter",)) as server:
        with server.http_client() as http, http.stream(
                "POST", "/v2/models/counter/generate_stream", json={"START": 0, "count": 10_000_000}) as answer:
            assert answer.status_code == 200
            first = next(answer.iter_lines())
        assert first == 'data: {"model_name":"counter","model_version":"1","N":0}', first
        deadline = time.monotonic() + TIMEOUT
        while not (closed := list((models / "counter").glob("closed-*"))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert closed, "the model's generator was not closed"
        sent = int(closed[0].name.split("-")[1])
        report("client gone mid-stream", {"responses_made": sent})
        assert sent < 1_000_000, sent
        with server.http_client() as http:
            assert http.get("/v2/health/live").json() == {"live": True}


# --- SIGTERM with slow requests in flight ---------------------------------------------------------------------------

GRACE = 15.0
DELAY = 3.0  # each slow request; the listeners must close well within it


def test_sigterm_with_32_slow_requests_in_flight(tmp_path: Path) -> None:
    models = repository(tmp_path / "models", "slow")
    server = start_server(models, tmp_path / "run", "--model-threads", "32", "--graceful-shutdown-seconds",
                          str(GRACE), ready=("slow",))
    results: dict[int, Any] = {}

    def call(number: int) -> None:
        data = [number, number * 7, -number]
        try:
            if number % 2:
                body = {"parameters": {"delay": DELAY},
                        "inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": data}]}
                response = httpx.post(f"{server.url}/v2/models/slow/infer", json=body, timeout=TIMEOUT)
                results[number] = (response.status_code, response.json()["outputs"][0]["data"])
            else:
                request = pb.ModelInferRequest(model_name="slow", raw_input_contents=[np.array(data, "<i4").tobytes()])
                request.parameters["delay"].double_param = DELAY
                request.inputs.add(name="INPUT0", datatype="INT32", shape=[3])
                with server.channel() as channel:
                    reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=TIMEOUT)
                results[number] = (200, codec.from_raw(reply.raw_output_contents[0], "INT32", [3]).tolist())
        except Exception as exc:  # reported by the assertions below
            results[number] = (type(exc).__name__, str(exc))

    threads = [threading.Thread(target=call, args=(n,)) for n in range(32)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + TIMEOUT
        while len(list((models / "slow").glob("started-*"))) < 32:  # all 32 are inside the model
            assert time.monotonic() < deadline, "the 32 requests did not all start"
            time.sleep(0.01)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        refused = {}
        while len(refused) < 2:  # new connections are refused on both ports while the 32 still run
            assert time.monotonic() < signalled + DELAY, "new connections were still taken while draining"
            for name, port in (("rest", server.http_port), ("grpc", server.grpc_port)):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError as exc:
                    refused[name] = (round(time.monotonic() - signalled, 3), type(exc).__name__)
            time.sleep(0.02)
        assert not results, "a request finished before the listeners closed"
        code = server.process.wait(timeout=GRACE + 5)
        exited = time.monotonic() - signalled
        for thread in threads:
            thread.join(timeout=TIMEOUT)
    finally:
        server.kill()
    report("SIGTERM with 32 slow requests", {"refused_after_s": refused, "exit_after_s": round(exited, 2),
                                             "exit_code": code, "delay_s": DELAY, "grace_s": GRACE})
    assert code == 0, server.log_text()
    assert exited < GRACE, exited
    assert results == {n: (200, [n, n * 7, -n]) for n in range(32)}, results
    assert "Traceback" not in server.log_text()


# --- a gzip bomb -------------------------------------------------------------------------------------------------

BOMB_BYTES = 300 * 1024 * 1024


def _bomb(wbits: int) -> bytes:
    """BOMB_BYTES of zeros compressed (gzip or zlib framing), made a chunk at a time."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zeros = bytes(1024 * 1024)
    parts = [compressor.compress(zeros) for _ in range(BOMB_BYTES // len(zeros))]
    return b"".join([*parts, compressor.flush()])


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", zlib.MAX_WBITS | 16), ("deflate", zlib.MAX_WBITS)])
def test_gzip_bomb_is_refused_within_a_memory_bound(tmp_path: Path, encoding: str, wbits: int) -> None:
    """Each encoding on a fresh server, so that its peak is its own (a server that inflated another bomb before
    may keep that memory, and would hide this one's growth under it)."""
    server = start_server(repository(tmp_path / "models"), tmp_path / "run", ready=("simple", "identity_fp32"))
    figures: dict[str, Any] = {}
    try:
        with server.clients() as (http, stub):
            check_simple(http, stub)
            bomb = _bomb(wbits)
            assert reset_peak(server.process.pid)  # VmHWM := VmRSS (the server is this test's child)
            idle = server.rss_kib()
            response = http.post("/v2/models/simple/infer", content=bomb,
                                 headers={"Content-Type": "application/json", "Content-Encoding": encoding})
            message = assert_error_body(response, 413)
            assert "inflates beyond the limit of 268435456 bytes" in message, message
            peak = _peak_kib(server.process.pid)
            figures["bomb"] = {"compressed_bytes": len(bomb), "rss_before_kib": idle, "peak_kib": peak,
                               "peak_growth_kib": peak - idle}
            assert peak - idle < BOMB_PEAK_LIMIT_KIB, figures
            # Within the limit and larger than what is kept while inflating: inflated again, exactly.
            data = np.random.default_rng(3).random(6_000_000, dtype=np.float32)
            header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [data.size], "datatype": "FP32",
                                             "parameters": {"binary_data_size": data.nbytes}}],
                                 "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
            compressor = zlib.compressobj(1, zlib.DEFLATED, wbits)
            body = compressor.compress(header + data.tobytes()) + compressor.flush()
            assert reset_peak(server.process.pid)
            idle = server.rss_kib()
            response = http.post("/v2/models/identity_fp32/infer", content=body, headers={
                "Content-Type": "application/octet-stream", "Content-Encoding": encoding,
                "Inference-Header-Content-Length": str(len(header))})
            assert response.status_code == 200, response.text[:300]
            length = int(response.headers["Inference-Header-Content-Length"])
            assert np.array_equal(np.frombuffer(response.content[length:], dtype="<f4"), data)
            figures["accepted"] = {"inflated_bytes": len(header) + data.nbytes, "compressed_bytes": len(body),
                                   "peak_growth_kib": _peak_kib(server.process.pid) - idle}
            check_simple(http, stub)
    finally:
        status = server.stop()
    report(f"a {encoding} bomb of 300 MB of zeros", figures)
    assert status == 0, server.log_text()
