"""The gRPC server's thread pool (`oip.server.grpc.pool.WarmPool`): the thread that went idle last takes the next
call; at most `max_workers` calls run at once, the rest wait in arrival order; a call's result or exception is its
`Call`'s, whose callbacks run once it is over (grpcio counts its calls so); shutdown ends the threads. The suite's
gRPC tests over real sockets run every call through it."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError
from typing import Any

import grpc
import pytest
from oip.server.grpc.pool import Call, WarmPool

WAIT = 10.0  # seconds: a bound on every wait, never the expected time


def _idle(pool: WarmPool, count: int) -> None:
    """Wait until `count` threads of `pool` are idle (a finished call's thread goes idle just after its future is
    set)."""
    deadline = time.monotonic() + WAIT
    while len(pool._idle) < count:
        assert time.monotonic() < deadline, "the pool's threads did not go idle"
        time.sleep(0.001)


def _held(release: threading.Event, seen: list[str]) -> str:
    seen.append(threading.current_thread().name)
    assert release.wait(WAIT)
    return threading.current_thread().name


def test_the_thread_that_went_idle_last_takes_the_next_call() -> None:
    pool = WarmPool(4, "test-pool")
    try:
        releases = [threading.Event() for _ in range(3)]
        started: list[str] = []
        futures = [pool.submit(_held, release, started) for release in releases]
        names = _when_started(started, 3)
        assert len(set(names)) == 3  # three calls at once: three threads
        for i in (0, 2, 1):  # each goes idle in this order
            releases[i].set()
            futures[i].result(WAIT)
            _idle(pool, [0, 2, 1].index(i) + 1)
        last_idle = futures[1].result()
        for _ in range(3):  # and again, as long as it is idle when the next call comes
            assert pool.submit(lambda: threading.current_thread().name).result(WAIT) == last_idle
            _idle(pool, 3)
    finally:
        pool.shutdown()


def _when_started(started: list[str], count: int) -> list[str]:
    deadline = time.monotonic() + WAIT
    while len(started) < count:
        assert time.monotonic() < deadline, "the calls did not start"
        time.sleep(0.001)
    return list(started)


def test_at_most_max_workers_calls_run_at_once_and_the_rest_wait_in_order() -> None:
    pool = WarmPool(2, "test-pool")
    try:
        release = threading.Event()
        started: list[str] = []
        held = [pool.submit(_held, release, started) for _ in range(2)]
        _when_started(started, 2)
        order: list[int] = []
        waiting = [pool.submit(order.append, i) for i in range(5)]
        time.sleep(0.05)
        assert order == [] and not any(future.done() for future in waiting)  # no third thread
        release.set()
        for future in [*held, *waiting]:
            future.result(WAIT)
        assert order == [0, 1, 2, 3, 4]
        assert len(pool._threads) == 2
    finally:
        pool.shutdown()


def test_a_calls_result_and_exception_are_its_futures() -> None:
    pool = WarmPool(1)
    try:
        assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(WAIT) == 5
        failed: Call = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(WAIT)
        assert isinstance(failed.exception(0), ZeroDivisionError)
        assert pool.submit(lambda: "still serving").result(WAIT) == "still serving"
    finally:
        pool.shutdown()


def test_shutdown_ends_the_threads_after_the_calls_already_given() -> None:
    pool = WarmPool(1)
    release = threading.Event()
    held = pool.submit(_held, release, [])
    queued = pool.submit(lambda: "ran")
    threads = list(pool._threads)
    stopper = threading.Thread(target=pool.shutdown)
    stopper.start()
    with pytest.raises(RuntimeError):
        deadline = time.monotonic() + WAIT
        while True:  # once shutdown has begun, no new call is taken
            pool.submit(lambda: None)
            assert time.monotonic() < deadline
            time.sleep(0.001)
    release.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert held.result(0) and queued.result(0) == "ran"
    assert not any(thread.is_alive() for thread in threads)


def test_shutdown_while_a_call_starts_a_new_thread_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shutdown that comes while `submit` is starting a thread joins that thread once it has run its call,
    rather than failing to join a thread not yet started."""
    pool = WarmPool(1)
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            pool.shutdown()
        except BaseException as exc:  # what the test looks for: shutdown must not fail
            errors.append(exc)

    stopper = threading.Thread(target=stop)
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread is not stopper and not stopper.is_alive() and not stopper.ident:
            stopper.start()  # shutdown begins while the pool's new thread is not started yet
            time.sleep(0.05)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    ran = pool.submit(lambda: "ran")
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert errors == []
    assert ran.result(0) == "ran"


def test_each_thread_runs_the_initializer_before_its_first_call() -> None:
    started: list[str] = []
    pool = WarmPool(2, "test-pool", initializer=lambda: started.append(threading.current_thread().name))
    try:
        release = threading.Event()
        seen: list[str] = []
        futures = [pool.submit(_held, release, seen) for _ in range(2)]
        names = _when_started(seen, 2)
        assert sorted(started) == sorted(names)  # once per thread, before the call it was started for
        release.set()
        for future in futures:
            future.result(WAIT)
        _idle(pool, 2)
        pool.submit(lambda: None).result(WAIT)  # a thread that is kept does not run it again
        assert len(started) == 2
    finally:
        pool.shutdown()


def test_a_failing_initializer_is_logged_and_the_call_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    def fail() -> None:
        raise OSError("refused")

    pool = WarmPool(1, "test-pool", initializer=fail)
    try:
        with caplog.at_level("ERROR", logger="oip.server.grpc.pool"):
            assert pool.submit(lambda: "ran").result(WAIT) == "ran"  # not left unanswered by the thread's failure
        assert any("initializer failed" in record.getMessage() and record.exc_info for record in caplog.records)
        assert pool.submit(lambda: "again").result(WAIT) == "again"
    finally:
        pool.shutdown()


def test_a_calls_callbacks_run_once_it_is_over_and_at_once_when_added_after() -> None:
    pool = WarmPool(1)
    try:
        release = threading.Event()
        seen: list[str] = []
        call = pool.submit(_held, release, seen)
        told: list[tuple[str, Call, bool]] = []
        call.add_done_callback(lambda over: told.append(("before", over, over.done())))
        _when_started(seen, 1)
        assert told == [] and not call.done()
        with pytest.raises(TimeoutError):
            call.result(0.01)
        release.set()
        assert call.result(WAIT) == seen[0]
        assert told == [("before", call, True)]
        call.add_done_callback(lambda over: told.append(("after", over, over.done())))
        assert told == [("before", call, True), ("after", call, True)]  # in the caller's thread, at once
    finally:
        pool.shutdown()


def test_a_failing_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    pool = WarmPool(1)
    try:
        release = threading.Event()
        call = pool.submit(_held, release, [])
        told: list[int] = []
        call.add_done_callback(lambda _: 1 / 0)
        call.add_done_callback(lambda _: told.append(1))
        with caplog.at_level(logging.ERROR, logger="oip.server.grpc.pool"):
            release.set()
            call.result(WAIT)
            _idle(pool, 1)
        assert told == [1]
        assert any("callback" in record.getMessage() and record.exc_info for record in caplog.records)
        assert pool.submit(lambda: "still serving").result(WAIT) == "still serving"
    finally:
        pool.shutdown()


def test_a_call_cancelled_at_shutdown_never_runs_and_its_callbacks_run() -> None:
    pool = WarmPool(1)
    release = threading.Event()
    seen: list[str] = []
    held = pool.submit(_held, release, seen)
    _when_started(seen, 1)
    ran: list[str] = []
    queued = pool.submit(ran.append, "queued")
    told: list[bool] = []
    queued.add_done_callback(lambda over: told.append(over.cancelled()))
    held.add_done_callback(lambda over: told.append(over.cancelled()))
    stopper = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    deadline = time.monotonic() + WAIT
    while not queued.done():
        assert time.monotonic() < deadline, "the waiting call was not cancelled"
        time.sleep(0.001)
    assert told == [True] and not held.cancel()  # a running call cannot be
    release.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert told == [True, False] and ran == []
    with pytest.raises(CancelledError):
        queued.result(0)
    assert queued.cancel() and queued.cancelled() and held.result(0) == seen[0]


def test_grpcio_counts_the_calls_of_the_pool_over() -> None:
    """grpcio counts the calls it runs by the callbacks of what `submit` returns: with a bound on concurrent calls,
    a call whose end it was never told of would hold a place for ever, and the bound would refuse every call."""
    pool = WarmPool(2, "test-pool")
    server = grpc.server(pool, maximum_concurrent_rpcs=1)  # type: ignore[arg-type]
    method = grpc.unary_unary_rpc_method_handler(lambda request, context: request[::-1])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Reverse": method}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reverse = channel.unary_unary("/test.Echo/Reverse")
            deadline = time.monotonic() + WAIT
            for i in range(5):
                while True:  # the reply may reach us just before grpcio is told the call is over: then try again
                    try:
                        assert reverse(b"call %d" % i, timeout=WAIT) == b"%d llac" % i
                        break
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                        time.sleep(0.01)
    finally:
        server.stop(None).wait(WAIT)
        pool.shutdown()


def test_a_call_answered_here_by_a_plain_behaviour_gets_its_reply_or_fails_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    """`respond(behavior, plain=True)` answers with what the behaviour returns (given no context), without
    grpcio's per-call servicer context; a behaviour that raises fails its call as grpcio fails it (UNKNOWN), logged,
    and the server answers the next calls; grpcio is told each call is over (one call at a time allowed)."""
    contexts: list[Any] = []

    def plain(request: bytes, context: Any) -> bytes:
        contexts.append(context)
        if request == b"fail":
            raise ValueError("a fault of the behaviour's")
        return request[::-1]

    def answers_here(behavior: Any, request: Any, metadata: Any, respond: Any) -> bool:
        respond(plain, plain=True)
        return True

    pool = WarmPool(2, "test-pool", answers_here=answers_here)
    server = grpc.server(pool, maximum_concurrent_rpcs=1)  # type: ignore[arg-type]
    method = grpc.unary_unary_rpc_method_handler(lambda request, context: b"not answered here")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Reverse": method}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, caplog.at_level(logging.ERROR):
            reverse = channel.unary_unary("/test.Echo/Reverse")

            def call(request: bytes) -> Any:
                """The reply, or the code the call failed with."""
                deadline = time.monotonic() + WAIT
                while True:  # the reply may reach us just before grpcio is told the call is over: then try again
                    try:
                        return reverse(request, timeout=WAIT)
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                            return exc.code()
                    time.sleep(0.01)

            answers = [call(request) for request in (b"call 0", b"fail", b"call 1", b"call 2")]
        assert answers == [b"0 llac", grpc.StatusCode.UNKNOWN, b"1 llac", b"2 llac"]
        assert contexts == [None] * 4
        assert any(r.getMessage() == "answering a gRPC call failed" for r in caplog.records)
    finally:
        server.stop(None).wait(WAIT)
        pool.shutdown()


def _stream(release: threading.Event, seen: list[str]) -> Any:
    """A call submitted as grpcio submits a stream (its first argument grpcio's function for calls whose responses
    stream), held until `release`."""
    from grpc import _server as grpc_server

    def run(behaviour: Any, *args: Any) -> str:
        assert behaviour is grpc_server._stream_response_in_pool
        return _held(*args)

    return run, grpc_server._stream_response_in_pool, release, seen


def test_streams_have_threads_of_their_own_and_wait_for_each_other_not_for_calls(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = WarmPool(2, "test-pool")
    try:
        release = threading.Event()
        started: list[str] = []
        streams = [pool.submit(*_stream(release, started)) for _ in range(2)]
        _when_started(started, 2)
        with caplog.at_level(logging.WARNING, logger="oip.server.grpc.pool"):
            waiting = [pool.submit(*_stream(release, started)) for _ in range(2)]  # over the streams' limit
        assert pool.submit(lambda: "answered").result(WAIT) == "answered"  # a call is not held up by streams
        time.sleep(0.05)
        assert len(started) == 2 and not any(call.done() for call in waiting)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == ["1 gRPC stream(s) wait for a thread: 2 are open, the most at once (--grpc-threads); "
                            "each waits until one ends"]  # once a minute, not once a stream
        release.set()
        for call in [*streams, *waiting]:
            call.result(WAIT)
        assert len(started) == 4 and len(pool._threads) == 3  # two streams and one call at most at once
    finally:
        pool.shutdown()


class _Event:
    """What grpcio gives a call of a registered method: the method's name as its tag."""

    def __init__(self, method: str) -> None:
        self.tag = method


def _to(method: str, release: threading.Event, seen: list[str]) -> tuple[Any, ...]:
    """A call to `method` as grpcio submits a unary one (its behaviour first, then the call's event), held until
    `release`."""
    return (lambda _behaviour, _event, *args: _held(*args)), "behaviour", _Event(method), release, seen


def test_inference_and_the_other_calls_have_threads_of_their_own() -> None:
    pool = WarmPool(1, "test-pool", inference=["/svc/Infer"])
    try:
        release = threading.Event()
        started: list[str] = []
        held = pool.submit(*_to("/svc/Infer", release, started))
        _when_started(started, 1)
        waiting = pool.submit(*_to("/svc/Infer", release, started))  # over inference's limit of one
        other = pool.submit(*_to("/svc/Live", release, started))  # another kind: a thread of its own
        _when_started(started, 2)
        time.sleep(0.05)
        assert len(started) == 2 and not waiting.done()
        release.set()
        for call in (held, waiting, other):
            call.result(WAIT)
        assert len(started) == 3 and len(pool._threads) == 2
    finally:
        pool.shutdown()
