"""A plain-HTTP transport for the OTLP/HTTP trace exporter: one kept-alive `http.client` connection.

The exporter (`opentelemetry-exporter-otlp-proto-http`) sends through a pluggable transport; retries, backoff,
headers, compression and timeouts stay the exporter's. Its own transports are requests (its default) and urllib3.
Where neither would do more than send the request as it is (a plain-HTTP endpoint that no proxy variable, .netrc
entry or credential provider covers: `tracing._settings_cannot_apply`), this one sends it for about half of urllib3's
CPU per export (measured: ~107 against ~200 us per 52 KB export), which is paid once per batch of spans on the
server's CPU.

Errors are told as the exporter's transports tell them: a refused, reset or dropped connection, a name that does not
resolve or a timeout while connecting is a connection error (the exporter tries again at once, then backs off); a
timeout waiting for the answer is not (the exporter gives the batch up, as with urllib3).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

__all__ = ["ConnectTimeout", "PlainHTTPResult", "PlainHTTPTransport"]


class ConnectTimeout(TimeoutError):
    """The connection could not be made in time."""


@dataclass(frozen=True, slots=True)
class PlainHTTPResult(BaseHTTPResult):
    body: bytes = b""
    fields: http.client.HTTPMessage | None = None

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        # http.client's headers: looked up by name whatever its case, as the interface asks (a Mapping in use)
        return cast("Mapping[str, str]", self.fields) if self.fields is not None else {}


class PlainHTTPTransport(BaseHTTPTransport):
    """Sends each request over one kept-alive connection to the endpoint, made again when it was lost. Requests
    from several threads (the server's export thread, the SDK's for models' own spans) take turns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._address: tuple[str, int] | None = None
        self._closed = False

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None, timeout: float | None = None,
                data: bytes | None = None) -> BaseHTTPResult:
        try:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"not a plain-HTTP URL: {url!r}")
            address = (parts.hostname, parts.port or 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        except ValueError as error:
            return PlainHTTPResult(error=error)
        with self._lock:
            if self._closed:
                return PlainHTTPResult(error=ConnectionAbortedError("the transport is closed"))
            connection = self._connection
            if connection is None or self._address != address:
                self._close()
                connection = self._connection = http.client.HTTPConnection(*address, timeout=timeout)
                self._address = address
            try:
                if connection.sock is None:
                    connection.timeout = timeout
                    try:
                        connection.connect()
                    except TimeoutError as error:
                        raise ConnectTimeout(f"connecting to {address[0]}:{address[1]}: {error}") from error
                else:
                    connection.sock.settimeout(timeout)
                connection.request(method, target, body=data, headers=headers or {})
                response = connection.getresponse()
                body = response.read()
            except Exception as error:  # the connection is in an unknown state: the next request makes another
                self._close()
                return PlainHTTPResult(error=error)
            if response.will_close:
                self._close()
        return PlainHTTPResult(status_code=response.status, reason=response.reason, body=body,
                               fields=response.headers)

    def is_connection_error(self, exception: Exception | None) -> bool:
        if isinstance(exception, ConnectTimeout):
            return True
        if isinstance(exception, TimeoutError):  # no answer in time: not a connection to make again
            return False
        return isinstance(exception, (OSError, http.client.RemoteDisconnected, http.client.BadStatusLine))

    def close(self) -> None:
        """Stop sending: a request waiting on the connection ends at once (its socket is shut down, which wakes the
        thread waiting on it, where closing would not), and later requests fail."""
        self._closed = True
        connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
