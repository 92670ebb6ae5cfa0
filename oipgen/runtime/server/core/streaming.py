"""Streaming inference (`ModelStreamInfer`), as Triton streams.

Requests of one stream run concurrently (at most `MAX_IN_FLIGHT` at a time; reading waits beyond that). What
comes back for each:

- a model that is not decoupled answers exactly one response per request, and these answers keep the order of
  their requests;
- a decoupled model (`Model.decoupled = True`) answers zero or more responses per request, each sent as soon as
  the model yields it, not held back by other requests;
- a request that fails answers one error (`StreamError`: the message, with the request's id, model name and
  version) in its place, and the stream goes on.

Every streamed response carries the bool parameter `triton_final_response`: true on the answer of a model that is
not decoupled and on an error, false on the responses of a decoupled model. When a decoupled model is done with a
request, that is only signalled if the request set the bool parameter `triton_enable_empty_final_response`: an
empty response (no outputs) flagged `triton_final_response: true`. This is what Triton sends for a decoupled
model that sends its responses and then the final flag alone (the Python backend's usual pattern).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from ..errors import ModelFailure, OipError
from ..types import InferRequest, InferResponse

__all__ = [
    "EMPTY_FINAL",
    "FINAL",
    "MAX_IN_FLIGHT",
    "Answer",
    "StreamError",
    "final_response",
    "serve_stream",
]

log = logging.getLogger(__name__)

FINAL: Final = "triton_final_response"
"""Response parameter: true on the last response for a request."""
EMPTY_FINAL: Final = "triton_enable_empty_final_response"
"""Request parameter (bool): send an empty final response when a decoupled model is done with the request."""
MAX_IN_FLIGHT: Final = 256
"""Requests of one stream being answered at once."""
_QUEUE: Final = 64  # responses waiting for the transport, per stream


class StreamError(OipError):
    """A failed request of a stream: the error, and what identifies the request (`response`: id, model name and
    version, `triton_final_response`; no outputs)."""

    def __init__(self, error: OipError, response: InferResponse) -> None:
        super().__init__(error.message, error.kind)
        self.response = response


def final_response(request: InferRequest, version: str = "") -> InferResponse:
    """An empty response to `request`, flagged final."""
    return InferResponse(
        model_name=request.model_name,
        model_version=version or request.model_version,
        id=request.id,
        parameters={FINAL: True},
    )


def stream_error(request: InferRequest | None, exc: BaseException) -> StreamError:
    """`exc` as the answer to `request` in a stream; unexpected exceptions are logged and hidden."""
    if isinstance(exc, StreamError):
        return exc
    if isinstance(exc, OipError):
        error = exc
    else:
        log.error("stream inference failed", exc_info=exc)
        error = ModelFailure(f"internal server error ({type(exc).__name__})")
    partial = final_response(request) if request is not None else InferResponse("", "", parameters={FINAL: True})
    return StreamError(error, partial)


@dataclass(frozen=True, slots=True)
class Answer:
    """How one request of a stream is answered: `run()` yields its responses. A decoupled answer sends each
    response as soon as it is yielded; any other answer is exactly one response, sent after the answers of the
    earlier requests that are not decoupled either."""

    run: Callable[[], AsyncIterator[InferResponse]]
    decoupled: bool


class _End:
    """The last item of the response queue."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


_T = TypeVar("_T")


class _Channel(Generic[_T]):
    """A stream's responses on their way to its transport: first in, first out, from many writers (the requests'
    tasks) to one reader; a writer waits while `limit` items wait, the reader while none does. asyncio.Queue does
    the same in fifteen Python calls an item where this makes two, and every response of a stream goes through."""

    __slots__ = ("_items", "_limit", "_reader", "_writers")

    def __init__(self, limit: int) -> None:
        self._items: deque[_T] = deque()
        self._limit = limit
        self._reader: asyncio.Future[None] | None = None
        self._writers: deque[asyncio.Future[None]] = deque()

    async def put(self, item: _T) -> None:
        while len(self._items) >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._writers.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()  # a waiter already woken stays so
                if waiter in self._writers:
                    self._writers.remove(waiter)
                if not waiter.cancelled() and len(self._items) < self._limit:
                    self._wake_writer()  # woken, then cancelled: the free place goes to the next writer
                raise
        self._items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def get(self) -> _T:
        while not self._items:
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        item = self._items.popleft()
        if self._writers:
            self._wake_writer()
        return item

    def _wake_writer(self) -> None:
        while self._writers:
            waiter = self._writers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


async def serve_stream(
    requests: AsyncIterator[InferRequest | Exception], answer: Callable[[InferRequest], Answer]
) -> AsyncIterator[InferResponse | Exception]:
    """The responses of a stream of requests. An item of `requests` that is an exception (a request that could
    not be decoded) is answered with that error, in order. `answer(request)` says how to answer one request; an
    exception there or while answering is that request's error."""
    out: _Channel[InferResponse | Exception | _End] = _Channel(_QUEUE)
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    previous: asyncio.Future[None] = loop.create_future()  # the last ordered answer has been queued
    previous.set_result(None)

    async def decoupled(request: InferRequest, run: Callable[[], AsyncIterator[InferResponse]]) -> None:
        try:
            async for response in run():
                await out.put(response)
        except Exception as exc:
            await out.put(stream_error(request, exc))
        finally:
            slots.release()

    async def ordered(request: InferRequest | None, run: Callable[[], AsyncIterator[InferResponse]] | None,
                      error: Exception | None, after: asyncio.Future[None], queued: asyncio.Future[None]) -> None:
        try:
            item: InferResponse | Exception
            if run is None:
                item = stream_error(request, error or ModelFailure("the request got no answer"))
            else:
                try:
                    responses = [response async for response in run()]
                    if len(responses) != 1:
                        raise ModelFailure(f"the request got {len(responses)} answers instead of one")
                    item = responses[0]
                except Exception as exc:
                    item = stream_error(request, exc)
            await after
            await out.put(item)
        finally:
            if not queued.done():
                queued.set_result(None)
            slots.release()

    def start(request: InferRequest | Exception) -> asyncio.Task[None]:
        nonlocal previous
        if isinstance(request, Exception):
            how: Answer | None = None
            error: Exception | None = request
            source: InferRequest | None = None
        else:
            source, error = request, None
            try:
                how = answer(request)
            except Exception as exc:
                how, error = None, exc
        if how is not None and how.decoupled and source is not None:
            return asyncio.create_task(decoupled(source, how.run))
        queued = loop.create_future()
        after, previous = previous, queued
        return asyncio.create_task(ordered(source, how.run if how is not None else None, error, after, queued))

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                task = start(request)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the transport gave up on the stream (a malformed message...)
            await out.put(_End(exc))
            return
        await out.put(_End())

    reader = asyncio.create_task(read())
    try:
        while True:
            item = await out.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
