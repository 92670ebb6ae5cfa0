"""The gRPC threads, kind by kind (`oip.server.grpc.pool`): unary inference, streams and every other call (health,
metadata, the repository...) have threads of their own, `--grpc-threads` of each, so that none waits behind
another, as Triton handles inference and the other calls apart. Through `python -m oip serve` on real sockets,
with tritonclient's gRPC client.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving import TIMEOUT, build_repository, running

QUICK = 2.0  # seconds: a call that waited for a thread would wait until its deadline
SLOW = 4.0  # seconds a call to the slow model takes
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def simple_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    return inputs


class Collector:
    """A start_stream callback: every (result, error) in arrival order."""

    def __init__(self) -> None:
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.items.put((result, error))

    def answered_within(self, wait: float) -> bool:
        try:
            self.items.get(timeout=wait)
        except queue.Empty:
            return False
        return True


def assert_the_other_calls_are_answered(client: grpcclient.InferenceServerClient, target: str) -> None:
    assert client.is_server_live(client_timeout=QUICK) and client.is_server_ready(client_timeout=QUICK)
    assert client.get_server_metadata(client_timeout=QUICK).name
    assert client.get_model_metadata("simple", client_timeout=QUICK).name == "simple"
    assert client.get_model_repository_index(client_timeout=QUICK).models
    with grpc.insecure_channel(target) as channel:  # the standard health service, as a probe asks it
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=QUICK)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_idle_streams_do_not_hold_up_other_calls_and_streams_over_the_limit_wait_their_turn(tmp_path: Path) -> None:
    """Each open stream holds a gRPC thread: with `--grpc-threads 2`, five clients that keep a stream open (as
    tritonclient's `start_stream` does) take the two threads streams have, and three streams wait, said in the log;
    health, metadata and inference over unary calls are answered all the while, and a waiting stream is served as
    soon as another one ends."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path / "run", "--grpc-threads", "2", ready=["simple"]) as server:
        clients = [grpcclient.InferenceServerClient(server.target) for _ in range(6)]
        try:
            collectors = [Collector() for _ in range(5)]
            for client, collector in zip(clients[:5], collectors, strict=True):
                client.start_stream(callback=collector)
                client.async_stream_infer("simple", simple_inputs())  # each stream's first request
            answered = [i for i, collector in enumerate(collectors) if collector.answered_within(1.0)]
            assert len(answered) == 2, answered  # two streams are served, three wait
            other = clients[5]
            assert_the_other_calls_are_answered(other, server.target)
            reply = other.infer("simple", simple_inputs(), client_timeout=QUICK)
            assert (reply.as_numpy("OUTPUT0") == A + B).all()
            for i in answered:  # the served streams go on being served
                clients[i].async_stream_infer("simple", simple_inputs())
                assert collectors[i].answered_within(TIMEOUT)
            waiting = [i for i in range(5) if i not in answered]
            # One ends: a waiting stream is served (the first to reach the server, which need not be the first
            # client's), and only one, the other two threads still held.
            clients[answered[0]].stop_stream()
            deadline = time.monotonic() + TIMEOUT
            served: list[int] = []
            while not served and time.monotonic() < deadline:
                served = [i for i in waiting if collectors[i].answered_within(0.05)]
            assert len(served) == 1, served
            assert not any(collectors[i].answered_within(0.5) for i in waiting if i not in served)
        finally:
            # All at once: a client's close waits for its stream to end, and a waiting stream ends only once it
            # is served, when another stream has ended.
            with ThreadPoolExecutor(len(clients)) as closing:
                list(closing.map(grpcclient.InferenceServerClient.close, clients))
        assert "gRPC stream(s) wait for a thread: 2 are open, the most at once" in server.log_text()


def test_calls_to_a_slow_model_do_not_hold_up_health_and_metadata(tmp_path: Path) -> None:
    """With `--grpc-threads 2`, four calls to a model that takes SLOW seconds hold the two threads of inference
    (two wait for them); health (the protocol's and the standard gRPC health service), metadata and the repository
    index are answered at once all the while."""
    repository = build_repository(tmp_path / "models", extra=("slow",), only=("simple",))
    with running(repository, tmp_path / "run", "--grpc-threads", "2", "--model-threads", "4",
                 ready=["simple", "slow"]) as server:
        clients = [grpcclient.InferenceServerClient(server.target) for _ in range(5)]
        started = threading.Barrier(5)
        x = np.arange(4, dtype=np.int32)

        def slow(client: grpcclient.InferenceServerClient) -> Any:
            tensor = grpcclient.InferInput("INPUT0", [4], "INT32")
            tensor.set_data_from_numpy(x)
            started.wait(TIMEOUT)
            return client.infer("slow", [tensor], parameters={"delay": SLOW}, client_timeout=TIMEOUT)

        try:
            with ThreadPoolExecutor(4) as pool:
                calls = [pool.submit(slow, client) for client in clients[:4]]
                started.wait(TIMEOUT)
                deadline = threading.Event()
                deadline.wait(0.5)  # the calls are in, and hold the threads of inference
                assert not any(call.done() for call in calls)
                assert_the_other_calls_are_answered(clients[4], server.target)  # each within QUICK: none waited
                for call in calls:
                    assert (call.result(TIMEOUT).as_numpy("OUTPUT0") == x).all()
        finally:
            for client in clients:
                client.close()
