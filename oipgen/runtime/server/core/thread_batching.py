"""Dynamic batching in threads, by the rules of `batching`: for requests that wait in threads of their own
(`ThreadBatcher`: the gRPC threads' lean way) and for requests no thread waits for (`ArrivalBatcher`: gRPC calls to
an inline model, answered by the polling thread their request arrived on). The event loop's batcher is
`batching.Batcher`; a model's requests batch with those of the same batcher.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from ..errors import ModelFailure
from ..model import Model
from ..observe.events import ExecutionRecord
from .batching import (
    Arrays,
    BatchResult,
    Done,
    Entry,
    Report,
    Share,
    Watch,
    form_batch,
    merge_inputs,
    new_entry,
    split_result,
    take_batch,
)

__all__ = ["ArrivalBatcher", "RunInThread", "ThreadBatcher"]

log = logging.getLogger(__name__)

RunInThread = Callable[[Model, Arrays, dict[str, Any]], tuple[Any, int, int]]
"""How `ThreadBatcher` calls a plain model in the calling thread: the result, and when the call started and ended."""


class ThreadBatcher:
    """The dynamic batching queues of plain models for requests that wait in threads of their own (the gRPC threads'
    lean way), with `Batcher`'s rules, formed by the waiting threads themselves: the request at the head of a
    model's queue leads, waits until its batch is due (`form_batch`), runs the model for the whole batch in its own
    thread (`run`), hands every other request of the batch its share and the lead to the next request waiting, and
    returns its own share. One batch of a model runs at a time, as on the loop; no thread waits on the event loop.
    Requests of each way batch among themselves (the loop's `Batcher` and this one are two queues of a model)."""

    def __init__(self, report: Report | None = None) -> None:
        self._queues: dict[int, _ThreadQueue] = {}
        self._lock = threading.Lock()
        self._report = report

    def forget(self, model: Model) -> None:
        """Drop the queue of `model`, retired (`ModelRepository.on_retired`): no request joins it any more."""
        with self._lock:
            _drop(self._queues, model)

    def infer(self, model: Model, inputs: Arrays, parameters: dict[str, Any], run: RunInThread,
              rows: int | None = None, key: Hashable | None = None) -> Share:
        """This request's share of a batched call and its moments, as `Batcher.infer` gives them (`rows`, `key`:
        see `new_entry`)."""
        entry = new_entry(inputs, parameters, None, rows, key)
        entry.wake = threading.Lock()
        entry.wake.acquire()
        queue = self._queues.get(id(model))
        if queue is None or queue.model is not model:
            with self._lock:
                queue = self._queues.get(id(model))
                if queue is None or queue.model is not model:
                    queue = self._queues[id(model)] = _ThreadQueue(model)
        with queue.lock:
            queue.pending.append(entry)
            if not queue.leading:
                queue.leading = entry.lead = True
            elif queue.waiter is not None and queue.watch.completes(entry):
                queue.waiter.release()  # the leader waits for its batch to be due, and this one makes it so
                queue.waiter = None
        if not entry.lead:
            entry.wake.acquire()  # woken with its share, or to lead
        if entry.lead:
            self._lead(queue, entry, run)
        if entry.error is not None:
            raise entry.error
        assert entry.share is not None
        return entry.share

    def _lead(self, queue: _ThreadQueue, leader: Entry, run: RunInThread) -> None:
        """Form the batch the head of the queue (this thread's request, `leader`) leads, run it, hand the lead on.
        While the batch is not due the leader sleeps on its own lock (held: taken when it was made, and again when
        it was woken to lead), which an arrival making the batch due releases, or until the batch's delay is over."""
        model = queue.model
        wake = leader.wake
        assert wake is not None
        while True:
            with queue.lock:
                queue.waiter = None
                queue.watch.key = None
                now = time.perf_counter_ns()
                batch, deadline = form_batch(model, queue.pending, now)
                if batch:
                    take_batch(queue.pending, batch)
                    break
                queue.watch.wait_for(queue.pending)
                queue.waiter = wake
            wake.acquire(timeout=(deadline - now) / 1e9)
        try:
            start = time.perf_counter_ns()
            inputs, rows = merge_inputs(batch)
            result, run_start, run_end = run(model, inputs, batch[0].parameters)
            shares = split_result(model, result, [entry.rows for entry in batch], rows if len(batch) > 1 else None)
            if self._report is not None:
                self._report(ExecutionRecord(model.name, model.version, rows, run_start - start, run_end - run_start,
                                             time.perf_counter_ns() - run_end))
            for entry, share in zip(batch, shares, strict=True):
                entry.share = (share, start, run_start, run_end)
        except Exception as exc:
            for entry in batch:
                entry.error = exc
        finally:
            for entry in batch:
                if entry.share is None and entry.error is None:  # not an Exception: still an answer for each
                    entry.error = ModelFailure("the batch was not run")
                if not entry.lead and entry.wake is not None:
                    entry.wake.release()
            with queue.lock:
                following = queue.pending[0] if queue.pending else None
                if following is None:
                    queue.leading = False
                else:
                    following.lead = True
            if following is not None and following.wake is not None:
                following.wake.release()


class _ThreadQueue:
    """The pending requests of one model version for `ThreadBatcher`, under `lock`; `waiter`: the lock a leader
    sleeps on until its batch is due, released by the arrival that makes it so (`Watch`)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.watch = Watch(model)
        self.lock = threading.Lock()
        self.waiter: threading.Lock | None = None
        self.pending: deque[Entry] = deque()
        self.leading = False  # a request leads the next batch (one always does while any is pending)


class ArrivalBatcher:
    """The dynamic batching queues of plain models for requests no thread waits for (gRPC calls to an inline model,
    answered by grpcio's polling thread, which may never wait), with `Batcher`'s rules. `add` queues a request with
    what to call with its share (`Done`), and the adding thread runs each batch of that model that is due then (in
    that thread, the model's `run`: an inline model is quick and never blocks); a batch whose delay runs out with
    no arrival to run it is run by a timer thread. One batch of a model runs at a time, as on the loop; each request
    is handed its share or error exactly once, by the thread that ran its batch. Under load, arrivals run the batches
    and the timer wakes at most once per batch (a handed-off request costs its thread's wake-ups, here none)."""

    def __init__(self, report: Report | None = None, low_priority: bool = True) -> None:
        self._queues: dict[int, _ArrivalQueue] = {}
        self._report = report
        self._low_priority = low_priority  # the timer thread under SCHED_BATCH (Linux; see `_drain`)
        self._timer = threading.Lock()  # guards `_queues`' changes, `_due`, `_waking` and `_asleep`
        self._due: dict[_ArrivalQueue, int] = {}  # queues to look at again, by when (`time.perf_counter_ns`)
        self._waking = 0  # when the sleeping timer thread wakes by itself; 0: only when rung
        self._asleep = False  # the timer thread sleeps on `_bell` and no one has rung it yet
        self._bell = threading.Lock()  # held but while rung: the timer thread sleeps acquiring it
        self._bell.acquire()
        self._thread: threading.Thread | None = None

    def forget(self, model: Model) -> None:
        """Drop the queue of `model`, retired (`ModelRepository.on_retired`): no request joins it any more (one
        the timer was to look at again is looked at, and found empty)."""
        with self._timer:
            _drop(self._queues, model)

    def add(self, model: Model, inputs: Arrays, parameters: dict[str, Any], run: RunInThread, done: Done,
            rows: int | None = None, key: Hashable | None = None) -> None:
        """Queue a request (validated arrays, batch dimension first) to `model`, run by `run` in whichever thread
        runs its batch; `done` is called there with the request's share and its moments, or with the error
        (`rows`, `key`: see `new_entry`)."""
        entry = new_entry(inputs, parameters, None, rows, key)
        entry.done = done
        queue = self._queues.get(id(model))
        if queue is None or queue.model is not model:
            with self._timer:
                queue = self._queues.get(id(model))
                if queue is None or queue.model is not model:
                    queue = self._queues[id(model)] = _ArrivalQueue(model, run)
        with queue.lock:
            queue.pending.append(entry)
            # A batch found not due yet becomes due by its delay (the timer's) or by an arrival that completes it
            # (`Watch`): any other arrival only joins the queue.
            if queue.running or (queue.watch.key is not None and not queue.watch.completes(entry)):
                return
        self._drain(queue, False)

    def _drain(self, queue: _ArrivalQueue, timed: bool) -> None:
        """Run each batch of `queue` that is due, unless another thread is running one (it drains after it); when
        what is left is not due, have the timer look again when it will be. An arrival (`timed` False) runs the
        batches its requests complete (full, or a preferred size); one whose delay ran out is the timer's, which
        runs at low priority (SCHED_BATCH: it takes the core when the arrivals' thread waits, not from it), so
        under load a batch is run once every request ready by then has joined it, not the moment its delay ends
        (the arrivals' thread has many requests to read in a delay of 100 us)."""
        while True:
            with queue.lock:
                if queue.running or not queue.pending:
                    return
                now = time.perf_counter_ns() if timed else queue.pending[0].arrived
                batch, deadline = form_batch(queue.model, queue.pending, now)
                if batch:
                    take_batch(queue.pending, batch)
                    queue.running = True
                    queue.watch.key = None
                else:
                    queue.watch.wait_for(queue.pending)
            if not batch:
                self._look_at(queue, deadline)
                return
            try:
                self._run(queue, batch)
            finally:
                with queue.lock:
                    queue.running = False

    def _run(self, queue: _ArrivalQueue, batch: list[Entry]) -> None:
        model = queue.model
        start = time.perf_counter_ns()
        shares: list[BatchResult] = []
        error: BaseException | None = None
        try:
            inputs, rows = merge_inputs(batch)
            result, run_start, run_end = queue.run(model, inputs, batch[0].parameters)
            shares = split_result(model, result, [entry.rows for entry in batch], rows if len(batch) > 1 else None)
        except Exception as exc:
            error = exc
        else:
            if self._report is not None:
                self._report(ExecutionRecord(model.name, model.version, rows, run_start - start, run_end - run_start,
                                             time.perf_counter_ns() - run_end))
        for i, entry in enumerate(batch):
            done = entry.done
            entry.done = None
            if done is None:
                continue
            try:
                if error is None:
                    done((shares[i], start, run_start, run_end), None)
                else:
                    done(None, error)
            except Exception:  # one request's answer failed: the others are still answered
                log.exception("answering a request of model '%s''s batch failed", model.name)

    def _look_at(self, queue: _ArrivalQueue, deadline: int) -> None:
        """Have the timer thread drain `queue` at `deadline`, waking it only when it would sleep past that."""
        with self._timer:
            known = self._due.get(queue)
            if known is not None and known <= deadline:
                return
            self._due[queue] = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._time, name="oip-batch-timer", daemon=True)
                self._thread.start()
                return
            ring = self._asleep and (not self._waking or deadline < self._waking)
            if ring:
                self._asleep = False
        if ring:
            self._bell.release()

    def _time(self) -> None:
        """The timer thread: drain each queue once its time comes (a batch no arrival ran by its deadline)."""
        if self._low_priority:
            with contextlib.suppress(AttributeError, OSError):
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        # Plain locks, not a Condition: the timer sleeps and is rung once per batch when nothing else runs it.
        while True:
            with self._timer:
                now = time.perf_counter_ns()
                due = [queue for queue, when in self._due.items() if when <= now]
                if due:
                    self._due = {queue: when for queue, when in self._due.items() if when > now}
                self._waking = 0 if due else min(self._due.values(), default=0)
                self._asleep = not due
            if due:
                self._drain_due(due)
                continue
            self._bell.acquire(timeout=(self._waking - now) / 1e9 if self._waking else -1)
            with self._timer:
                self._asleep = False  # rung (the bell taken) or woken by itself (a late ring: woken again)

    def _drain_due(self, due: list[_ArrivalQueue]) -> None:
        """Drain the queues whose time came (here, not in `_time`: nothing of them, and of a model retired since,
        stays referenced while the timer sleeps)."""
        for queue in due:
            try:
                self._drain(queue, True)
            except Exception:  # the thread must live on: other batches depend on it
                log.exception("running the batch of model '%s' failed", queue.model.name)


def _drop(queues: dict[int, Any], model: Model) -> None:
    """Remove the queue of `model` from `queues` (by id; one of an instance gone before that had the same id
    stays: it was dropped when that one retired)."""
    if getattr(queues.get(id(model)), "model", None) is model:
        del queues[id(model)]


class _ArrivalQueue:
    """The pending requests of one model version for `ArrivalBatcher`, under `lock`; `running`: a thread is running
    one of its batches; `run`: how its model is called."""

    __slots__ = ("lock", "model", "pending", "run", "running", "watch")

    def __init__(self, model: Model, run: RunInThread) -> None:
        self.model = model
        self.run = run
        self.watch = Watch(model)  # the batch found not due yet, while its requests wait
        self.lock = threading.Lock()
        self.pending: deque[Entry] = deque()
        self.running = False
