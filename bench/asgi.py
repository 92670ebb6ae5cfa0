"""One HTTP request through an ASGI app in process, no sockets (bench/cost.py and bench/trace_cost.py)."""

from __future__ import annotations

import asyncio
from typing import Any


async def call(
    app: Any, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> list[dict[str, Any]]:
    """The messages `app` sent in answer to one request: `http.response.start`, then the body's."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the request is whole: no disconnect while it is answered
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent
