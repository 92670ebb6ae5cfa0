"""The gRPC server's thread pool (`WarmPool`): a call goes to the thread that went idle last, or is answered at once
by the polling thread when it never waits.

grpcio's synchronous server runs each call by `submit`ting it to the pool it is given. `ThreadPoolExecutor` wakes
whichever idle thread has waited longest, so once the pool has grown (a burst of calls at once, streams that
held threads and ended), every call runs on a thread whose stack and interpreter state have gone cold in the CPU's
caches since it last ran. Here the most recently idle thread takes the next call: the threads a steady load needs
stay warm and the others sleep. What a call may do is unchanged: as many calls run at once as the pool has
threads, started as they are needed and kept; a call that finds every thread busy waits in arrival order. A
unary call is given to a thread only once its request has arrived (`arrival`).

A unary call that the server can answer without waiting (`answers_here`: inference on a model declared quick and
never blocking, `Model.inline`) is not handed to a thread at all: grpcio's polling thread, which has just received
its request, answers it there and then, as the event loop calls such a model for REST, or, for a model that
batches, queues it in its batch and goes on; whichever thread runs the batch then answers it (`respond`). Handing
a small call to a thread costs a wake-up and the interpreter passed back and forth (at c=1 about seven voluntary
and five involuntary context switches a call, against one and none answered here; a batched call waited twice,
for its thread and for its batch); a call that could wait there would hold up every other call's I/O, so only
those are answered here.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from . import arrival

__all__ = ["AnswersHere", "WarmPool"]

log = logging.getLogger(__name__)

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
AnswersHere = Callable[[Any, Any, Any, Callable[..., None]], bool]
"""Whether a unary call is answered without a pool thread, given its handler, its request, its invocation metadata
and `respond` (answer it in the calling thread: now, or later from the thread that runs its batch)."""


class _Worker:
    """One thread's hand-over: the call it is given (`item`, None to end) and the lock it sleeps on while idle."""

    __slots__ = ("item", "wake")

    def __init__(self) -> None:
        self.item: _Item | None = None
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread has nothing to do: released to hand it a call


class WarmPool:
    """An executor of at most `max_workers` threads for grpcio's server (see the module's description): `submit`
    and `shutdown` as `concurrent.futures.Executor` has them."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "",
                 initializer: Callable[[], None] | None = None,
                 answers_here: AnswersHere | None = None) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._prefix = thread_name_prefix or f"WarmPool-{id(self):x}"
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is the first handed a call
        self._backlog: deque[_Item] = deque()  # calls waiting for a thread, every one being busy
        self._threads: list[threading.Thread] = []
        self._closed = False
        # Run by each thread as it starts, before its first call. One that raises is logged and the thread serves
        # anyway: the call it was started for must not be left unanswered.
        self._initializer = initializer
        # Answers a unary call whose request has arrived without a thread when it can (see the module's
        # description); asked in grpcio's polling thread.
        self._answers_here = answers_here

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if args and arrival.defer(args, lambda given, request: self._arrived((future, fn, given, kwargs), request)):
            return future  # handed to a thread once its request is in
        self._hand((future, fn, args, kwargs))
        return future

    def _arrived(self, item: _Item, request: Any) -> None:
        """A unary call whose request has arrived (None: the client sent none): answered without a thread when
        `answers_here` takes it; else handed to a thread."""
        answers_here = self._answers_here
        if answers_here is not None and request is not None and not self._closed:
            args = item[2]
            event, behavior = args[1], args[3]
            # grpcio runs each call in a context of its own (`item[1]` is its `run`): so does what answers it here,
            # so that what a request makes current (its timer, its trace) stays its own and never the polling
            # thread's, which the next calls' contexts are copied from.
            in_context = item[1] if isinstance(getattr(item[1], "__self__", None), contextvars.Context) else None
            inside = True  # while the hook runs, in the call's context: it cannot be entered twice

            def respond(answer: Any = None) -> None:
                """Answer the call in this thread: by its handler, or by `answer` (a behaviour of the same call)."""
                given = args if answer is None else (*args[:3], answer, *args[4:])
                _run((item[0], _direct if inside or in_context is None else in_context, given, item[3]))

            try:
                hook = (behavior, request, event.invocation_metadata, respond)
                taken = answers_here(*hook) if in_context is None else in_context(answers_here, *hook)
            finally:
                inside = False
            if taken:
                return
        self._hand(item)

    def _hand(self, item: _Item) -> None:
        """Give `item` to the thread that went idle last, a new thread, or the backlog. RuntimeError after
        `shutdown` (the future cancelled)."""
        with self._lock:
            if self._closed:
                item[0].cancel()
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.item = item
                worker.wake.release()
                return
            if len(self._threads) >= self._max:
                self._backlog.append(item)
                return
            thread = threading.Thread(target=self._work, args=(_Worker(), item), daemon=True,
                                      name=f"{self._prefix}_{len(self._threads)}")
            # Started under the lock, so that `shutdown` never finds a thread it cannot join yet (the new thread
            # runs its call before it takes the lock).
            thread.start()
            self._threads.append(thread)

    def _work(self, worker: _Worker, item: _Item | None) -> None:
        if self._initializer is not None:
            try:
                self._initializer()
            except Exception:
                log.exception("a gRPC thread's initializer failed; the thread serves calls without it")
        while item is not None:
            _run(item)
            item = None  # nothing of a finished call is kept while the thread sleeps
            with self._lock:
                if self._backlog:
                    item = self._backlog.popleft()
                    continue
                if self._closed:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            item, worker.item = worker.item, None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the idle threads end, the busy ones once the backlog is done (cancelled first with
        `cancel_futures`); with `wait`, return when every thread has ended."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            if cancel_futures:
                while self._backlog:
                    self._backlog.popleft()[0].cancel()
            threads = list(self._threads)
        for worker in idle:
            worker.wake.release()  # with no call: the thread ends
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()


def _direct(fn: Callable[..., Any], /, *args: Any) -> Any:
    """`fn(*args)` in the context already entered (what `Context.run` does from outside it)."""
    return fn(*args)


def _run(item: _Item) -> None:
    future, fn, args, kwargs = item
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # the call's outcome is its future's, as in ThreadPoolExecutor
        future.set_exception(exc)
    else:
        future.set_result(result)
