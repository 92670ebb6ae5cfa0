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

Without httptools (uvicorn's h11 fallback) uvicorn's own protocol is used, with none of these changes (h11 answers
400 in plain text to a request line and headers beyond its `h11_max_incomplete_event_size`, which the server sets
to the same limit).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson

__all__ = ["BUFFER_BODIES", "http_protocol"]

BUFFER_BODIES: Final = "oip.http.response.buffer_bodies"
"""The ASGI scope extension of a server that writes a response body given as any bytes-like object as it is."""

_LINGER: Final = 2.0  # seconds a refused connection's further bytes are read and dropped before it closes
_MALFORMED: Final = "the request is not valid HTTP/1.1 (request line or headers could not be parsed)"


def _answer(status: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return b"".join([
        b"HTTP/1.1 ", status, b"\r\ncontent-type: application/json\r\ncontent-length: ",
        str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body,
    ])


def http_protocol(header_timeout: float, body_timeout: float,
                  max_header_bytes: int = 64 * 1024) -> type[asyncio.Protocol] | str:
    """The protocol class for `uvicorn.Config(http=...)`: httptools' with the changes above, or "auto"."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's h11 protocol as it is
        return "auto"

    feed = HttpToolsProtocol.data_received

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
            super().on_headers_complete()
            self._receiving = self.loop.time()  # until the message is complete

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            super().on_body(body)
            self._receiving = self.loop.time()

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._receiving = None
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            if self._refused:
                return
            self._disarm()
            self.transport.write(_answer(b"400 Bad Request", _MALFORMED))
            self.transport.close()

    return Protocol
