"""HTTP/1.1 requests through the server's own HTTP layer in process, no sockets (bench/cost.py).

`Connection` is one keep-alive connection: the protocol class `serve` gives uvicorn (`oip.server.rest.http`:
httptools' parser, and inference requests answered without ASGI where the server answers them so), on a transport
that keeps what it is given. A request goes in as the bytes a client sends; its answer is awaited until the bytes
written hold a whole response (by its content-length, or the last chunk of a chunked body); `parse` reads it. So a
small inference costs here what it costs the server: the parser's callbacks, the direct or ASGI way, the writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn


class _Transport(asyncio.Transport):
    """Keeps what is written; resolves `answered` once it holds a whole response."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.answered: asyncio.Future[None] | None = None

    def write(self, data: Any) -> None:
        self.written += data
        self._check()

    def writelines(self, data: Any) -> None:
        for piece in data:
            self.written += piece
        self._check()

    def _check(self) -> None:
        if self.answered is None or self.answered.done():
            return
        written = self.written
        head_end = written.find(b"\r\n\r\n")
        if head_end < 0:
            return
        marker = written.find(b"content-length: ", 0, head_end)
        if marker >= 0:
            whole = len(written) - head_end - 4 >= int(written[marker + 16:written.index(b"\r\n", marker)])
        else:  # chunked: the last chunk
            whole = written.endswith(b"\r\n0\r\n\r\n")
        if whole:
            self.answered.set_result(None)

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Connection:
    """One connection into the HTTP layer `serve` runs for `app` under `settings` (call within a running loop)."""

    def __init__(self, app: Any, settings: Any) -> None:
        from oip.server.rest.http import http_protocol

        config = uvicorn.Config(
            app, lifespan="off", log_config=None,
            http=http_protocol(settings.http_header_timeout, settings.http_body_timeout,  # type: ignore[arg-type]
                               settings.http_max_header_bytes, app, settings.max_request_bytes),
        )
        config.load()
        server = uvicorn.Server(config)
        self.protocol = config.http_protocol_class(
            config=config, server_state=server.server_state, app_state={}, _loop=asyncio.get_running_loop()
        )
        self.transport = _Transport()
        self.protocol.connection_made(self.transport)

    async def request(self, raw: bytes) -> bytes:
        """Send one request (its bytes); its answer's bytes as written (`parse` reads them)."""
        transport = self.transport
        transport.written = bytearray()
        answered = transport.answered = asyncio.get_running_loop().create_future()
        self.protocol.data_received(raw)
        if not answered.done():
            await answered
        return bytes(transport.written)

    def close(self) -> None:
        self.protocol.connection_lost(None)


def parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """An answer's status, headers (lowercase names) and body (a chunked body's chunks joined)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        pieces, rest = [], body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            pieces.append(rest[:size])
            rest = rest[size + 2:]
        body = b"".join(pieces)
    return int(lines[0].split()[1]), headers, body
