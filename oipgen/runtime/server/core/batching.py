"""Dynamic batching: concurrent requests to one model merged into one `infer` call.

A model that declares `dynamic_batching` (and `max_batch_size >= 1`) gets one queue per served version. The data
plane validates each request as usual, then hands its input arrays (batch dimension first, 1..max_batch_size
rows) and its parameters to the queue and awaits its own share of the answer. The queue forms batches in arrival
order, one at a time per model version, as Triton's dynamic batcher does with one model instance:

- requests batch together only when every input has the same dtype and the same shape after the batch dimension,
  and the request parameters are equal (the model gets one `parameters` mapping per call); a request that matches
  no other runs alone;
- a batch closes as soon as it holds `max_batch_size` rows (or the next request that could join it does not fit),
  or as soon as its first requests make up one of the `preferred_batch_size` (the largest such), or when its oldest
  request has waited `max_queue_delay_microseconds`; with a delay of 0, whatever accumulated while the previous
  batch ran goes at once, so batches form by themselves under load;
- the inputs are concatenated on the first axis (numpy), the model runs once, and every output is split back on
  the first axis by each request's row count (views, no copies).
- requests on the event loop batch there (`Batcher`); requests that wait in threads of their own (the gRPC
  threads' lean way, for a plain `infer`) batch among themselves in those threads (`ThreadBatcher`); requests no
  thread waits for (gRPC calls to an inline model, answered by the polling thread their request arrived on) batch
  where they arrive (`ArrivalBatcher`), by the same rules (those two: `thread_batching`). An output whose first
  dimension is not the batch's row count fails every request of the batch (model failure), as does an exception
  in the model.

Each request then goes on through the data plane like any other: its requested outputs, their order and their
parameters (shared memory, classification, binary data) apply to its own rows. Each model call is reported as one
execution (with the batch size, `observe.events.ExecutionRecord`); each request as usual, with its queue time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import ModelFailure
from ..model import Model
from ..observe.events import ExecutionRecord

__all__ = ["Arrays", "BatchResult", "Batcher", "Done", "Entry", "Report", "RunModel", "Share", "Watch", "batch_key",
           "batch_rows", "form_batch", "is_batching", "merge_inputs", "new_entry", "split_result", "take_batch"]

Arrays = dict[str, npt.NDArray[Any]]
BatchResult = tuple[dict[str, Any], dict[str, Any]]  # (outputs of one request, response parameters)
Share = tuple[BatchResult, int, int, int]  # a request's result, and when its batch formed, the model started, ended

_NS_PER_US: Final = 1000

RunModel = Callable[[Model, Arrays, dict[str, Any]], Awaitable[tuple[Any, int, int]]]
"""How the batcher calls the model (`Pipeline.run`): the result, and when the call started and ended."""
Report = Callable[[ExecutionRecord], None]
"""Where the batcher reports each model run (`Pipeline` passes it to the observers)."""
Done = Callable[[Share | None, BaseException | None], None]
"""What `thread_batching.ArrivalBatcher` calls with a request's share of its batch, or the error that failed it."""


def is_batching(model: Model) -> bool:
    """Whether requests to `model` go through the dynamic batcher (decoupled models never do)."""
    return (
        getattr(model, "dynamic_batching", None) is not None
        and model.max_batch_size >= 1
        and not getattr(model, "decoupled", False)
    )


def batch_rows(inputs: Mapping[str, npt.NDArray[Any]]) -> int | None:
    """The request's batch size: the first dimension shared by every input; None when there is none."""
    rows: int | None = None
    for array in inputs.values():
        if array.ndim == 0:
            return None
        if rows is None:
            rows = int(array.shape[0])
        elif int(array.shape[0]) != rows:
            return None
    return rows


def batch_key(inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]) -> Hashable:
    """Requests with equal keys can share a model call: same inputs with the same dtype and shape after the
    batch dimension, and equal parameters (compared with their types: 1, 1.0 and true differ)."""
    tensors = sorted([(name, array.dtype, array.shape[1:]) for name, array in inputs.items()])  # names differ
    if not parameters:
        return tuple(tensors)
    return tuple(tensors), tuple(sorted((key, type(value).__name__, value) for key, value in parameters.items()))


@dataclass(slots=True, eq=False)
class Entry:
    inputs: Arrays
    parameters: dict[str, Any]
    rows: int
    key: Hashable
    arrived: int
    # Awaited on the loop (`Batcher`); None for a request waiting in a thread (`ThreadBatcher`), which is handed its
    # `share` or `error` and woken (`wake` released), or woken to lead the next batch (`lead`), and for one nobody
    # waits for (`ArrivalBatcher`), whose `done` is called with its share or error
    future: asyncio.Future[Share] | None
    wake: threading.Lock | None = None
    done: Done | None = None
    share: Share | None = None
    error: BaseException | None = None
    lead: bool = False

    def waiting(self) -> bool:
        """Whether the request still waits for its share (not cancelled, not answered)."""
        future = self.future
        if future is None:
            return self.share is None and self.error is None
        return not future.done()


def new_entry(inputs: Arrays, parameters: dict[str, Any], future: asyncio.Future[Share] | None,
              rows: int | None = None, key: Hashable | None = None) -> Entry:
    """A request's entry in a queue. `rows` and `key`, when the caller knows them (the lean way's plan), are what
    `batch_rows` and `batch_key` would make of the request."""
    if rows is None:
        rows = batch_rows(inputs)
    if rows is not None and key is None:
        key = batch_key(inputs, parameters)
    return Entry(
        inputs=inputs,
        parameters=parameters,
        rows=rows if rows is not None else 0,
        key=key if rows is not None else object(),  # no batch size: runs alone
        arrived=time.perf_counter_ns(),
        future=future,
    )


class Watch:
    """The batch a queue waits to fill: the key of the request at its head and the rows of that key pending. An
    arrival wakes the waiter only when it makes that batch due before its delay (full, or a preferred size), not
    on every arrival: waking to find the batch still short is the batcher's main cost under load."""

    __slots__ = ("key", "limit", "preferred", "rows")

    def __init__(self, model: Model) -> None:
        settings = model.dynamic_batching
        self.limit = model.max_batch_size
        self.preferred = frozenset(settings.preferred_batch_size) if settings is not None else frozenset()
        self.key: Hashable = None  # None: nothing waits
        self.rows = 0

    def wait_for(self, pending: deque[Entry]) -> None:
        """Watch the batch the head of `pending` forms (found not due yet)."""
        head = pending[0]
        self.key = head.key
        self.rows = sum(entry.rows for entry in pending if entry.key == head.key)

    def completes(self, entry: Entry) -> bool:
        """Whether `entry`, just pending, makes the watched batch due."""
        if entry.key != self.key:
            return False
        self.rows += entry.rows
        return self.rows >= self.limit or self.rows in self.preferred


@dataclass(eq=False)
class _Queue:
    """The pending requests of one model version, the task that serves them, and what that task waits for."""

    model: Model
    run: RunModel
    watch: Watch
    pending: deque[Entry] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None
    task: asyncio.Task[None] | None = None


class Batcher:
    """The dynamic batching queues of the models being served (one per model version)."""

    def __init__(self, report: Report | None = None) -> None:
        self._queues: dict[int, _Queue] = {}
        self._report = report

    async def infer(
        self, model: Model, inputs: Arrays, parameters: dict[str, Any], run: RunModel, rows: int | None = None,
        key: Hashable | None = None,
    ) -> tuple[BatchResult, int, int, int]:
        """This request's share of a batched call, `(outputs, response parameters)`, and when (in
        `time.perf_counter_ns`) its batch was formed, the model started and the model ended. `inputs` are
        validated arrays with the batch dimension first; `run` calls the model (`rows`, `key`: see `new_entry`)."""
        future: asyncio.Future[Share] = asyncio.get_running_loop().create_future()
        self._enqueue(model, run, new_entry(inputs, parameters, future, rows, key))
        return await future

    def _enqueue(self, model: Model, run: RunModel, entry: Entry) -> None:
        queue = self._queues.get(id(model))
        if queue is None or queue.model is not model:
            queue = self._queues[id(model)] = _Queue(model, run, Watch(model))
        queue.pending.append(entry)
        if queue.task is None or queue.task.done():
            queue.task = asyncio.create_task(self._serve(queue), name=f"batcher {model.name} {model.version}")
        elif queue.waiter is not None and queue.watch.completes(entry):
            _wake(queue.waiter)

    async def _serve(self, queue: _Queue) -> None:
        try:
            while True:
                batch = await self._next_batch(queue)
                if not batch:
                    break
                await self._run(queue, batch)
        finally:
            if self._queues.get(id(queue.model)) is queue and not queue.pending:
                del self._queues[id(queue.model)]

    async def _next_batch(self, queue: _Queue) -> list[Entry]:
        """The next batch, once it is due; empty when nothing is pending."""
        while True:
            while queue.pending and not queue.pending[0].waiting():  # cancelled while waiting
                queue.pending.popleft()
            if not queue.pending:
                return []
            now = time.perf_counter_ns()
            batch, deadline = form_batch(queue.model, queue.pending, now)
            if batch:
                take_batch(queue.pending, batch)
                return batch
            # Sleep until the batch's delay is over or an arrival makes it due (`Watch`).
            loop = asyncio.get_running_loop()
            waiter = queue.waiter = loop.create_future()
            queue.watch.wait_for(queue.pending)
            timer = loop.call_later((deadline - now) / 1e9, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                queue.waiter = None
                queue.watch.key = None

    async def _run(self, queue: _Queue, batch: list[Entry]) -> None:
        model = queue.model
        start = time.perf_counter_ns()
        try:
            inputs, rows = merge_inputs(batch)
            result, run_start, run_end = await queue.run(model, inputs, batch[0].parameters)
            shares = split_result(model, result, [entry.rows for entry in batch], rows if len(batch) > 1 else None)
            done = time.perf_counter_ns()
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else ModelFailure("the batch was cancelled")
            for entry in batch:
                if entry.future is not None and not entry.future.done():
                    entry.future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        if self._report is not None:
            self._report(
                ExecutionRecord(model.name, model.version, rows, run_start - start, run_end - run_start, done - run_end)
            )
        for entry, share in zip(batch, shares, strict=True):
            if entry.future is not None and not entry.future.done():
                entry.future.set_result((share, start, run_start, run_end))


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def form_batch(model: Model, pending: deque[Entry], now: int) -> tuple[list[Entry], int]:
    """The batch the head of `pending` forms at `now` (see the module's description) and 0, once it is due; before
    that, no batch and the moment it will be due at the latest (`pending` holds only requests still waiting)."""
    settings = model.dynamic_batching
    delay_ns = settings.max_queue_delay_microseconds * _NS_PER_US if settings is not None else 0
    preferred = settings.preferred_batch_size if settings is not None else ()
    limit = model.max_batch_size
    head = pending[0]
    batch: list[Entry] = []
    rows = 0
    full = False  # holds max_batch_size rows, or the next request that could join does not fit
    best = 0  # the longest prefix of `batch` whose rows are a preferred batch size
    for entry in pending:
        if entry.key != head.key or not entry.waiting():
            continue
        if batch and rows + entry.rows > limit:
            full = True
            break
        batch.append(entry)
        rows += entry.rows
        if rows in preferred:
            best = len(batch)
    full = full or rows >= limit
    deadline = head.arrived + delay_ns
    if not full and now < deadline and head.rows and best:
        batch = batch[:best]
    if full or best or now >= deadline or head.rows == 0:
        return batch, 0
    return [], deadline


def take_batch(pending: deque[Entry], batch: list[Entry]) -> None:
    """Remove `batch`, formed from `pending`, from it. Under load the batch is the head of the queue, taken off one
    by one; otherwise the queue is rebuilt without it, and without the requests no longer waiting."""
    for entry in batch:
        if pending[0] is not entry:
            break
        pending.popleft()
    else:
        return
    taken = {id(entry) for entry in batch}
    kept = [e for e in pending if id(e) not in taken and e.waiting()]
    pending.clear()
    pending.extend(kept)


def merge_inputs(batch: list[Entry]) -> tuple[Arrays, int]:
    """The inputs of a batch's requests concatenated on the first axis, and its rows."""
    rows = sum(entry.rows for entry in batch)
    if len(batch) == 1:
        return batch[0].inputs, rows
    return {name: np.concatenate([entry.inputs[name] for entry in batch], axis=0) for name in batch[0].inputs}, rows


def split_result(model: Model, result: Any, sizes: list[int], rows: int | None) -> list[BatchResult]:
    """Each request's share of a batch's result; with `rows` None (a batch of one) the result itself."""
    outputs: Any = result
    parameters: Any = {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Mapping):
        outputs, parameters = result
    if not isinstance(outputs, Mapping) or not isinstance(parameters, Mapping):
        # Let the data plane report what is wrong, as for an unbatched call.
        return [(outputs, parameters)] if rows is None else [(outputs, parameters)] * len(sizes)
    if rows is None:
        return [(dict(outputs), dict(parameters))]
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, value in outputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if array.ndim == 0 or array.shape[0] != rows:
            raise ModelFailure(
                f"model '{model.name}' returned output '{name}' with shape {list(array.shape)} for a batch of {rows}: "
                "the first dimension of every output must be the batch size"
            )
        arrays[name] = array
    shares: list[BatchResult] = []
    start = 0
    for size in sizes:
        shares.append(({name: array[start:start + size] for name, array in arrays.items()}, dict(parameters)))
        start += size
    return shares
