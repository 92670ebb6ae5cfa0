"""The inference pipeline's one timer and its observers, driven through the data plane (no sockets).

What an observer is told (one record per request, one per model run) must be what the statistics extension
counts, phase by phase; failures carry their kind; a batch is one run; a decoupled model's time in the transport is
in no phase; a broken observer never fails a request. Timing checks are lower bounds set by the test's own sleeps
and equalities between two records of one run, never speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from oip.server import (
    DataPlane,
    InferRequest,
    InvalidRequest,
    Model,
    ModelFailure,
    ModelRepository,
    NotFound,
    RequestedOutput,
    Settings,
    Tensor,
    TensorSpec,
    TooLarge,
)
from oip.server.errors import ErrorKind
from oip.server.model import DynamicBatching
from oip.server.observe.events import PHASES, ExecutionRecord, InferenceRecord, Observer
from recorded import Recorder

pytestmark = pytest.mark.anyio

Arrays = dict[str, npt.NDArray[Any]]
SLEEP = 0.02  # seconds the test's models and consumers sleep: a lower bound for the phase that holds it


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Broken(Observer):
    def request_finished(self, record: InferenceRecord) -> None:
        raise RuntimeError("observer bug")

    def execution_finished(self, record: ExecutionRecord) -> None:
        raise RuntimeError("observer bug")


class Slow(Model):
    """A plain (threaded) model that sleeps SLEEP seconds; fails when asked to."""

    name = "slow"
    inputs = (TensorSpec("IN", "FP32", [2, -1]),)
    outputs = (TensorSpec("OUT", "FP32", [2, -1]),)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        time.sleep(SLEEP)
        if parameters.get("fail"):
            raise RuntimeError("asked to fail")
        return {"OUT": inputs["IN"] * 2}


class Batched(Model):
    name = "batched"
    inputs = (TensorSpec("IN", "INT64", [2]),)
    outputs = (TensorSpec("OUT", "INT64", [2]),)
    max_batch_size = 8

    def __init__(self) -> None:
        # The delay is long: the batch closes because it is full, never by waiting.
        super().__init__(dynamic_batching=DynamicBatching(max_queue_delay_microseconds=60_000_000))

    async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        await asyncio.sleep(SLEEP)
        return {"OUT": inputs["IN"] + 1}


class Tokens(Model):
    name = "tokens"
    decoupled = True
    inputs = (TensorSpec("N", "INT32", [1]),)
    outputs = (TensorSpec("I", "INT32", [1]),)

    async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> AsyncIterator[Any]:
        for i in range(int(inputs["N"][0])):
            yield {"I": [i]}


async def dataplane(*models: Model) -> tuple[DataPlane, Recorder]:
    repository = ModelRepository()
    for model in models:
        repository.add(model)
    await repository.load_all()
    dp = DataPlane(repository, Settings())
    recording = Recorder()
    dp.observers.append(recording)
    return dp, recording


def slow_request(request_id: str = "", **parameters: Any) -> InferRequest:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    return InferRequest("slow", id=request_id, inputs=[Tensor("IN", "FP32", [2, 3], data)], parameters=parameters)


async def test_one_record_per_request_with_its_phases_and_the_statistics_agree() -> None:
    dp, seen = await dataplane(Slow())
    before = time.time_ns()
    response = await dp.model_infer(slow_request("req-1"))
    assert response.outputs[0].data is not None and response.outputs[0].data.tolist() == [[0, 2, 4], [6, 8, 10]]

    [record] = seen.requests
    assert (record.model, record.version, record.request_id, record.batch_size) == ("slow", "1", "req-1", 1)
    assert record.ok and record.error is None and record.error_kind is None
    assert record.compute_infer_ns >= SLEEP * 1e9  # the model's sleep is in compute_infer
    phases = record.queue_ns + record.compute_input_ns + record.compute_infer_ns + record.compute_output_ns
    assert phases == record.total_ns  # nothing else happens in the data plane for a plain request
    assert before <= record.start_ns <= time.time_ns()
    # The spans: each phase once, in the order the request went through them, end to end.
    assert [span.phase for span in record.spans] == ["compute_input", "queue", "compute_infer", "compute_output"]
    assert record.spans[0].start_ns == record.start_ns
    for earlier, later in zip(record.spans, record.spans[1:], strict=False):
        assert earlier.end_ns == later.start_ns
    assert {span.phase: span.end_ns - span.start_ns for span in record.spans} == {
        phase: getattr(record, f"{phase}_ns") for phase in PHASES
    }
    # It ran alone: one execution with the request's own phases.
    assert seen.executions == [
        ExecutionRecord("slow", "1", 1, record.compute_input_ns, record.compute_infer_ns, record.compute_output_ns)
    ]

    # The statistics extension is an observer of the same records.
    stats = (await dp.model_statistics(_stats_request("slow"))).model_stats[0]
    infer = stats.inference_stats
    assert (infer.success.count, infer.success.ns) == (1, record.total_ns)
    assert (infer.queue.ns, infer.compute_input.ns, infer.compute_infer.ns, infer.compute_output.ns) == (
        record.queue_ns, record.compute_input_ns, record.compute_infer_ns, record.compute_output_ns
    )
    assert (stats.inference_count, stats.execution_count) == (1, 1)
    assert [(b.batch_size, b.compute_infer.ns) for b in stats.batch_stats] == [(1, record.compute_infer_ns)]


async def test_failures_are_recorded_with_their_kind_and_never_as_executions() -> None:
    dp, seen = await dataplane(Slow())
    with pytest.raises(ModelFailure, match="asked to fail"):
        await dp.model_infer(slow_request("bad-model", fail=True))
    wrong = InferRequest("slow", id="bad-shape", inputs=[Tensor("IN", "FP32", [3], np.zeros(3, np.float32))])
    with pytest.raises(InvalidRequest):
        await dp.model_infer(wrong)
    with pytest.raises(NotFound):  # no model version: refused before the pipeline, nothing recorded
        await dp.model_infer(InferRequest("nope"))

    assert [(r.request_id, r.ok, r.error_kind) for r in seen.requests] == [
        ("bad-model", False, ErrorKind.MODEL_FAILURE), ("bad-shape", False, ErrorKind.INVALID_ARGUMENT)
    ]
    assert seen.requests[0].error is not None and seen.requests[0].error.message == "asked to fail"
    assert seen.requests[0].compute_infer_ns >= SLEEP * 1e9  # it got as far as the model
    assert seen.executions == []
    infer = (await dp.model_statistics(_stats_request("slow"))).model_stats[0].inference_stats
    assert (infer.fail.count, infer.fail.ns) == (2, sum(r.total_ns for r in seen.requests))
    assert infer.success.count == 0


async def test_a_batch_is_one_execution_and_each_request_shares_its_run() -> None:
    dp, seen = await dataplane(Batched())
    rows = [1, 3, 4]  # 8 rows: a full batch
    requests = [
        InferRequest("batched", id=f"r{i}", inputs=[Tensor("IN", "INT64", [n, 2], np.full((n, 2), i, np.int64))],
                     outputs=[RequestedOutput("OUT")])
        for i, n in enumerate(rows)
    ]
    responses = await asyncio.wait_for(asyncio.gather(*(dp.model_infer(r) for r in requests)), 30)
    for i, (response, n) in enumerate(zip(responses, rows, strict=True)):
        assert response.outputs[0].data is not None and response.outputs[0].data.tolist() == [[i + 1] * 2] * n

    [execution] = seen.executions
    assert execution.batch_size == 8 and execution.compute_infer_ns >= SLEEP * 1e9
    records = {r.request_id: r for r in seen.requests}
    assert {rid: r.batch_size for rid, r in records.items()} == {"r0": 1, "r1": 3, "r2": 4}
    for record in records.values():
        assert record.compute_infer_ns == execution.compute_infer_ns  # the same model run
        assert [s.phase for s in record.spans] == ["compute_input", "queue", "compute_input", "compute_infer",
                                                   "compute_output"]
    stats = (await dp.model_statistics(_stats_request("batched"))).model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (8, 1)
    assert [b.batch_size for b in stats.batch_stats] == [8]


async def test_decoupled_time_in_the_transport_is_in_no_phase() -> None:
    dp, seen = await dataplane(Tokens())
    request = InferRequest("tokens", id="stream", inputs=[Tensor("N", "INT32", [1], np.array([3], np.int32))])
    answers = []
    async for answer in dp.pipeline.infer_decoupled(request):  # what a stream runs for each request
        answers.append(answer)
        await asyncio.sleep(SLEEP)  # the transport is slow to take each response
    assert [a.outputs[0].data.tolist() for a in answers if a.outputs[0].data is not None] == [[0], [1], [2]]
    assert [a.parameters for a in answers] == [{"triton_final_response": False}] * 3  # the model gave none

    [record] = seen.requests
    assert record.ok and record.request_id == "stream"
    phases = record.queue_ns + record.compute_input_ns + record.compute_infer_ns + record.compute_output_ns
    assert record.total_ns - phases >= 3 * SLEEP * 1e9  # at least the three waits for the transport
    assert [s.phase for s in record.spans] == ["compute_input"] + ["compute_infer", "compute_output"] * 3 + [
        "compute_infer"
    ]
    assert all(b.start_ns - a.end_ns >= SLEEP * 1e9 for a, b in zip(record.spans[2::2], record.spans[3::2],
                                                                     strict=False))
    [execution] = seen.executions
    assert (execution.batch_size, execution.compute_infer_ns) == (1, record.compute_infer_ns)

    answers = [a async for a in dp.model_stream_infer(_once(request))]  # through the stream as well
    assert len(answers) == 3 and len(seen.requests) == 2 and seen.requests[1].ok


async def _once(request: InferRequest) -> AsyncIterator[InferRequest | Exception]:
    yield request


class Busy(Model):
    """Decoupled and never awaiting: N responses, each after `work` seconds that hold the event loop."""

    name = "busy"
    decoupled = True
    inputs = (TensorSpec("N", "INT32", [1]),)
    outputs = (TensorSpec("I", "INT32", [1]),)
    work = 0.0

    async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> AsyncIterator[Any]:
        for i in range(int(inputs["N"][0])):
            time.sleep(self.work)
            yield {"I": np.array([i], np.int32)}


async def _turns_during_stream(dp: DataPlane, count: int) -> int:
    """The turns another task of the event loop got while a stream of `count` responses of `busy` was made."""
    turns, streaming = 0, True

    async def other() -> None:
        nonlocal turns
        while streaming:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    before = turns
    request = InferRequest("busy", inputs=[Tensor("N", "INT32", [1], np.array([count], np.int32))])
    answers = [answer async for answer in dp.pipeline.infer_decoupled(request)]
    during, streaming = turns - before, False
    await task
    assert [a.outputs[0].data.tolist() for a in answers if a.outputs[0].data is not None] == [[i] for i in
                                                                                              range(count)]
    return during


async def test_a_generator_that_never_awaits_gives_the_loop_a_turn_once_it_held_it_for_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from oip.server.core import pipeline

    model = Busy()
    dp, _ = await dataplane(model)
    model.work = 2 * pipeline._LOOP_TURN_NS / 1e9  # every response takes longer than a turn: a turn after each
    assert await _turns_during_stream(dp, 5) >= 4
    model.work = 0.0
    monkeypatch.setattr(pipeline, "_LOOP_TURN_NS", 10**12)  # no response is late: the stream keeps the loop
    assert await _turns_during_stream(dp, 50) == 0


async def test_a_broken_observer_never_fails_a_request() -> None:
    dp, seen = await dataplane(Slow())
    dp.observers.insert(0, Broken())
    response = await dp.model_infer(slow_request("ok"))
    assert response.outputs[0].name == "OUT"
    assert [r.request_id for r in seen.requests] == ["ok"] and len(seen.executions) == 1
    assert dp.statistics.for_model("slow", "1").success.count == 1


async def test_a_raw_binary_request_gets_its_shape_from_the_model() -> None:
    dp, seen = await dataplane(Slow(), Tokens())
    body = np.arange(8, dtype=np.float32).tobytes()  # IN is [2, -1]: 8 elements are [2, 4]
    response = await dp.model_infer(InferRequest("slow", raw_input=body))
    out = response.outputs[0]
    assert out.shape == [2, 4] and out.data is not None and out.data.tolist() == [[0, 2, 4, 6], [8, 10, 12, 14]]
    with pytest.raises(InvalidRequest, match="does not fit input 'IN'"):
        await dp.model_infer(InferRequest("slow", raw_input=body[:-4]))  # 7 elements: not [2, k]
    small = DataPlane(dp.repository, dataclasses.replace(dp.settings, max_tensor_elements=4))  # settings are frozen
    small.observers.append(seen)
    with pytest.raises(TooLarge, match="8 elements"):
        await small.model_infer(InferRequest("slow", raw_input=body))
    assert [(r.ok, r.error_kind) for r in seen.requests] == [
        (True, None), (False, ErrorKind.INVALID_ARGUMENT), (False, ErrorKind.TOO_LARGE)
    ]


def _stats_request(name: str) -> Any:
    from oip.grpc import grpc_service_pb2 as pb

    return pb.ModelStatisticsRequest(name=name, version="1")
