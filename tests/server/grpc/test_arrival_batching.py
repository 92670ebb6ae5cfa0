"""gRPC calls to an inline model under dynamic batching are batched where they arrive (`ArrivalBatcher`): grpcio's
polling thread queues each call and goes on, the arrival that completes a batch runs it, and a batch whose delay ran
out is run by the batcher's timer thread. No call takes a pool thread or a model slot; every call gets its own rows,
or its batch's error; the statistics count one execution per batch.

The models answer, per row, the input plus one, the name of the thread they ran on and the rows of the batch; any
negative input fails the batch.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, Server, start_server

MODEL = '''
import threading

import numpy as np

from oip.server.model import Model, TensorSpec


class Rows(Model):
    inputs = [TensorSpec("IN", "INT32", [1])]
    outputs = [TensorSpec("OUT", "INT32", [1]), TensorSpec("THREAD", "BYTES", [1]), TensorSpec("ROWS", "INT32", [1])]
    inline = True

    def infer(self, inputs, parameters):
        given = inputs["IN"]
        if (given < 0).any():
            raise ValueError("a negative input")
        rows = given.shape[0]
        name = threading.current_thread().name.encode()
        return {"OUT": given + 1, "THREAD": np.array([[name]] * rows, dtype=object),
                "ROWS": np.full((rows, 1), rows, dtype=np.int32)}
'''
# `sized`: a batch is run by the arrival that fills it (its delay, a minute, never runs out in a test); `timed`: a
# lone call's batch is run by the timer once its 2 ms are over.
MODELS = {"sized": (4, 60_000_000), "timed": (8, 2_000)}
POOL = "oip-grpc_"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("arrival")
    repository = workdir / "models"
    for name, (size, delay) in MODELS.items():
        folder = repository / name
        folder.mkdir(parents=True)
        (folder / "model.toml").write_text(f'class = "model:Rows"\nmax_batch_size = {size}\n'
                                           f"[dynamic_batching]\nmax_queue_delay_microseconds = {delay}\n")
        (folder / "model.py").write_text(textwrap.dedent(MODEL))
    # One pool thread and one model slot: four calls batched in pool threads could never meet.
    server = start_server(repository, workdir, "--grpc-threads", "1", "--model-threads", "1", "--access-log",
                          "--log-format", "json", ready=list(MODELS))
    try:
        yield server
    finally:
        server.stop()


def _call(stub: pb_grpc.GRPCInferenceServiceStub, model: str, value: int, general: bool = False) -> tuple[int, str,
                                                                                                          int]:
    """One call of `value`: the model's OUT, THREAD and ROWS for it. `general`: a request the lean way leaves to
    the general way (an output asked for with a parameter)."""
    request = pb.ModelInferRequest(model_name=model, id=f"call-{value}")
    request.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
    if general:
        request.outputs.add(name="OUT").parameters["binary_data"].bool_param = True
        request.outputs.add(name="THREAD")
        request.outputs.add(name="ROWS")
    request.raw_input_contents.append(value.to_bytes(4, "little", signed=True))
    reply = stub.ModelInfer(request, timeout=TIMEOUT)
    assert reply.id == f"call-{value}"
    out = {tensor.name: raw for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)}
    thread = codec.from_raw(out["THREAD"], "BYTES", [1, 1])[0][0]
    return (int.from_bytes(out["OUT"], "little", signed=True), thread.decode(),
            int.from_bytes(out["ROWS"], "little", signed=True))


def _stats(server: Server, model: str) -> dict[str, Any]:
    with server.http_client() as http:
        stats: dict[str, Any] = http.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return stats


def _concurrently(server: Server, model: str, values: list[int]) -> list[Any]:
    """Each value's call at once, on a channel each; each call's answer or its RpcError."""
    def one(value: int) -> Any:
        with server.channel() as channel:
            try:
                return _call(pb_grpc.GRPCInferenceServiceStub(channel), model, value)
            except grpc.RpcError as exc:
                return exc

    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(one, values))


def test_the_arrival_that_fills_a_batch_runs_it(server: Server) -> None:
    before = _stats(server, "sized")
    values = [10, 20, 30, 40]
    answers = _concurrently(server, "sized", values)
    assert [answer[0] for answer in answers] == [value + 1 for value in values], answers
    # One batch of all four, run by grpcio's polling thread (its `_serve` loop) as the fourth call arrived.
    assert {answer[2] for answer in answers} == {4}, answers
    threads = {answer[1] for answer in answers}
    assert len(threads) == 1 and threads.pop().endswith("(_serve)"), answers
    after = _stats(server, "sized")
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4


def test_a_batch_whose_delay_ran_out_is_run_by_the_timer(server: Server) -> None:
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answers = [_call(stub, "timed", value) for value in (1, 2, 3)]
    assert answers == [(2, "oip-batch-timer", 1), (3, "oip-batch-timer", 1), (4, "oip-batch-timer", 1)]


def test_a_failing_batch_fails_each_of_its_calls_and_the_server_goes_on(server: Server) -> None:
    before = _stats(server, "sized")
    answers = _concurrently(server, "sized", [1, -1, 2, 3])
    for answer in answers:
        assert isinstance(answer, grpc.RpcError), answers
        assert answer.code() is grpc.StatusCode.INTERNAL and "a negative input" in (answer.details() or "")
    after = _stats(server, "sized")
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 4
    assert after["inference_count"] == before["inference_count"]  # a failed request is no inference done
    answers = _concurrently(server, "sized", [5, 6, 7, 8])
    assert [answer[0] for answer in answers] == [6, 7, 8, 9], answers


def test_a_request_for_the_general_way_still_batches_and_is_answered(server: Server) -> None:
    """An output asked for with a parameter is the general way's: the call goes to the pool's thread, and on to
    the event loop's batcher, as before."""
    with server.channel() as channel:
        out, thread, rows = _call(pb_grpc.GRPCInferenceServiceStub(channel), "timed", 41, general=True)
    assert (out, rows) == (42, 1)
    assert thread != "oip-batch-timer" and not thread.endswith("(_serve)")


def test_calls_batched_on_arrival_take_no_pool_thread(server: Server) -> None:
    """With the only pool thread held by a call waiting on the event loop (a `sized` call of the general way,
    whose batch cannot fill), four calls still meet in one batch where they arrive."""
    held: list[Any] = []

    def hold() -> None:
        with server.channel() as channel:
            try:
                held.append(_call(pb_grpc.GRPCInferenceServiceStub(channel), "sized", 99, general=True))
            except grpc.RpcError as exc:
                held.append(exc)

    before = _stats(server, "sized")
    caller = threading.Thread(target=hold, daemon=True)  # its batch waits for its delay (a minute)
    caller.start()
    time.sleep(1.0)  # its request in, its thread waiting on the loop
    answers = _concurrently(server, "sized", [100, 200, 300, 400])
    assert [answer[0] for answer in answers] == [101, 201, 301, 401], answers
    assert all(not answer[1].startswith(POOL) for answer in answers), answers
    after = _stats(server, "sized")
    assert after["inference_count"] - before["inference_count"] == 4  # the held call is still queued
    assert caller.is_alive() and not held
    # Three REST calls fill the held call's batch on the event loop (the pool's thread is still held): all four
    # are answered.
    def rest(value: int) -> Any:
        with server.http_client() as http:
            body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
                    "outputs": [{"name": "OUT"}]}
            return http.post("/v2/models/sized/infer", json=body).json()["outputs"][0]["data"]

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(rest, [1, 2, 3])) == [[2], [3], [4]]
    caller.join(TIMEOUT)
    assert [answer[0] for answer in held] == [100], held


def test_a_call_batched_where_it_arrived_leaves_nothing_current_for_the_next_calls(server: Server) -> None:
    """What the polling thread does for a call it batches runs in the call's own context (grpcio's), not in the
    polling thread's, which later calls' contexts are copied from: a call after it that fails in decoding, before
    it is a request, logs no request id, not the batched call's."""
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert _call(stub, "timed", 7) == (8, "oip-batch-timer", 1)
        bad = pb.ModelInferRequest(model_name="timed", id="bad")
        bad.inputs.add(name="IN", datatype="INT32", shape=[1, 1]).contents.int_contents[:] = [1, 2, 3]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(bad, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = [json.loads(line) for line in server.log_text().splitlines() if line.startswith("{")]
        access = [(line["status"], line.get("request_id")) for line in lines
                  if line.get("logger") == "oip.access" and line.get("operation") == "ModelInfer"]
        if access[-2:] == [("OK", "call-7"), ("INVALID_ARGUMENT", None)] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert access[-2:] == [("OK", "call-7"), ("INVALID_ARGUMENT", None)], access[-4:]

