"""A hostile HTTP server on loopback, for the tests of what a client does with the answers of a server it cannot
trust (`oipgen client`).

`HostileServer(answer)` listens on 127.0.0.1 on an ephemeral port (over TLS when given a server context) and
serves each connection in a thread: it reads one request (line, headers, body by Content-Length), records it, and
hands it to `answer(request, connection)`, which writes whatever the test wants: a well-formed answer
(`http_answer`), a broken one, bytes dripped slowly, or nothing. The connection is closed after each answer.
`sent` counts the bytes the answers managed to write, so a test can tell a client that stopped reading from one
that read everything; `stopping` is set when the server closes, for answers that wait.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = Callable[[Request, socket.socket], None]


def http_answer(body: bytes | str | Any, status: str = "200 OK", headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 answer: JSON of `body` unless it is bytes or str already, with its Content-Length."""
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
    head = {"Content-Type": "application/json", "Content-Length": str(len(data)), "Connection": "close",
            **(headers or {})}
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in head.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class HostileServer:
    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.requests: list[Request] = []
        self.sent = 0
        self.finished = threading.Event()  # set when an answer function returned (it may have been cut short)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def send(self, connection: socket.socket, data: bytes) -> None:
        """Write `data`, counting what went out; raises OSError when the client has gone."""
        view = memoryview(data)
        while view:
            n = connection.send(view[:65536])
            with self._lock:
                self.sent += n
            view = view[n:]

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(30)
            try:
                if self.tls is not None:
                    connection = self.tls.wrap_socket(connection, server_side=True)
                request = self._read(connection)
            except (OSError, ValueError):
                return
            if request is None:
                return
            with self._lock:
                self.requests.append(request)
            with contextlib.suppress(OSError):
                self.answer(request, connection)
            self.finished.set()

    @staticmethod
    def _read(connection: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            data += chunk
            if len(data) > 1 << 20:
                raise ValueError("request head too long")
        head, _, body = data.partition(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        method, path, _ = line.split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                break
            body += chunk
        return Request(method, path, headers, body)

    def close(self) -> None:
        self.stopping.set()
        self._listener.close()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
