"""`serve --grpc-thread-scheduling`: the gRPC threads (and the timer thread of the batches formed where gRPC calls
arrive) run under SCHED_BATCH by default (Linux), and under the system's policy with `normal`; no other thread of
the server changes its policy. Read from the server process's
tasks (/proc/PID/task) after gRPC calls have started its pool's threads."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server.grpc.server import threaded_server
from serving import TIMEOUT, Server, build_repository, simple_grpc_request, start_server, write_doubled

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")


def _policies(server: Server) -> dict[int, int]:
    """Each task (thread) of the server process: its scheduling policy."""
    tasks = [int(name) for name in os.listdir(f"/proc/{server.process.pid}/task")]
    return {tid: os.sched_getscheduler(tid) for tid in tasks}


def _python_threads(server: Server) -> set[int]:
    """The server's threads that Python started: named as its main thread (grpcio's own threads name themselves)."""
    task = Path(f"/proc/{server.process.pid}/task")
    python = (task / str(server.process.pid) / "comm").read_text()
    return {int(tid.name) for tid in task.iterdir() if (tid / "comm").read_text() == python}


def _calls(server: Server, count: int) -> None:
    """`count` ModelInfer calls at once, each answered."""
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with ThreadPoolExecutor(count) as pool:
            replies = list(pool.map(lambda _: stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT), range(count)))
    assert all(reply.model_name == "simple" for reply in replies)


@pytest.mark.parametrize(("flags", "batch"), [((), True), (("--grpc-thread-scheduling", "normal"), False)])
def test_the_grpc_threads_run_under_the_policy_asked_for(tmp_path: Path, flags: tuple[str, ...], batch: bool) -> None:
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path, *flags, ready=["simple"])
    try:
        before = _policies(server)
        _calls(server, 4)
        after = _policies(server)
    finally:
        assert server.stop() == 0
    assert all(policy == os.SCHED_OTHER for policy in before.values())  # no gRPC thread yet: none changed
    started = {tid: policy for tid, policy in after.items() if tid not in before}
    assert started, "the calls started no thread"
    assert after[server.process.pid] == os.SCHED_OTHER  # the main thread (the event loop) keeps the default
    changed = {tid for tid, policy in after.items() if policy == os.SCHED_BATCH}
    if batch:
        assert changed and changed <= set(started), after  # only threads the calls started: the pool's
    else:
        assert not changed, after


@pytest.mark.parametrize(("flags", "policy"), [((), "SCHED_BATCH"), (("--grpc-thread-scheduling", "normal"),
                                                                     "SCHED_OTHER")])
def test_the_batch_timer_of_grpc_calls_runs_under_the_grpc_threads_policy(tmp_path: Path, flags: tuple[str, ...],
                                                                          policy: str) -> None:
    """A lone call to an inline model under dynamic batching is run by the batcher's timer thread once its delay
    ran out (`ArrivalBatcher`): that thread answers gRPC calls, and takes the gRPC threads' policy."""
    write_doubled(tmp_path / "models", max_batch_size=8, delay_us=1000)
    server = start_server(tmp_path / "models", tmp_path, *flags, ready=["doubled"])
    try:
        before = _python_threads(server)
        request = pb.ModelInferRequest(model_name="doubled")
        request.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
        request.raw_input_contents.append((4).to_bytes(4, "little"))
        with server.channel() as channel:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=TIMEOUT)
        assert int.from_bytes(reply.raw_output_contents[0], "little") == 8
        started = _python_threads(server) - before  # the timer: the call took no pool thread
        assert len(started) == 1, started
        assert os.sched_getscheduler(started.pop()) == getattr(os, policy)
    finally:
        assert server.stop() == 0


def test_an_unknown_policy_is_refused() -> None:
    """A policy that is neither batch nor normal (a Settings value from Python: the flag has choices) is an error
    at start-up, not the system's policy in silence."""
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="must be one of batch, normal, got 'Batch'"):
            threaded_server({"inference.GRPCInferenceService": {}}, {}, loop, 1, [], "Batch")
        assert threaded_server({"inference.GRPCInferenceService": {}}, {}, loop, 1, [], "normal") is not None
    finally:
        loop.close()
