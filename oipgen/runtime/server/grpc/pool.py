"""The gRPC server's thread pool (`WarmPool`): a call goes to the thread that went idle last, or is answered at once
by the polling thread when it never waits.

grpcio's synchronous server runs each call by `submit`ting it to the pool it is given. `ThreadPoolExecutor` wakes
whichever idle thread has waited longest, so once the pool has grown (a burst of calls at once, streams that
held threads and ended), every call runs on a thread whose stack and interpreter state have gone cold in the CPU's
caches since it last ran. Here the most recently idle thread takes the next call: the threads a steady load needs
stay warm and the others sleep. What a call may do is unchanged: as many calls run at once as the pool has
threads, started as they are needed and kept; a call that finds every thread busy waits in arrival order. A
unary call is given to a thread only once its request has arrived (`arrival`).

Calls of three kinds have threads of their own, so that no kind waits behind another (as Triton handles inference
and the other calls apart): unary inference (the methods named `inference`), streams, and every other call
(health, metadata, configuration, statistics, the repository, shared memory). A stream holds its thread for as
long as it is open, idle or not: without this, as many idle streams as threads (clients that keep one open, as
tritonclient's `start_stream` does) left no thread to any other call, and as many calls to a slow model did the
same, so that a health check waited until its deadline. Each kind may run `max_workers` calls at once; one beyond
waits for a call of its kind to end, and for streams the log says so once a minute.

What `submit` returns is the call's `Call`: its outcome, and the one thing grpcio asks of it (a callback once it is
over, by which grpcio counts the calls it runs). `concurrent.futures.Future` would serve, but makes a condition
variable for every call and enters it three times; a `Call` takes one plain lock, and makes an event only for a
caller that waits on its result.

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
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import CancelledError
from typing import Any, Final

from . import arrival

__all__ = ["AnswersHere", "Call", "WarmPool"]

log = logging.getLogger(__name__)

_PENDING: Final = 0
_RUNNING: Final = 1
_DONE: Final = 2  # finished, with its result or its exception
_CANCELLED: Final = 3  # never ran (the pool shut down first)

_CALL: Final = 0  # the kinds of call, each with its threads: unary inference (any unary call without `inference`)
_STREAM: Final = 1  # a call whose responses stream (`arrival.streams`): it holds its thread while open
_OTHER: Final = 2  # a unary call to a method not named in `inference` (health, metadata...)
_KINDS: Final = (_CALL, _OTHER, _STREAM)
_WAIT_WARNING_SECONDS: Final = 60.0


class Call:
    """One call submitted to a `WarmPool` (see the module's description): `result` and `exception` wait for it as
    a `concurrent.futures.Future`'s do, and `add_done_callback`'s callbacks run once it is over (finished or
    cancelled), in the thread that ended it, or at once in the caller's when it is over already."""

    __slots__ = ("_callbacks", "_error", "_lock", "_result", "_state", "_waiter")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _PENDING
        self._callbacks: list[Callable[[Call], Any]] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._waiter: threading.Event | None = None  # made by the first caller that waits before the end

    def add_done_callback(self, fn: Callable[[Call], Any]) -> None:
        with self._lock:
            if self._state < _DONE:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _callback(fn, self)

    def done(self) -> bool:
        return self._state >= _DONE

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self) -> bool:
        """Cancel the call if it has not started: True when it will never run."""
        return self._end(_CANCELLED, None, None) or self._state == _CANCELLED

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def _wait(self, timeout: float | None) -> None:
        with self._lock:
            waiter = None
            if self._state < _DONE:
                waiter = self._waiter = self._waiter or threading.Event()
        if waiter is not None and not waiter.wait(timeout):
            raise TimeoutError
        if self._state == _CANCELLED:
            raise CancelledError

    def _start(self) -> bool:
        """Whether the call is to run now (False: cancelled, or begun already)."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _RUNNING
            return True

    def _end(self, state: int, result: Any, error: BaseException | None) -> bool:
        """End the call (done once it ran, cancelled while pending) and run its callbacks: False when it could not
        (over already, or running when cancelled)."""
        with self._lock:
            if self._state >= _DONE or (state == _CANCELLED and self._state == _RUNNING):
                return False
            self._result, self._error, self._state = result, error, state
            callbacks, self._callbacks = self._callbacks, None
            waiter = self._waiter
        if waiter is not None:
            waiter.set()
        if callbacks is not None:
            for fn in callbacks:
                _callback(fn, self)
        return True


def _callback(fn: Callable[[Call], Any], call: Call) -> None:
    try:
        fn(call)
    except Exception:  # as `Future` does: one failing callback neither stops the others nor the call's thread
        log.exception("a callback of a gRPC call failed")


_Item = tuple[Call, Callable[..., Any], tuple[Any, ...], dict[str, Any]]
AnswersHere = Callable[[Any, Any, Any, Callable[..., None]], bool]
"""Whether a unary call is answered without a pool thread, given its handler, its request, its invocation metadata
and `respond` (answer it in the calling thread: now, or later from the thread that runs its batch)."""


class _Worker:
    """One thread's hand-over: the call it is given (`item`, None to end), its kind, and the lock it sleeps on while
    idle."""

    __slots__ = ("item", "kind", "wake")

    def __init__(self) -> None:
        self.item: _Item | None = None
        self.kind = _CALL
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread has nothing to do: released to hand it a call


class WarmPool:
    """An executor for grpcio's server of at most `max_workers` calls at once, and besides them as many streams,
    and, when `inference` names the unary methods of inference (`/service/method`), as many calls to the others
    (see the module's description): `submit` (which returns a `Call`, where `concurrent.futures.Executor` returns a
    future) and `shutdown` as an executor has them."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "",
                 initializer: Callable[[], None] | None = None,
                 answers_here: AnswersHere | None = None, inference: Collection[str] | None = None) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers  # calls running at once, of each kind
        self._running = [0, 0, 0]  # calls running, by kind
        self._inference = None if inference is None else frozenset(inference)
        self._prefix = thread_name_prefix or f"WarmPool-{id(self):x}"
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is the first handed a call
        self._backlogs: tuple[deque[_Item], ...] = (deque(), deque(), deque())  # calls waiting for a thread, by kind
        self._warned = -_WAIT_WARNING_SECONDS  # when the log last said that streams wait (`time.monotonic`)
        self._threads: list[threading.Thread] = []
        self._closed = False
        # Run by each thread as it starts, before its first call. One that raises is logged and the thread serves
        # anyway: the call it was started for must not be left unanswered.
        self._initializer = initializer
        # Answers a unary call whose request has arrived without a thread when it can (see the module's
        # description); asked in grpcio's polling thread.
        self._answers_here = answers_here

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Call:
        call = Call()
        if args and arrival.defer(args, lambda given, request: self._arrived((call, fn, given, kwargs), request)):
            return call  # handed to a thread once its request is in
        self._hand((call, fn, args, kwargs), _STREAM if arrival.streams(args) else self._unary(args))
        return call

    def _unary(self, args: tuple[Any, ...]) -> int:
        """The kind of a unary call, from the arguments grpcio submits it with."""
        return _CALL if self._inference is None or arrival.method(args) in self._inference else _OTHER

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

            def respond(answer: Any = None, plain: bool = False) -> None:
                """Answer the call in this thread: by its handler, or by `answer` (a behaviour of the same call;
                `plain`: one that uses no context and never fails, answered without one, `arrival.answer`)."""
                given = args if answer is None else (*args[:3], answer, *args[4:])
                run_in = _direct if inside or in_context is None else in_context
                _run((item[0], run_in, (arrival.answer, given) if plain else given, item[3]))

            try:
                hook = (behavior, request, event.invocation_metadata, respond)
                taken = answers_here(*hook) if in_context is None else in_context(answers_here, *hook)
            finally:
                inside = False
            if taken:
                return
        self._hand(item, self._unary(item[2]))

    def _hand(self, item: _Item, kind: int = _CALL) -> None:
        """Give `item` to the thread that went idle last, a new thread, or, when as many calls of its kind run as
        its limit, the backlog. RuntimeError after `shutdown` (its `Call` cancelled)."""
        with self._lock:
            if self._closed:
                item[0].cancel()
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._running[kind] >= self._max:
                self._backlogs[kind].append(item)
                if kind == _STREAM:
                    self._streams_wait()
                return
            self._running[kind] += 1
            if self._idle:
                worker = self._idle.pop()
                worker.item, worker.kind = item, kind
                worker.wake.release()
                return
            worker = _Worker()
            worker.kind = kind
            thread = threading.Thread(target=self._work, args=(worker, item), daemon=True,
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
                self._running[worker.kind] -= 1
                for kind in _KINDS:  # the next call waiting whose kind is under its limit
                    if self._backlogs[kind] and self._running[kind] < self._max:
                        self._running[kind] += 1
                        item, worker.kind = self._backlogs[kind].popleft(), kind
                        break
                if item is not None:
                    continue
                if self._closed:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            item, worker.item = worker.item, None

    def _streams_wait(self) -> None:
        """Say, once a minute at most, that streams wait for a thread (under the lock)."""
        now = time.monotonic()
        if now - self._warned >= _WAIT_WARNING_SECONDS:
            self._warned = now
            log.warning("%d gRPC stream(s) wait for a thread: %d are open, the most at once (--grpc-threads); each "
                        "waits until one ends", len(self._backlogs[_STREAM]), self._max)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the idle threads end, the busy ones once the backlog is done (cancelled first with
        `cancel_futures`); with `wait`, return when every thread has ended."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            if cancel_futures:
                for backlog in self._backlogs:
                    while backlog:
                        backlog.popleft()[0].cancel()
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
    call, fn, args, kwargs = item
    if not call._start():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # the call's outcome is its `Call`'s, as a future's in ThreadPoolExecutor
        call._end(_DONE, None, exc)
    else:
        call._end(_DONE, result, None)
