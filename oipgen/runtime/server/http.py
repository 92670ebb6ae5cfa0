"""The HTTP layer under the REST app: uvicorn's httptools protocol, with the server's error body and a header timeout.

Two things happen below the application, where FastAPI never sees the request:
- A request that is not valid HTTP/1.1 (a broken request line, a bad header, a header section too large): uvicorn
  answers 400 in plain text. Here the answer is the protocol's `{"error": "..."}` as JSON, and the connection
  closes, as before.
- A client that opens a connection and sends its request line and headers slowly, or nothing at all, would hold
  the connection for ever (uvicorn times out only idle keep-alive connections between requests). Here the request
  line and headers must arrive within `header_timeout` seconds of the connection's start, or of the first byte of
  a later request on it; past that the server answers 408 with an error body and closes the connection. Idle
  keep-alive connections close after uvicorn's `timeout_keep_alive`.
- A client that sends a request body slowly, or stops in the middle of it, would hold the connection and the
  request's handler for ever. Here the body may pause at most `body_timeout` seconds between two pieces (not
  counting time the server itself stops reading); past that, if no answer has started, the server answers 408
  with an error body and closes the connection (the handler then sees the client gone).

Without httptools (uvicorn's h11 fallback) uvicorn's own protocol is used, with neither change.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson

__all__ = ["http_protocol"]

_MALFORMED: Final = "the request is not valid HTTP/1.1 (request line or headers could not be parsed)"


def _answer(status: bytes, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return b"".join([
        b"HTTP/1.1 ", status, b"\r\ncontent-type: application/json\r\ncontent-length: ",
        str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body,
    ])


def http_protocol(header_timeout: float, body_timeout: float) -> type[asyncio.Protocol] | str:
    """The protocol class for `uvicorn.Config(http=...)`: httptools' with the changes above, or "auto"."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's h11 protocol as it is
        return "auto"

    class Protocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                message = f"the request line and headers did not arrive within {header_timeout:g} seconds"
                self.transport.write(_answer(b"408 Request Timeout", message))
                self.transport.close()

        def _arm_body(self) -> None:
            self._disarm_body()
            self._body_timer = self.loop.call_later(body_timeout, self._body_too_slow)

        def _disarm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _body_too_slow(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or self.cycle is None or self.cycle.response_complete:
                return
            if self.flow.read_paused:  # the server is not reading (the app has not taken what came): not the client
                self._arm_body()
                return
            if not self.cycle.response_started:
                message = f"the request body paused for more than {body_timeout:g} seconds"
                self.transport.write(_answer(b"408 Request Timeout", message))
            self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            self._arm_body()  # until the message is complete

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._arm_body()

        def on_message_complete(self) -> None:
            self._disarm_body()
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            self.transport.write(_answer(b"400 Bad Request", _MALFORMED))
            self.transport.close()

    return Protocol
