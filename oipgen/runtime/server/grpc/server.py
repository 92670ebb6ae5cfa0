"""The gRPC server: grpcio's synchronous server (a pool of threads) in front of the asynchronous data plane.

Why not grpc.aio: measured per call on the same load (bench/grpc_floor.py, bare servers answering ModelInfer
with fixed bytes), the synchronous server costs about two thirds of grpc.aio's CPU, on asyncio's loop or
uvloop's. So the port is served by `grpc.server` and its threads, and each call takes one of two ways:

- in the thread: unary ModelInfer on a model that allows it (`Pipeline.runs_in_thread`: a plain `infer`, no
  dynamic batching, not decoupled) is decoded, run through the data plane's pipeline and encoded in the gRPC
  thread, never touching the event loop (`in_thread`); so is the common request to a plain model under dynamic
  batching, whose batch the waiting gRPC threads form (the lean way, `core.lean`); a call to an inline model
  (`Model.inline`: quick, never blocking) takes no thread of the pool: grpcio's polling thread answers it as its
  request arrives, or queues it in its batch and the thread that runs the batch answers it (`pool.WarmPool`);
- on the loop: every other call runs the servicer's coroutine (`service.Servicer`: the same code, the same
  errors) on the event loop, and the thread waits for it. Request streams are read by a thread of their own and
  handed to the coroutine; its responses come back to the gRPC thread through a bounded queue (a slow reader
  holds the stream, not the server's memory). A call the client cancels cancels its coroutine.

Each call holds a thread of the pool while it runs (a unary call from when its request has arrived: `arrival`), a
stream for its whole life: `Settings.grpc_threads` bounds the unary inference calls served at once, the streams
open at once and the other calls (health, metadata...) served at once, each kind on threads of its own (more wait
for a thread of their kind). The pool hands each call to the thread that went idle last (`pool.WarmPool`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import grpc
import grpc.aio

from ..core.pipeline import Pipeline
from ..observe.metrics import Metrics
from ..settings import GRPC_THREAD_SCHEDULING
from .health import HealthServicer
from .in_thread import NOT_HERE, InThread, in_thread
from .pool import WarmPool
from .servicer import ServicerBase, method_handlers, observer, status

__all__ = ["create_server", "threaded_server"]

_WINDOW: Final = 64  # responses of a stream queued for the gRPC thread, and requests queued for the coroutine
_END: Final = object()


class _LoopContext:
    """What the transport's coroutines see of a call: grpc.aio's context over the synchronous one. `abort` records
    the status for the gRPC thread to send; metadata and peer are the call's."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context
        self.status: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def peer(self) -> str:
        return self._context.peer()

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def code(self) -> grpc.StatusCode | None:
        return self.status[0] if self.status is not None else None

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.status = (code, details)
        raise grpc.aio.AbortError()


def _finish(context: grpc.ServicerContext, loop_context: _LoopContext, exc: BaseException) -> Any:
    """Answer a call whose coroutine failed: its recorded status, or the status of what it raised."""
    if isinstance(exc, grpc.aio.AbortError) and loop_context.status is not None:
        context.abort(*loop_context.status)
    context.abort(*status(exc))


def _cancel(future: concurrent.futures.Future[Any]) -> None:
    future.cancel()  # no effect on a call that is done


class _Bridge:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, coroutine: Any, context: grpc.ServicerContext) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        context.add_callback(lambda: _cancel(future))  # the call ended: cancelled by the client, or done
        return future.result()

    def requests(self, iterator: Iterator[Any]) -> AsyncIterator[Any]:
        """A call's request stream, for a coroutine: read by a thread of its own, with backpressure."""
        loop = self.loop
        items: asyncio.Queue[Any] = asyncio.Queue(_WINDOW)

        def read() -> None:
            try:
                for item in iterator:
                    asyncio.run_coroutine_threadsafe(items.put(item), loop).result()
                end: Any = _END
            except BaseException as exc:  # the call was cancelled or broke: the coroutine sees it end
                end = exc
            # RuntimeError, CancelledError: the loop is gone (shutting down).
            with contextlib.suppress(RuntimeError, concurrent.futures.CancelledError):
                asyncio.run_coroutine_threadsafe(items.put(end), loop).result()

        threading.Thread(target=read, name="oip-grpc-requests", daemon=True).start()

        async def stream() -> AsyncIterator[Any]:
            while True:
                item = await items.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    if isinstance(item, grpc.RpcError):  # the client went away: nothing more to read
                        return
                    raise item
                yield item

        return stream()

    def responses(self, replies: Callable[[], AsyncIterator[Any]], context: grpc.ServicerContext,
                  loop_context: _LoopContext) -> Iterator[Any]:
        """A coroutine's responses, for the gRPC thread to send, at most _WINDOW ahead of the client (`_Pipe`)."""
        pipe = _Pipe(self.loop)

        async def pump() -> None:
            try:
                async for reply in replies():
                    await pipe.put(reply)
            except BaseException as exc:
                pipe.finish(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                pipe.finish(_END)

        future = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        context.add_callback(lambda: _cancel(future))
        while True:
            items, end = pipe.take()
            yield from items
            if end is _END:
                return
            if end is not None:
                _finish(context, loop_context, end)
                return


class _Pipe:
    """Responses from the event loop to a gRPC thread, in order, at most _WINDOW waiting (a slow reader holds the
    stream, not the server's memory). The thread takes every response waiting at once and is woken only when it
    waits for one; the loop is woken only when it waits for room. A burst of responses (a decoupled model's) so
    costs the threads a handful of wake-ups, not one or two per response."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: list[Any] = []
        self.end: Any = None  # _END, or the exception the responses ended with
        self.lock = threading.Lock()
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()  # a token: the thread may have something to take
        self.waiting = False  # the thread waits for a token
        self.room: asyncio.Future[None] | None = None  # the loop waits for room

    async def put(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
            wake, self.waiting = self.waiting, False
            full = len(self.items) >= _WINDOW
            if full:
                self.room = self.loop.create_future()
            room = self.room
        if wake:
            self.wake.put(None)
        if full and room is not None:
            await room

    def finish(self, end: Any) -> None:
        with self.lock:
            self.end = end
            wake, self.waiting = self.waiting, False
        if wake:
            self.wake.put(None)

    def take(self) -> tuple[list[Any], Any]:
        """Every response waiting (waiting for one first), and how they ended if they did (None: not yet)."""
        while True:
            with self.lock:
                items, self.items = self.items, []
                end, room = self.end, self.room
                self.room = None
                if not items and end is None:
                    self.waiting = True
            if room is not None:
                self.loop.call_soon_threadsafe(_resolve, room)
            if items or end is not None:
                return items, end
            self.wake.get()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _unary_unary(bridge: _Bridge, behavior: Any, fast: Callable[[Any, Any], Any] | None) -> Callable[..., Any]:
    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        if fast is not None:
            reply = fast(request, context)
            if reply is not NOT_HERE:
                return reply
        loop_context = _LoopContext(context)
        try:
            return bridge.run(behavior(request, loop_context), context)
        except BaseException as exc:
            return _finish(context, loop_context, exc)

    return handle


def _stream_unary(bridge: _Bridge, behavior: Any) -> Callable[..., Any]:
    def handle(iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        loop_context = _LoopContext(context)
        try:
            return bridge.run(behavior(bridge.requests(iterator), loop_context), context)
        except BaseException as exc:
            return _finish(context, loop_context, exc)

    return handle


def _unary_stream(bridge: _Bridge, behavior: Any) -> Callable[..., Any]:
    def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        loop_context = _LoopContext(context)
        yield from bridge.responses(lambda: behavior(request, loop_context), context, loop_context)

    return handle


def _stream_stream(bridge: _Bridge, behavior: Any) -> Callable[..., Any]:
    def handle(iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        loop_context = _LoopContext(context)
        yield from bridge.responses(lambda: behavior(bridge.requests(iterator), loop_context), context,
                                    loop_context)

    return handle


def _batch_scheduling() -> None:
    """Run the calling thread under SCHED_BATCH, where the system has it. A woken thread of the normal policy
    preempts the one running, and in this process that one mostly holds the interpreter the woken thread needs
    next: it runs only to wait for it, and the two switch back. Under SCHED_BATCH it waits for the running thread to
    block or use up its time slice (at once on an idle core; behind another busy process, until its slice ends):
    about half the context switches of a small call, and under load the polling thread, which hands every call
    on, keeps its core, so more requests reach a dynamic batcher in each batch's window."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or refused: the system's policy
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def threaded_server(
    services: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]],
    fast: dict[str, InThread],
    loop: asyncio.AbstractEventLoop,
    threads: int,
    options: list[tuple[str, Any]],
    scheduling: str = "normal",
) -> grpc.Server:
    """A synchronous server of `services` (by full name: their handlers by method name) whose calls run the
    handlers (grpc.aio behaviours: coroutines, async generators) on `loop`, except what the `fast` handlers (by
    method path, `/service/method`) answer in the gRPC thread (the polling thread itself, for a call it
    `answers_here`: one that never waits); with `scheduling` "batch", its threads run under SCHED_BATCH
    (`_batch_scheduling`); ValueError for a policy that is neither "batch" nor "normal"."""
    if scheduling not in GRPC_THREAD_SCHEDULING:
        raise ValueError(f"the gRPC threads' scheduling must be one of {', '.join(GRPC_THREAD_SCHEDULING)}, "
                         f"got {scheduling!r}")
    bridge = _Bridge(loop)
    quick_ways: dict[Any, InThread] = {}  # by unary handler: what answers its call without a pool thread
    served: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
    for service, handlers in services.items():
        sync = served[service] = {}
        for name, handler in handlers.items():
            wire = {"request_deserializer": handler.request_deserializer,
                    "response_serializer": handler.response_serializer}
            if handler.unary_unary is not None:
                quick = fast.get(f"/{service}/{name}")
                handle = _unary_unary(bridge, handler.unary_unary, quick.handle if quick is not None else None)
                if quick is not None:
                    quick_ways[handle] = quick
                sync[name] = grpc.unary_unary_rpc_method_handler(handle, **wire)
            elif handler.unary_stream is not None:
                sync[name] = grpc.unary_stream_rpc_method_handler(_unary_stream(bridge, handler.unary_stream), **wire)
            elif handler.stream_unary is not None:
                sync[name] = grpc.stream_unary_rpc_method_handler(_stream_unary(bridge, handler.stream_unary), **wire)
            elif handler.stream_stream is not None:
                sync[name] = grpc.stream_stream_rpc_method_handler(_stream_stream(bridge, handler.stream_stream),
                                                                   **wire)
    initializer = _batch_scheduling if scheduling == "batch" else None

    def answers_here(behavior: Any, request: Any, pairs: Any, respond: Callable[..., None]) -> bool:
        quick = quick_ways.get(behavior)
        return quick is not None and quick.answers_here(request, pairs, respond)

    # Unary inference (the `fast` methods) has threads apart from the other calls'.
    pool = WarmPool(threads, "oip-grpc", initializer, answers_here, inference=list(fast))
    server = grpc.server(pool, options=options)  # type: ignore[arg-type]
    for service, sync in served.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, sync),))
        server.add_registered_method_handlers(service, sync)
    return server


def create_server(
    servicer: ServicerBase, *, pipeline: Pipeline | None = None, metrics: Metrics | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> grpc.Server:
    """The gRPC server answering every RPC of `servicer`'s service from its data plane: grpcio's thread pool
    server; with `pipeline` (the data plane's), unary inference on a model that allows it runs wholly in the gRPC
    thread, everything else as the servicer's coroutines on `loop` (default: the running one: call from the event
    loop); `metrics` counts every answer. Beside it, the standard gRPC health service (`health`), when the spec
    marks the operation it answers from. Bind it with `add_insecure_port`.

    Messages are limited to `settings.max_request_bytes` each way (larger ones: RESOURCE_EXHAUSTED), metadata to
    `settings.http_max_header_bytes` (a call with more is refused, RESOURCE_EXHAUSTED), and a port
    already in use is an error rather than shared, unless `settings.reuse_port` (the workers of `--workers N`).
    """
    settings = servicer.settings
    limit = settings.max_request_bytes
    observe = observer(servicer.service, metrics, settings.access_log)
    services = {servicer.service: method_handlers(servicer, observe)}
    if servicer.grpc_health:
        health = HealthServicer(servicer)
        services[health.service] = method_handlers(health, observer(health.service, metrics, settings.access_log))
    fast = {} if pipeline is None else {
        f"/{servicer.service}/{rpc.name}": in_thread(pipeline, settings, servicer.infer, rpc.name, observe,
                                                     servicer.tracing)
        for rpc in servicer.rpcs if rpc.fast
    }
    options = [
        *settings.grpc_options,  # keepalive and connection age (`settings.GRPC_CONNECTION`), as the flags give them
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
        # Metadata (headers) beyond the limit refused, all of it: equal soft and hard limits leave no range where
        # grpcio refuses only some calls at random.
        ("grpc.max_metadata_size", settings.http_max_header_bytes),
        ("grpc.absolute_max_metadata_size", settings.http_max_header_bytes),
    ]
    return threaded_server(services, fast, loop or asyncio.get_running_loop(), settings.grpc_threads, options,
                           settings.grpc_thread_scheduling)
