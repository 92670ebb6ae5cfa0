"""Triton's dynamic batching against the generated server, and the batching queue's rules in process.

Over the wire: concurrent callers each get their own rows back, a model that costs per call runs fewer times than
it is asked (statistics), requests whose shapes or parameters differ never share a call, requested outputs stay per
request. In process, through the data plane, where timing is under the test's control: a batch fills within the
delay, closes early when full or at a preferred size, separates shapes, parameters and failures, forms under load
without delay, and survives a cancelled caller.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from oip.server import (
    DataPlane,
    InferRequest,
    InferResponse,
    Model,
    ModelRepository,
    OipError,
    RequestedOutput,
    Settings,
    Tensor,
    TensorSpec,
)
from oip.server.core.thread_batching import ArrivalBatcher, ThreadBatcher
from oip.server.errors import ErrorKind
from oip.server.model import DynamicBatching
from serving import TIMEOUT, Server, assert_error_body
from stream_batch_models import serve_models, triton_grpc_client, triton_http_client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


@pytest.fixture
def triton_grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    with triton_grpc_client(server) as client:
        yield client


@pytest.fixture
def triton_http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    with triton_http_client(server) as client:
        yield client


# --- dynamic batching over the wire ----------------------------------------------------------------------------


def counter_stats(http: httpx.Client, model: str = "counter") -> dict[str, Any]:
    stats: dict[str, Any] = http.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return stats


def test_batching_under_concurrent_load(http: httpx.Client, triton_http: httpclient.InferenceServerClient) -> None:
    """64 requests in flight at once (tritonclient's async_infer, 16 connections), 1 or 2 rows each: everyone
    gets their own rows back; the model ran fewer times than it was asked."""
    before = counter_stats(http)
    pending = []
    for i in range(64):
        rows = 1 + i % 2
        x = (np.arange(rows * 4, dtype=np.int32).reshape(rows, 4) + 1000 * i).astype(np.int32)
        tensor = httpclient.InferInput("INPUT0", [rows, 4], "INT32")
        tensor.set_data_from_numpy(x, binary_data=i % 3 == 0)
        pending.append((i, x, triton_http.async_infer("counter", [tensor], request_id=f"r{i}")))
    for i, x, call in pending:
        result = call.get_result(timeout=TIMEOUT)
        assert result.get_response()["id"] == f"r{i}"
        assert result.as_numpy("DOUBLE").tolist() == (x * 2).tolist()
        assert result.as_numpy("ROWSUM").tolist() == x.sum(axis=1, keepdims=True).tolist()
    after = counter_stats(http)
    requests = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 64 and inferences == 96
    assert executions < requests, (executions, requests)
    assert any(b["batch_size"] > 2 for b in after["batch_stats"]), after["batch_stats"]
    assert all(b["batch_size"] <= 8 for b in after["batch_stats"])


def test_batching_keeps_parameters_and_outputs_per_request(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """Different parameters never share a call; each request gets the outputs it asked for, no others."""

    def call(i: int) -> None:
        x = np.full((1, 4), i, dtype=np.int32)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
        tensor.set_data_from_numpy(x)
        scale = 2 + i % 3
        wanted = [["DOUBLE"], ["ROWSUM"], ["ROWSUM", "DOUBLE"], []][i % 4]
        outputs = [grpcclient.InferRequestedOutput(name) for name in wanted] or None
        result = triton_grpc.infer("counter", [tensor], outputs=outputs, parameters={"scale": scale})
        names = [o.name for o in result.get_response().outputs]
        assert names == (wanted or ["DOUBLE", "ROWSUM"])
        if "DOUBLE" in names:
            assert result.as_numpy("DOUBLE").tolist() == (x * scale).tolist()
        if "ROWSUM" in names:
            assert result.as_numpy("ROWSUM").tolist() == [[4 * i]]

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(call, range(48)))


def test_batching_shapes_that_cannot_batch_run_alone(http: httpx.Client) -> None:
    """Requests of different lengths arrive together: each runs in a call of its own, and is answered right."""
    before = counter_stats(http, "ragged")
    barrier = threading.Barrier(6)

    def call(length: int) -> None:
        data = [float(length)] * length
        barrier.wait(timeout=TIMEOUT)
        with httpx.Client(base_url=str(http.base_url), timeout=TIMEOUT, trust_env=False) as client:
            body = {"inputs": [{"name": "INPUT0", "shape": [1, length], "datatype": "FP32", "data": data}]}
            response = client.post("/v2/models/ragged/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [length + 1.0] * length

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(call, range(1, 7)))
    after = counter_stats(http, "ragged")
    assert after["execution_count"] - before["execution_count"] == 6
    assert after["inference_count"] - before["inference_count"] == 6


def test_batching_rejects_too_many_rows(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [9, 4], "datatype": "INT32", "data": list(range(36))}]}
    assert_error_body(http.post("/v2/models/counter/infer", json=body), 400)


# --- dynamic batching in-process: the queue's rules ------------------------------------------------------------


class Recorder(Model):
    """Batches; records the row count of every call; OUT = IN + 1 (`delay` seconds per call)."""

    name = "recorder"
    inputs = (TensorSpec("IN", "INT64", [-1]),)
    outputs = (TensorSpec("OUT", "INT64", [-1]),)
    max_batch_size = 8

    def __init__(self, delay_us: int = 0, preferred: tuple[int, ...] = (), gated: bool = False) -> None:
        super().__init__(dynamic_batching=DynamicBatching(delay_us, preferred))
        self.calls: list[int] = []
        self.entered = asyncio.Event()  # set when a call starts
        self.gate = asyncio.Event()  # a gated model's calls wait for it
        if not gated:
            self.gate.set()

    async def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(int(inputs["IN"].shape[0]))
        self.entered.set()
        await self.gate.wait()
        if parameters.get("fail"):
            raise RuntimeError("asked to fail")
        return {"OUT": inputs["IN"] + 1}


async def dataplane(model: Model) -> DataPlane:
    repository = ModelRepository()
    repository.add(model)
    await repository.load_all()
    return DataPlane(repository, Settings())


def rows_request(start: int, rows: int = 1, width: int = 2, **parameters: Any) -> InferRequest:
    data = np.arange(start, start + rows * width, dtype=np.int64).reshape(rows, width)
    return InferRequest("recorder", inputs=[Tensor("IN", "INT64", [rows, width], data)], parameters=parameters,
                        outputs=[RequestedOutput("OUT")])


def check(response: InferResponse | BaseException, request: InferRequest) -> None:
    assert isinstance(response, InferResponse), response
    data = response.outputs[0].data
    assert data is not None and request.inputs[0].data is not None
    assert data.tolist() == (request.inputs[0].data + 1).tolist()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_queue_fills_a_batch_within_the_delay() -> None:
    model = Recorder(delay_us=200_000)
    dp = await dataplane(model)
    requests = [rows_request(10 * i, rows=1 + i % 2) for i in range(5)]  # 1+2+1+2+1 = 7 rows
    responses = await asyncio.gather(*(dp.model_infer(r) for r in requests))
    for response, request in zip(responses, requests, strict=True):
        check(response, request)
    assert model.calls == [7]
    stats = dp.statistics.for_model("recorder", "1")
    assert (stats.execution_count, stats.inference_count, stats.success.count) == (1, 7, 5)


@pytest.mark.anyio
async def test_queue_closes_a_full_batch_and_a_preferred_one_early() -> None:
    model = Recorder(delay_us=3_600_000_000, preferred=(4,))  # an hour: a batch that waited for it never returns
    dp = await dataplane(model)
    full = [rows_request(i) for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*(dp.model_infer(r) for r in full)), 60)
    assert model.calls == [8]
    preferred = [rows_request(i, rows=2) for i in range(3)]  # 6 rows: the first 4 go at once
    waiting = [asyncio.ensure_future(dp.model_infer(r)) for r in preferred]
    responses = await asyncio.wait_for(asyncio.gather(*waiting[:2]), 60)
    for response, request in zip(responses, preferred, strict=False):
        check(response, request)
    assert model.calls == [8, 4] and not waiting[2].done()
    waiting[2].cancel()


@pytest.mark.anyio
async def test_queue_closes_a_batch_the_next_request_does_not_fit() -> None:
    """Two requests of 3 rows wait for a third of 3 that would make 9 of 8: the batch cannot grow, so it goes at
    once with 6 rows, not after its delay (an hour), and the third waits for a batch of its own."""
    model = Recorder(delay_us=3_600_000_000)
    dp = await dataplane(model)
    requests = [rows_request(10 * i, rows=3) for i in range(3)]
    waiting = [asyncio.ensure_future(dp.model_infer(r)) for r in requests]
    responses = await asyncio.wait_for(asyncio.gather(*waiting[:2]), 30)
    for response, request in zip(responses, requests, strict=False):
        check(response, request)
    assert model.calls == [6] and not waiting[2].done()
    waiting[2].cancel()


@pytest.mark.anyio
@pytest.mark.parametrize(("preferred", "calls"), [((), [8]), ((4,), [4])])
async def test_queue_is_woken_by_the_arrival_that_makes_its_batch_due(preferred: tuple[int, ...],
                                                                     calls: list[int]) -> None:
    """Requests arriving one by one while the batch waits for its delay (an hour): the one that fills it, or makes a
    preferred size, sends it at once."""
    model = Recorder(delay_us=3_600_000_000, preferred=preferred)
    dp = await dataplane(model)
    requests = [rows_request(10 * i) for i in range(calls[0])]
    waiting = []
    for request in requests:
        waiting.append(asyncio.ensure_future(dp.model_infer(request)))
        for _ in range(20):  # it reaches the queue, and the batcher goes back to waiting
            await asyncio.sleep(0)
        assert model.calls == [] or request is requests[-1]
    responses = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    for response, request in zip(responses, requests, strict=True):
        check(response, request)
    assert model.calls == calls


@pytest.mark.parametrize(("preferred", "calls"), [((), [8]), ((4,), [4])])
def test_thread_queue_is_woken_by_the_arrival_that_makes_its_batch_due(preferred: tuple[int, ...],
                                                                      calls: list[int]) -> None:
    """`ThreadBatcher`, as the gRPC threads use it: the first request leads and waits for its delay (an hour); each
    other arrives in a thread of its own once the leader waits, and the one that fills the batch (or makes a
    preferred size) wakes it."""
    model = Recorder(delay_us=3_600_000_000, preferred=preferred)
    batcher = ThreadBatcher()
    ran: list[int] = []

    def run(_: Any, inputs: dict[str, Any], parameters: dict[str, Any]) -> tuple[Any, int, int]:
        ran.append(int(inputs["IN"].shape[0]))
        return {"OUT": inputs["IN"] + 1}, 0, 0

    shares: dict[int, Any] = {}

    def call(i: int) -> None:
        shares[i] = batcher.infer(model, {"IN": np.full((1, 2), i, dtype=np.int64)}, {}, run)

    # Daemon threads: a batch never woken leaves its threads waiting for the hour, not the test.
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(calls[0])]
    for i, thread in enumerate(threads):
        thread.start()
        deadline = time.monotonic() + TIMEOUT
        while i < len(threads) - 1 and not any(queue.waiter is not None for queue in batcher._queues.values()):
            assert time.monotonic() < deadline, "the leader never waited"
            time.sleep(0.001)
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert sorted(shares) == list(range(calls[0])), "a batch was not sent when it became due"
    assert ran == calls
    for i, (share, *_) in shares.items():
        assert share[0]["OUT"].tolist() == [[i + 1, i + 1]]


class _Arrivals:
    """An `ArrivalBatcher` over a `Recorder`, as the gRPC polling thread uses it: each request added with what to
    call with its share; the runs (rows, thread) and the answers (by request) recorded."""

    def __init__(self, delay_us: int, preferred: tuple[int, ...] = ()) -> None:
        self.model = Recorder(delay_us=delay_us, preferred=preferred)
        self.batcher = ArrivalBatcher()
        self.ran: list[tuple[int, str]] = []
        self.answers: dict[int, Any] = {}
        self.answered = threading.Semaphore(0)

    def run(self, _: Any, inputs: dict[str, Any], parameters: dict[str, Any]) -> tuple[Any, int, int]:
        self.ran.append((int(inputs["IN"].shape[0]), threading.current_thread().name))
        if parameters.get("fail"):
            raise RuntimeError("asked to fail")
        return {"OUT": inputs["IN"] + 1}, 0, 0

    def add(self, i: int, width: int = 2, raising: bool = False, **parameters: Any) -> None:
        """Request `i` (its rows all `i`); `raising`: its answer raises once recorded."""
        def done(share: Any, error: BaseException | None) -> None:
            self.answers[i] = error if share is None else share[0][0]["OUT"].tolist()
            self.answered.release()
            if raising:
                raise RuntimeError("a broken answer")

        self.batcher.add(self.model, {"IN": np.full((1, width), i, dtype=np.int64)}, parameters, self.run, done)

    def wait(self, count: int) -> None:
        for _ in range(count):
            assert self.answered.acquire(timeout=TIMEOUT), f"unanswered: {self.answers}"


def test_arrival_queue_runs_the_batch_an_arrival_completes_in_that_thread() -> None:
    """Seven requests wait (the delay is an hour); the eighth fills the batch and runs it at once, in the thread
    that added it, each request handed its own rows (the first one's answer raises: the others are answered)."""
    arrivals = _Arrivals(delay_us=3_600_000_000)
    for i in range(7):
        arrivals.add(i, raising=i == 0)
    assert arrivals.ran == [] and arrivals.answers == {}
    arrivals.add(7)
    assert arrivals.ran == [(8, threading.current_thread().name)]
    assert arrivals.answers == {i: [[i + 1, i + 1]] for i in range(8)}


def test_arrival_queue_closes_a_preferred_size_and_separates_shapes() -> None:
    arrivals = _Arrivals(delay_us=3_600_000_000, preferred=(2,))
    arrivals.add(0)
    arrivals.add(1, width=3)  # another shape: a batch of its own
    assert arrivals.ran == []
    arrivals.add(2)  # makes the preferred size of the first shape
    assert [rows for rows, _ in arrivals.ran] == [2] and sorted(arrivals.answers) == [0, 2]
    arrivals.add(3, width=3)
    assert [rows for rows, _ in arrivals.ran] == [2, 2] and arrivals.answers[3] == [[4, 4, 4]]


def test_arrival_queue_leaves_a_due_batch_to_its_timer_and_answers_every_request() -> None:
    """With a delay of 1 ms nothing completes a batch: the timer thread runs each one; a failing batch hands each
    of its requests the error, and the timer goes on after an answer that raises."""
    arrivals = _Arrivals(delay_us=1_000)
    arrivals.add(0)
    arrivals.wait(1)
    assert arrivals.ran == [(1, "oip-batch-timer")] and arrivals.answers == {0: [[1, 1]]}
    arrivals.add(1, raising=True, fail=True)
    arrivals.add(2, raising=True, fail=True)
    arrivals.wait(2)
    assert all(isinstance(arrivals.answers[i], RuntimeError) for i in (1, 2)), arrivals.answers
    arrivals.add(3)
    arrivals.wait(1)
    assert arrivals.answers[3] == [[4, 4]]
    assert {thread for _, thread in arrivals.ran} == {"oip-batch-timer"}


@pytest.mark.anyio
async def test_queue_separates_shapes_parameters_and_failures() -> None:
    model = Recorder(delay_us=100_000)
    dp = await dataplane(model)
    requests = [rows_request(0, width=2), rows_request(5, width=3), rows_request(9, width=2),
                rows_request(20, width=2, mode="a"), rows_request(30, width=2, mode="a"),
                rows_request(40, width=2, fail=True)]
    results = await asyncio.gather(*(dp.model_infer(r) for r in requests), return_exceptions=True)
    for result, request in zip(results[:5], requests, strict=False):
        check(result, request)
    failure = results[5]
    assert isinstance(failure, OipError) and failure.kind is ErrorKind.MODEL_FAILURE
    assert "asked to fail" in failure.message
    assert sorted(model.calls) == [1, 1, 2, 2]  # width 3 alone, fail=True alone, two pairs


@pytest.mark.anyio
async def test_queue_forms_batches_under_load_without_delay() -> None:
    """With no delay, the first request runs at once and the ones arriving meanwhile go together next."""
    model = Recorder(delay_us=0, gated=True)
    dp = await dataplane(model)
    first = asyncio.ensure_future(dp.model_infer(rows_request(0)))
    await asyncio.wait_for(model.entered.wait(), 30)  # the first request runs, alone
    rest = [rows_request(i) for i in range(1, 6)]
    waiting = [asyncio.ensure_future(dp.model_infer(r)) for r in rest]
    for _ in range(20):  # let them all reach the queue (no clock: the loop runs each ready task once per turn)
        await asyncio.sleep(0)
    model.gate.set()
    responses = await asyncio.gather(*waiting)
    check(await first, rows_request(0))
    for response, request in zip(responses, rest, strict=True):
        check(response, request)
    assert model.calls == [1, 5]


@pytest.mark.anyio
async def test_queue_survives_a_cancelled_caller() -> None:
    model = Recorder(delay_us=100_000)
    dp = await dataplane(model)
    doomed = asyncio.ensure_future(dp.model_infer(rows_request(0)))
    for _ in range(20):  # it reaches the queue, where it waits for the delay
        await asyncio.sleep(0)
    doomed.cancel()
    kept = rows_request(7)
    check(await dp.model_infer(kept), kept)
    assert model.calls == [1]
