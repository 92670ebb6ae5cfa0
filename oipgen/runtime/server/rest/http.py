"""The HTTP layer under the REST app: uvicorn's httptools protocol, with the server's error body and a header timeout.

What happens below the application, where FastAPI never sees the request:
- A request that is not valid HTTP/1.1 (a broken request line, a bad header): uvicorn answers 400 in plain text.
  Here the answer is the protocol's `{"error": "..."}` as JSON, and the connection closes, as before.
- A request line and header section larger than `max_header_bytes` (counted as the request line, each header's
  name and value and the line ends): uvicorn (httptools) would hold all of it, however large, in memory. Here the
  server answers 431 with an error body as soon as the pending request line and headers are known to exceed the
  limit (having held at most the limit and one read of the socket), then reads and drops what still comes for at
  most two seconds and closes the connection.
- A client that opens a connection and sends its request line and headers slowly, or nothing at all, would hold
  the connection for ever (uvicorn times out only idle keep-alive connections between requests). Here the request
  line and headers must arrive within `header_timeout` seconds of the connection's start, or of the first byte of
  a later request on it; past that the server answers 408 with an error body and closes the connection. Idle
  keep-alive connections close after uvicorn's `timeout_keep_alive`.
- A client that sends a request body slowly, or stops in the middle of it, would hold the connection and the
  request's handler for ever. Here the body may pause at most `body_timeout` seconds between two pieces (not
  counting time the server itself stops reading); past that, if no answer has started, the server answers 408
  with an error body and closes the connection (the handler then sees the client gone).

- A response body message may carry any bytes-like object (a memoryview of a tensor's array) rather than bytes:
  httptools' protocol hands it to the transport as it is. The protocol says so in every request's scope, as the
  ASGI extension `BUFFER_BODIES`; the app sends large binary tensor data that way only where it is advertised
  (ASGI itself asks for bytes, and hosts that carry the messages elsewhere, such as Ray Serve's proxy, need them).

- An inference request (a POST to an inference route of the app, or to generate's: `OipApp.direct`) with a small body
  of a declared length is answered here, without ASGI: its body is collected as it arrives and handed, whole, to the
  route's answer (the one the app's ASGI route calls too: the same decoding, data plane, errors, metrics and access
  log); the answer is written as one piece, or, for a stream of events, its head and then each piece as one chunk as
  it comes (a task; what comes in one turn of the event loop written in one send; waiting while the transport's buffer
  is full; stopped, its source closed, as soon as the connection is lost). ASGI's per-request scope, messages and
  task, the framework's request object and a write per message cost a tenth to a fifth of a small inference's CPU
  (bench/ab.py: simple REST 0.91x, text REST binary 0.78x, a batched model 0.87x, generate 0.84x, generate_stream
  0.82x); here the answer runs in the protocol's callback, and a task is made only if it has to wait (a model in a
  worker thread, a dynamic batch). Anything else goes through ASGI as before: a request pipelined behind one still
  being answered, or sent while the client is not reading its answers (the transport's buffer full: ASGI's way waits
  for it to drain, and further requests wait), one that expects `100-continue`, is chunked or compressed, has more
  than `_DIRECT_MAX_BODY` bytes or more than the server's `--max-request-bytes` (ASGI's way answers 413), or names its
  client in forwarding headers while the access log is on.

Without httptools (uvicorn's h11 fallback) uvicorn's own protocol is used, with none of these changes (h11 answers
400 in plain text to a request line and headers beyond its `h11_max_incomplete_event_size`, which the server sets
to the same limit).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import types
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Final, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

from .infer_codec import BinaryParts

__all__ = ["BUFFER_BODIES", "Answer", "DirectApp", "http_protocol"]

BUFFER_BODIES: Final = "oip.http.response.buffer_bodies"
"""The ASGI scope extension of a server that writes a response body given as any bytes-like object as it is."""

_LINGER: Final = 2.0  # seconds a refused connection's further bytes are read and dropped before it closes
_MALFORMED: Final = "the request is not valid HTTP/1.1 (request line or headers could not be parsed)"
_DIRECT_MAX_BODY: Final = 1 << 16  # request body bytes up to which an inference request is answered directly
_FORWARDED: Final = (b"x-forwarded-for", b"x-forwarded-proto")  # rewrite the client's address (uvicorn's proxy headers)

log = logging.getLogger(__name__)

Answer = Callable[[dict[str, Any], "bytes | memoryview", Sequence[tuple[bytes, bytes]], bool], Awaitable[Response]]
"""An inference route's answer to a request whose body has been read (`handlers.tensor_answer`): its path fields, its
body, its headers (names lowercase, as ASGI and the HTTP layer give them) and whether the answer may be written as
parts (`BinaryParts`). Every error is answered, never raised."""


class DirectApp(Protocol):
    """What the HTTP layer needs of the app to answer its inference requests itself (`OipApp` has it): the route of
    a POST path (operation, path fields, answer) or None, and who counts and logs each answer."""

    count: Callable[[str, int], None] | None
    log: Callable[[Any, int, int, int], None] | None

    def direct(self, path: str) -> tuple[str, dict[str, str], Answer] | None: ...


class _Event:
    """What uvicorn's protocol sets on a request's cycle when its body moves or the connection is lost: a direct
    request has nobody waiting for that."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT: Final = _Event()


class _StopStream(_Event):
    """A streamed answer's cycle's event: the connection lost (uvicorn sets it then) stops the stream's task at
    once, not at its next piece (a model may take long to give it)."""

    __slots__ = ("cycle", "task")

    def __init__(self, cycle: _Direct, task: asyncio.Task[None]) -> None:
        self.cycle = cycle
        self.task = task

    def set(self) -> None:
        if self.cycle.disconnected:
            self.task.cancel()


class _Direct:
    """A request answered by the HTTP layer itself: what uvicorn's protocol (and the timeouts) read and write of a
    request's cycle, the route's answer, and the body as it arrives."""

    __slots__ = ("answer", "chunks", "disconnected", "fields", "keep_alive", "message_event", "more_body",
                 "operation", "response_complete", "response_started", "scope", "start")

    def __init__(self, scope: Any, operation: str, fields: dict[str, str], answer: Any, keep_alive: bool,
                 start: int) -> None:
        self.scope = scope  # for the access log
        self.operation = operation
        self.fields = fields
        self.answer = answer
        self.keep_alive = keep_alive
        self.start = start
        self.chunks: list[bytes] = []
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.message_event = _NO_EVENT


@types.coroutine
def _resume(coroutine: Coroutine[Any, Any, Any], waiting: Any) -> Generator[Any, Any, Any]:
    """Go on with `coroutine`, started outside a task, which has yielded `waiting` (what it awaits) to its caller:
    the task running this hands it what it is sent or thrown, as `await` would have."""
    while True:
        try:
            sent = yield waiting
        except BaseException as exc:
            try:
                waiting = coroutine.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                waiting = coroutine.send(sent)
            except StopIteration as done:
                return done.value


def _answer(status: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return b"".join([
        b"HTTP/1.1 ", status, b"\r\ncontent-type: application/json\r\ncontent-length: ",
        str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body,
    ])


def http_protocol(header_timeout: float, body_timeout: float, max_header_bytes: int = 64 * 1024,
                  app: DirectApp | None = None, max_request_bytes: int | None = None) -> type[asyncio.Protocol] | str:
    """The protocol class for `uvicorn.Config(http=...)`: httptools' with the changes above, or "auto". With `app`
    (the app the server runs), its inference requests are answered here (see the module's description); a body
    over `max_request_bytes` (the app's own limit, which it answers with 413) is left to the app."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's h11 protocol as it is
        return "auto"

    feed = HttpToolsProtocol.data_received
    direct_max_body = _DIRECT_MAX_BODY if max_request_bytes is None else min(_DIRECT_MAX_BODY, max_request_bytes)

    class Protocol(HttpToolsProtocol):
        # One timer per connection, not one or two per request (arming and cancelling loop timers on every request
        # is a measurable part of a small request's cost). A request notes when its request line and headers
        # started (`_waiting`, None once they are complete) and when its body last made progress (`_receiving`,
        # None once the message is complete); the timer, when it fires, answers 408 for whichever is late, and
        # otherwise waits again until the first moment one of them could be.
        _timer: asyncio.TimerHandle | None = None
        _waiting: float | None = None  # loop time at which the pending request line and headers started
        _receiving: float | None = None  # loop time of the pending body's last progress
        # The pending request line and headers, by the reads of the socket since the one where they began: that
        # read's size (an upper bound of their bytes in it) and the bytes read since (all theirs while pending).
        _first: int = 0
        _later: int = 0
        _read: int = 0  # the size of the read being parsed
        _refused: bool = False  # answered 431: nothing more of this connection is parsed

        def _watch(self, delay: float) -> None:
            self._timer = self.loop.call_later(delay, self._check)

        def _check(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            now = self.loop.time()
            delay = min(header_timeout, body_timeout)
            if self._waiting is not None:
                late = self._waiting + header_timeout - now
                if late <= 0:
                    message = f"the request line and headers did not arrive within {header_timeout:g} seconds"
                    self.transport.write(_answer(b"408 Request Timeout", message))
                    self.transport.close()
                    return
                delay = min(delay, late)
            if self._receiving is not None:
                late = self._receiving + body_timeout - now
                if self.cycle is None or self.cycle.response_complete:  # answered: the body no longer matters
                    self._receiving = None
                elif late <= 0 and self.flow.read_paused:  # the server is not reading: not the client's doing
                    self._receiving = now
                    delay = min(delay, body_timeout)
                elif late <= 0:
                    if not self.cycle.response_started:
                        message = f"the request body paused for more than {body_timeout:g} seconds"
                        self.transport.write(_answer(b"408 Request Timeout", message))
                    self.transport.close()
                    return
                else:
                    delay = min(delay, late)
            self._watch(delay)

        def _disarm(self) -> None:
            self._waiting = self._receiving = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._waiting = self.loop.time()
            self._watch(min(header_timeout, body_timeout))

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            read = self._read = len(data)
            if self._waiting is not None:  # a head was pending before this read: it goes on in it
                self._later += read
            feed(self, data)
            if self._later > max_header_bytes and self._waiting is not None and not self._refused:
                self._refuse()

        def _head_size(self) -> int:
            """The request line and headers as parsed: each line and its end (spaces around values not counted)."""
            return len(self.url) + 16 + sum(len(name) + len(value) + 4 for name, value in self.headers)

        def _refuse(self) -> None:
            self._refused = True
            self._disarm()
            message = f"the request line and headers exceed {max_header_bytes} bytes (--http-max-header-bytes)"
            self.transport.write(_answer(b"431 Request Header Fields Too Large", message))
            # Closed once the client stops sending, or after a while: closing a socket with unread data resets the
            # connection, and the client might never read the answer. What still arrives is read and dropped.
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(_LINGER, self.transport.close)

        def on_message_begin(self) -> None:
            if self._refused:
                return
            self._first, self._later = self._read, 0
            super().on_message_begin()
            self.scope["extensions"] = {BUFFER_BODIES: {}}
            if self._waiting is None:  # a later request: its first byte starts the clock (the first: the connection)
                self._waiting = self.loop.time()

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._waiting = None
            if self._first + self._later > max_header_bytes and self._head_size() > max_header_bytes:
                self._refuse()
                return
            direct = self._direct() if app is not None else None
            if direct is None:
                super().on_headers_complete()
            else:
                self.cycle = direct  # type: ignore[assignment]  # read as a cycle by uvicorn's protocol
            self._receiving = self.loop.time()  # until the message is complete

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            cycle: Any = self.cycle
            if type(cycle) is _Direct:
                cycle.chunks.append(body)
            else:
                super().on_body(body)
            self._receiving = self.loop.time()

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._receiving = None
            cycle: Any = self.cycle
            if type(cycle) is _Direct:
                cycle.more_body = False
                self._answer(cycle)
            else:
                super().on_message_complete()

        # --- inference requests answered here (see the module's description) -----------------------------------

        def _direct(self) -> _Direct | None:
            """The request whose headers are complete as one to answer here, or None (ASGI's)."""
            assert app is not None
            parser = self.parser
            if (self.cycle is not None and not self.cycle.response_complete) or self.expect_100_continue:
                return None
            if self.flow.write_paused:  # the client is not reading its answers: ASGI's way waits for it to
                return None
            if parser.get_method() != b"POST" or parser.should_upgrade() or self.root_path:
                return None
            size = None
            for name, value in self.headers:
                if name == b"content-length":
                    if size is not None or not value.isdigit():
                        return None
                    size = int(value)
                elif (name == b"transfer-encoding" or (name == b"content-encoding" and value.lower() != b"identity")
                      or (name in _FORWARDED and app.log is not None)):
                    return None
            if size is None or size > direct_max_body:
                return None
            raw_path = httptools.parse_url(self.url).path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            route = app.direct(path)
            if route is None:
                return None
            version = parser.get_http_version()
            scope = self.scope
            scope["method"], scope["path"], scope["raw_path"] = "POST", path, raw_path
            if version != "1.1":
                scope["http_version"] = version
            operation, fields, answer = route
            scope["oip_operation"] = operation  # type: ignore[typeddict-unknown-key]
            keep_alive = version != "1.0" and parser.should_keep_alive()
            return _Direct(scope, operation, fields, answer, keep_alive, time.perf_counter_ns() if app.log else 0)

        def _answer(self, cycle: _Direct) -> None:
            """Run the request's answer: to its end here when it need not wait, else as a task."""
            chunks = cycle.chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            cycle.chunks = []
            context = contextvars.copy_context()  # what the answer sets stays its own, as in a task of its own
            coroutine = cycle.answer(cycle.fields, body, self.headers, True)
            try:
                waiting = context.run(coroutine.send, None)
            except StopIteration as done:
                self._respond(cycle, done.value)
                return
            except BaseException:
                log.exception("answering an inference request failed")
                self._fail(cycle)
                return
            task = self.loop.create_task(self._finish(cycle, coroutine, waiting), context=context)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # shutting down waits for it, as for uvicorn's own

        async def _finish(self, cycle: _Direct, coroutine: Coroutine[Any, Any, Response], waiting: Any) -> None:
            try:
                response = await _resume(coroutine, waiting)
            except asyncio.CancelledError:  # the server stops without waiting any longer
                self._fail(cycle)
                raise
            except BaseException:
                log.exception("answering an inference request failed")
                self._fail(cycle)
                raise
            self._respond(cycle, response)

        def _respond(self, cycle: _Direct, response: Response) -> None:
            """Write `response` (its status line and headers, the server's own, and its body or parts as one piece),
            count and log it, and let the connection go on; a streamed one goes on in a task of its own."""
            status = response.status_code
            head: list[bytes | memoryview] = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += (name, b": ", value, b"\r\n")
            for name, value in response.raw_headers:
                head += (name, b": ", value, b"\r\n")
            streamed = type(response) is StreamingResponse
            if streamed:
                head.append(b"transfer-encoding: chunked\r\n")
            if not cycle.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            if streamed:
                cycle.response_started = True
                pieces = response.body_iterator  # type: ignore[attr-defined]
                task = self.loop.create_task(self._stream(cycle, status, b"".join(head), pieces))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)  # shutting down waits for it, as for uvicorn's own
                cycle.message_event = _StopStream(cycle, task)
                return
            if type(response) is BinaryParts:
                sent = response.size
                head += response.parts
            else:
                sent = len(response.body)
                head.append(response.body)
            cycle.response_started = True
            if not cycle.disconnected:
                self.transport.writelines(head)
            self._complete(cycle, status, sent)

        async def _stream(self, cycle: _Direct, status: int, head: bytes, pieces: AsyncIterator[bytes | str]) -> None:
            """Write a streamed answer's head and pieces as they come, each piece one chunk, waiting while the client
            does not read; stop when the client goes away (the pieces' source is closed: a model's generator ends
            with it). What comes within one turn of the event loop is written at its end, in one send: a model that
            yields several responses at once costs one system call, not one each (a tenth of a small event's CPU);
            one that waits between its responses has each written as soon as it waits."""
            sent = 0
            chunks = [head]

            def flush() -> None:
                if chunks and not cycle.disconnected:
                    self.transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                chunks.clear()

            self.loop.call_soon(flush)  # once this task has run as far as it can
            try:
                async for piece in pieces:
                    if self.flow.write_paused and not cycle.disconnected:
                        await self.flow.drain()
                    if cycle.disconnected:
                        break
                    data = piece.encode() if isinstance(piece, str) else piece
                    if data:
                        if not chunks:
                            self.loop.call_soon(flush)
                        chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
                        sent += len(data)
                else:
                    chunks.append(b"0\r\n\r\n")
            except asyncio.CancelledError:  # the client went away, or the server stops without waiting any longer
                cycle.keep_alive = False
                raise
            except BaseException:  # the answer has started: the connection closes unfinished
                log.exception("streaming an answer failed")
                cycle.keep_alive = False
                raise
            finally:
                flush()  # what came before the end, or before a failure
                aclose = getattr(pieces, "aclose", None)
                try:
                    if aclose is not None:
                        await aclose()
                finally:
                    self._complete(cycle, status, sent)

        def _fail(self, cycle: _Direct) -> None:
            """Answer 500 to a request whose answer broke (it answers its own errors: this is a defect)."""
            if not cycle.disconnected and not cycle.response_started:
                cycle.response_started = True
                cycle.keep_alive = False
                self.transport.write(_answer(b"500 Internal Server Error", "internal server error"))
            self._complete(cycle, 500, 0)

        def _complete(self, cycle: _Direct, status: int, sent: int) -> None:
            cycle.response_complete = True
            assert app is not None
            if app.count is not None:
                app.count(cycle.operation, status)
            if app.log is not None:
                app.log(cycle.scope, status, sent, cycle.start)
            if not cycle.keep_alive:
                self.transport.close()
            self.on_response_complete()

        def send_400_response(self, msg: str) -> None:
            if self._refused:
                return
            self._disarm()
            self.transport.write(_answer(b"400 Bad Request", _MALFORMED))
            self.transport.close()

    return Protocol
