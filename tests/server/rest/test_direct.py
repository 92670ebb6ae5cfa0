"""Inference requests answered by the HTTP layer itself, without ASGI (`rest.http`, `OipApp.direct`).

In process, the protocol over a transport that records what it is given: a small inference request is answered
within the read that completed it (no task, no turn of the loop), one whose answer waits is answered by a task, and
anything else goes through ASGI. Over real sockets against a server: the same answers byte for byte as the ASGI way
(the same request sent chunked, which only ASGI takes), pipelined requests answered in order across both ways,
HTTP/1.0 and `Connection: close`, metrics and the access log, a client gone mid-answer, and a shutdown that waits
for an answer in progress.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from conftest import ROOT
from oip import framing
from oip.server import Assembly, ModelRepository, Settings
from oip.server.rest.http import http_protocol
from oip.server.rest.infer_codec import BinaryParts
from serving import (
    STOP_TIMEOUT,
    Server,
    build_repository,
    check_simple,
    requests_answered,
    scrape,
    simple_body,
    start_server,
)
from starlette.responses import Response, StreamingResponse

SIMPLE = "/v2/models/simple/infer"

# --- in process ---------------------------------------------------------------------------------------------------


class _Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.writes = 0  # calls that write: each a system call on a real transport

    def write(self, data: Any) -> None:
        self.written += data
        self.writes += 1

    def writelines(self, data: Any) -> None:
        for piece in data:
            self.written += piece
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _App:
    """An app with one inference route, `/v2/models/{model_name}/infer`, whose answer echoes what it was given;
    with `wait`, it first waits for that event. Every other request (over ASGI) is answered `asgi`."""

    root_path = ""

    def __init__(self) -> None:
        self.wait: asyncio.Event | None = None
        self.seen: list[tuple[dict[str, str], bytes, bool]] = []
        self.counted: list[tuple[str, int]] = []
        self.log = None

    def count(self, operation: str, status: int) -> None:
        self.counted.append((operation, status))

    def direct(self, path: str) -> Any:
        match = re.fullmatch(r"/v2/models/([^/]+)/infer", path)
        return None if match is None else ("model_infer", {"model_name": match[1]}, self.answer)

    async def answer(self, fields: dict[str, str], body: Any, headers: Any, parts: bool) -> Response:
        if self.wait is not None:
            await self.wait.wait()
        self.seen.append((fields, bytes(body), parts))
        return Response(b"echo " + bytes(body), media_type="text/plain")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"asgi"})


def _post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: x", *headers]
    if not any(h.lower().startswith("transfer-encoding") for h in headers):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
def protocol() -> Iterator[tuple[Any, _App, _Transport, uvicorn.Server, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    app = _App()
    config = uvicorn.Config(app, http=http_protocol(10.0, 10.0, 64 * 1024, app),  # type: ignore[arg-type]
                            lifespan="off", log_config=None)
    config.load()
    server = uvicorn.Server(config)
    proto = config.http_protocol_class(config=config, server_state=server.server_state, app_state={}, _loop=loop)
    transport = _Transport()
    proto.connection_made(transport)
    yield proto, app, transport, server, loop
    proto.connection_lost(None)
    loop.close()


def test_a_small_inference_is_answered_within_the_read(protocol: Any) -> None:
    proto, app, transport, server, _ = protocol
    proto.data_received(_post("/v2/models/m/infer", b"abc"))
    assert app.seen == [({"model_name": "m"}, b"abc", True)]
    assert not server.server_state.tasks  # no task, and no turn of the loop: answered in the read
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.written.endswith(b"\r\n\r\necho abc")
    assert b"content-length: 8\r\n" in transport.written
    assert app.counted == [("model_infer", 200)]
    assert not transport.closed


def test_an_answer_in_parts_is_written_as_its_parts(protocol: Any) -> None:
    proto, app, transport, _, _ = protocol
    data = np.arange(20_000, dtype=np.float32)  # 80,000 bytes of output: sent as parts, not joined into one body

    async def answer(fields: dict[str, str], body: Any, headers: Any, parts: bool) -> Response:
        assert parts
        return BinaryParts(b'{"outputs":[]}', [memoryview(data).cast("B")])

    app.answer = answer  # type: ignore[method-assign]
    proto.data_received(_post("/v2/models/m/infer", b"{}"))
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and f"content-length: {14 + data.nbytes}".encode() in head
    assert body == b'{"outputs":[]}' + data.tobytes()


def test_a_body_in_pieces_is_answered_once_whole(protocol: Any) -> None:
    proto, app, transport, _, _ = protocol
    request = _post("/v2/models/m/infer", b"0123456789")
    for i in range(0, len(request), 7):
        proto.data_received(request[i:i + 7])
    assert app.seen == [({"model_name": "m"}, b"0123456789", True)]
    assert transport.written.endswith(b"echo 0123456789")


def test_an_answer_that_waits_is_finished_by_a_task_and_keeps_the_order(protocol: Any) -> None:
    proto, app, transport, server, loop = protocol

    async def scenario() -> None:
        app.wait = asyncio.Event()
        # The second request comes while the first is being answered: it waits its turn (through ASGI).
        proto.data_received(_post("/v2/models/m/infer", b"first") + _post("/v2/models/m/infer", b"second"))
        assert len(server.server_state.tasks) == 1 and not transport.written
        app.wait.set()
        for _ in range(100):
            await asyncio.sleep(0)
            if transport.written.count(b"HTTP/1.1 200") == 2:
                break

    loop.run_until_complete(scenario())
    assert transport.written.count(b"HTTP/1.1 200") == 2
    assert transport.written.index(b"echo first") < transport.written.index(b"asgi")
    assert app.seen == [({"model_name": "m"}, b"first", True)]
    assert not server.server_state.tasks


@pytest.mark.parametrize("request_bytes", [
    _post("/v2/models/m/infer", b"abc", "transfer-encoding: chunked")[:-3] + b"3\r\nabc\r\n0\r\n\r\n",
    _post("/v2/models/m/infer", b"x" * (64 * 1024 + 1)),
    _post("/v2/models/m/infer", b"abc", "content-encoding: gzip"),
    _post("/v2/models/m/infer", b"abc", "expect: 100-continue"),
    _post("/v2/models/m/ready", b"abc"),
    b"GET /v2/models/m/infer HTTP/1.1\r\nhost: x\r\n\r\n",
], ids=["chunked", "large", "compressed", "100-continue", "other-path", "other-method"])
def test_anything_else_goes_through_asgi(protocol: Any, request_bytes: bytes) -> None:
    proto, app, transport, _, loop = protocol

    async def scenario() -> None:
        proto.data_received(request_bytes)
        for _ in range(100):
            await asyncio.sleep(0)
            if transport.written.endswith(b"asgi"):
                break

    loop.run_until_complete(scenario())
    assert not app.seen
    assert transport.written.endswith(b"\r\n\r\nasgi")


def test_a_body_over_the_request_limit_is_left_to_asgi() -> None:
    # The app answers a body over `--max-request-bytes` 413 (ASGI's way reads it against the limit): the HTTP
    # layer may not take, and answer, what the app refuses.
    loop = asyncio.new_event_loop()
    app = _App()
    config = uvicorn.Config(app, http=http_protocol(10.0, 10.0, 64 * 1024, app, 8),  # type: ignore[arg-type]
                            lifespan="off", log_config=None)
    config.load()
    proto = config.http_protocol_class(config=config, server_state=uvicorn.Server(config).server_state,
                                       app_state={}, _loop=loop)
    transport = _Transport()
    proto.connection_made(transport)
    try:
        proto.data_received(_post("/v2/models/m/infer", b"12345678"))  # at the limit: answered here
        assert app.seen == [({"model_name": "m"}, b"12345678", True)]

        async def over() -> None:
            proto.data_received(_post("/v2/models/m/infer", b"123456789"))
            for _ in range(100):
                await asyncio.sleep(0)
                if transport.written.endswith(b"asgi"):
                    break

        loop.run_until_complete(over())
        assert len(app.seen) == 1 and transport.written.endswith(b"\r\n\r\nasgi")
    finally:
        proto.connection_lost(None)
        loop.close()


def test_a_client_that_does_not_read_its_answers_is_answered_through_asgi(protocol: Any) -> None:
    proto, app, transport, _, loop = protocol
    proto.pause_writing()  # the transport's buffer is full: the client reads nothing
    proto.data_received(_post("/v2/models/m/infer", b"a"))

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    loop.run_until_complete(settle())
    assert not app.seen and not transport.written  # ASGI's way waits for the client to read before answering
    proto.resume_writing()
    loop.run_until_complete(settle())
    assert transport.written.endswith(b"asgi")


def test_forwarded_client_goes_through_asgi_only_when_logging(protocol: Any) -> None:
    proto, app, transport, _, loop = protocol
    proto.data_received(_post("/v2/models/m/infer", b"a", "x-forwarded-for: 10.0.0.1"))
    assert len(app.seen) == 1  # no access log: the client's address matters to nobody
    app.log = lambda *args: None
    proto.data_received(_post("/v2/models/m/infer", b"b", "x-forwarded-for: 10.0.0.1"))

    async def settle() -> None:
        for _ in range(100):
            await asyncio.sleep(0)

    loop.run_until_complete(settle())
    assert len(app.seen) == 1 and transport.written.endswith(b"asgi")


def _events_app(app: _App, gate: asyncio.Event, made: list[int], closed: list[bool]) -> None:
    """`app`'s answer becomes an endless stream of pieces `b"<n>;"`, made while `gate` is set."""

    async def pieces() -> Any:
        try:
            while True:
                await gate.wait()
                made.append(len(made))
                yield b"%d;" % made[-1]
                await asyncio.sleep(0)  # one piece a turn of the loop, as the data plane's streams go
        finally:
            closed.append(True)

    async def answer(fields: dict[str, str], body: Any, headers: Any, parts: bool) -> Response:
        return StreamingResponse(pieces(), media_type="text/event-stream")

    app.answer = answer  # type: ignore[method-assign]


def test_a_stream_is_written_in_chunks_and_waits_for_a_client_that_does_not_read(protocol: Any) -> None:
    proto, app, transport, server, loop = protocol
    gate, made, closed = asyncio.Event(), [], []
    _events_app(app, gate, made, closed)

    async def turns(n: int = 50) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    async def scenario() -> None:
        proto.data_received(_post("/v2/models/m/infer", b"{}"))
        await turns()
        assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked\r\n" in transport.written and not made
        gate.set()
        await turns(5)
        gate.clear()  # the model waits: what it made has been written
        await turns(3)
        assert transport.written.endswith(b"2\r\n%d;\r\n" % made[-1]) and len(made) > 1
        gate.set()
        proto.pause_writing()  # the transport's buffer is full: the stream waits, making nothing more
        await turns()
        held = len(made)
        await turns()
        assert len(made) == held
        proto.resume_writing()
        await turns()
        assert len(made) > held
        assert server.server_state.tasks and not closed  # the stream goes on while the model has more
        proto.connection_lost(None)
        for _ in range(20):
            await asyncio.sleep(0)

    loop.run_until_complete(scenario())
    assert closed == [True] and not server.server_state.tasks


def test_the_pieces_of_one_turn_of_the_loop_are_written_at_once(protocol: Any) -> None:
    """A model that yields several pieces without waiting has them written in one send, with the head; one that
    waits between them has each written as it waits."""
    proto, app, transport, server, loop = protocol
    release = asyncio.Event()

    async def pieces() -> Any:
        for i in range(5):  # no wait in between
            yield b"%d;" % i
        await release.wait()
        for i in range(5, 8):  # a wait after each
            yield b"%d;" % i
            await asyncio.sleep(0)

    async def answer(fields: dict[str, str], body: Any, headers: Any, parts: bool) -> Response:
        return StreamingResponse(pieces(), media_type="text/event-stream")

    app.answer = answer  # type: ignore[method-assign]

    async def scenario() -> None:
        proto.data_received(_post("/v2/models/m/infer", b"{}"))
        for _ in range(10):
            await asyncio.sleep(0)
        assert transport.writes == 1  # the head and the five pieces, together
        assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
        assert transport.written.endswith(b"".join(b"2\r\n%d;\r\n" % i for i in range(5)))
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)

    loop.run_until_complete(scenario())
    assert transport.writes == 1 + 3 + 1  # then each piece on its own, and the end
    assert transport.written.endswith(b"".join(b"2\r\n%d;\r\n" % i for i in range(8)) + b"0\r\n\r\n")
    assert not server.server_state.tasks


def test_a_client_gone_mid_stream_stops_it_at_once(protocol: Any) -> None:
    proto, app, _, server, loop = protocol
    gate, made, closed = asyncio.Event(), [], []
    _events_app(app, gate, made, closed)

    async def scenario() -> None:
        proto.data_received(_post("/v2/models/m/infer", b"{}"))
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        gate.clear()  # the model waits for its next piece, for ever
        for _ in range(5):
            await asyncio.sleep(0)
        proto.connection_lost(None)
        for _ in range(20):
            await asyncio.sleep(0)

    loop.run_until_complete(scenario())
    assert closed == [True] and not server.server_state.tasks  # not left waiting for a piece nobody reads
    assert app.counted == [("model_infer", 200)]


def test_http_1_0_closes_after_the_answer(protocol: Any) -> None:
    proto, app, transport, _, _ = protocol
    proto.data_received(b"POST /v2/models/m/infer HTTP/1.0\r\ncontent-length: 1\r\n\r\nz")
    assert app.seen and b"connection: close\r\n" in transport.written and transport.closed


# --- over real sockets --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("direct")
    repository = build_repository(root / "models", extra=("slow",), only=("simple",))
    for name in ("text_echo", "text_stream"):
        shutil.copytree(ROOT / "examples" / "models" / name, repository / name)
    served = start_server(repository, root / "run", "--access-log",
                          ready=("simple", "slow", "text_echo", "text_stream"))
    yield served
    assert served.stop() == 0, served.log_tail()


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_answer(stream: Any) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 answer from a buffered socket file: status line, headers (lowercase names), body."""
    status = stream.readline().decode().rstrip("\r\n")
    headers: dict[str, str] = {}
    while (line := stream.readline().decode()) not in ("\r\n", ""):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int(stream.readline().strip(), 16):
            body += stream.read(size)
            stream.readline()
        stream.readline()
    else:
        body = stream.read(int(headers.get("content-length", "0")))
    return status, headers, body


def _chunked(path: str, body: bytes, *headers: str) -> bytes:
    """The request sent with a chunked body: the HTTP layer leaves those to ASGI."""
    return _post(path, b"", "transfer-encoding: chunked", *headers) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _exchange(server: Server, request: bytes, answers: int = 1) -> list[tuple[str, dict[str, str], bytes]]:
    with _connect(server) as sock, sock.makefile("rb") as stream:
        sock.sendall(request)
        return [_read_answer(stream) for _ in range(answers)]


def _binary_simple() -> tuple[bytes, str]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
                                     "parameters": {"binary_data_size": 64}},
                                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
                                     "parameters": {"binary_data_size": 64}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    data = bytes(range(64)) + bytes(64)
    return header + data, f"{framing.HEADER_LENGTH}: {len(header)}"


CASES: dict[str, tuple[str, bytes, tuple[str, ...]]] = {
    "ok": (SIMPLE, json.dumps(simple_body(id="a")).encode(), ()),
    "binary": (SIMPLE, _binary_simple()[0], (_binary_simple()[1],)),
    "not-json": (SIMPLE, b"{nope", ()),
    "unknown-model": ("/v2/models/nothing/infer", json.dumps(simple_body()).encode(), ()),
    "wrong-datatype": (SIMPLE, json.dumps(simple_body()).replace('"INT32"', '"FP32"', 1).encode(), ()),
    "versioned": ("/v2/models/simple/versions/1/infer", json.dumps(simple_body()).encode(), ()),
    "generate": ("/v2/models/text_echo/generate", b'{"text_input": "one two", "id": "g"}', ()),
    "generate-not-an-object": ("/v2/models/text_echo/generate", b'["one two"]', ()),
    "generate-unknown-model": ("/v2/models/nothing/generate", b'{"text_input": "x"}', ()),
    "generate-stream": ("/v2/models/text_stream/generate_stream", b'{"text_input": "one two three", "id": "s"}', ()),
    "generate-stream-unknown-model": ("/v2/models/nothing/generate_stream", b'{"text_input": "x"}', ()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_answer_is_the_asgi_answer_byte_for_byte(server: Server, case: str) -> None:
    path, body, headers = CASES[case]
    [(status, direct_headers, direct_body)] = _exchange(server, _post(path, body, *headers))
    [(asgi_status, asgi_headers, asgi_body)] = _exchange(server, _chunked(path, body, *headers))
    assert (status, direct_body) == (asgi_status, asgi_body)
    direct_headers.pop("date"), asgi_headers.pop("date")
    assert direct_headers == asgi_headers
    if case in ("ok", "binary", "versioned", "generate", "generate-stream"):
        assert status == "HTTP/1.1 200 OK", direct_body
    else:
        assert status.split()[1] in ("400", "404") and json.loads(direct_body)["error"]


def test_the_app_answers_inference_and_generate_directly() -> None:
    app = Assembly.build(ModelRepository(), Settings()).rest_app()
    assert app.direct("/v2/models/m/infer")[:2] == ("model_infer", {"model_name": "m"})  # type: ignore[index]
    assert app.direct("/v2/models/m/versions/2/generate")[:2] == (  # type: ignore[index]
        "generate", {"model_name": "m", "model_version": "2"})
    assert app.direct("/v2/models/m/generate_stream")[:2] == (  # type: ignore[index]
        "generate_stream", {"model_name": "m"})
    assert app.direct("/v2/models/m/ready") is None


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    slow = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32", "data": [7, 8]}],
                       "parameters": {"delay": 0.3}}).encode()
    requests = [
        _post("/v2/models/slow/infer", slow),  # answered by a task: the model runs in a worker thread
        b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n",
        _post(SIMPLE, json.dumps(simple_body(id="third")).encode()),
        _post(SIMPLE, json.dumps(simple_body(id="fourth")).encode()),
    ]
    answers = _exchange(server, b"".join(requests), answers=4)
    assert [status for status, _, _ in answers] == ["HTTP/1.1 200 OK"] * 4
    assert json.loads(answers[0][2])["outputs"][0]["data"] == [7, 8]
    assert json.loads(answers[1][2]) == {"ready": True}
    assert [json.loads(body)["id"] for _, _, body in answers[2:]] == ["third", "fourth"]


@pytest.mark.parametrize("version, extra", [("HTTP/1.0", ()), ("HTTP/1.1", ("connection: close",))])
def test_a_connection_that_ends_with_the_answer_is_closed(server: Server, version: str,
                                                        extra: tuple[str, ...]) -> None:
    request = _post(SIMPLE, json.dumps(simple_body()).encode(), *extra).replace(b"HTTP/1.1", version.encode(), 1)
    with _connect(server) as sock, sock.makefile("rb") as stream:
        sock.sendall(request)
        status, headers, body = _read_answer(stream)
        assert status.endswith("200 OK") and headers["connection"] == "close", (status, headers)
        assert json.loads(body)["outputs"][0]["name"] == "OUTPUT0"
        assert stream.read() == b""  # the server closed the connection


def test_direct_answers_are_counted_and_logged(server: Server) -> None:
    before = scrape(server.url)
    marker = "/v2/models/simple/versions/1/infer"
    for _ in range(3):
        [(status, _, _)] = _exchange(server, _post(marker, json.dumps(simple_body()).encode()))
        assert status.endswith("200 OK")
    [(status, _, _)] = _exchange(server, _post(SIMPLE, b"{nope"))
    assert status.split()[1] == "400"
    after = scrape(server.url)
    assert requests_answered(before, after, transport="rest", operation="model_infer", code="200") >= 3
    assert requests_answered(before, after, transport="rest", operation="model_infer", code="400") >= 1
    deadline = time.monotonic() + 10
    while server.log_text().count(f"POST {marker}") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line for line in server.log_text().splitlines() if f"POST {marker}" in line]
    assert len(lines) >= 3 and all(" 200 " in line or "200" in line.split() for line in lines), lines[-3:]


def test_a_client_gone_mid_answer_leaves_the_server_serving(server: Server) -> None:
    slow = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}],
                       "parameters": {"delay": 0.3}}).encode()
    for _ in range(3):
        with _connect(server) as sock:
            sock.sendall(_post("/v2/models/slow/infer", slow))
    time.sleep(0.5)
    with server.clients() as (http, stub):
        check_simple(http, stub)
    assert "Traceback" not in server.log_text()


def test_shutdown_waits_for_an_answer_in_progress(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", extra=("slow",), only=("simple",))
    served = start_server(repository, tmp_path / "run", ready=("slow",))
    try:
        slow = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [5]}],
                           "parameters": {"delay": 1.0}}).encode()
        with _connect(served) as sock, sock.makefile("rb") as stream:
            sock.sendall(_post("/v2/models/slow/infer", slow))
            deadline = time.monotonic() + 10
            while not list(repository.glob("slow/started-*")) and time.monotonic() < deadline:
                time.sleep(0.02)
            served.process.send_signal(signal.SIGTERM)
            status, _, body = _read_answer(stream)
        assert status.endswith("200 OK") and json.loads(body)["outputs"][0]["data"] == [5]
        assert served.process.wait(STOP_TIMEOUT) == 0, served.log_tail()
    finally:
        served.kill()


def test_the_request_limit_holds_for_small_bodies(tmp_path: Path) -> None:
    body = json.dumps(simple_body()).encode()
    served = start_server(build_repository(tmp_path / "models", only=("simple",)), tmp_path / "run",
                          "--max-request-bytes", str(len(body)))
    try:
        [(status, _, answer)] = _exchange(served, _post(SIMPLE, body))
        assert status == "HTTP/1.1 200 OK", answer
        [(status, _, answer)] = _exchange(served, _post(SIMPLE, body + b" "))  # one byte over
        assert status.startswith("HTTP/1.1 413 "), answer  # the reason phrase is Python's: renamed in 3.13
        assert json.loads(answer) == {"error": f"request body of {len(body) + 1} bytes exceeds the limit of "
                                               f"{len(body)} bytes"}
        [(status, _, answer)] = _exchange(served, _post(SIMPLE, body))
        assert status == "HTTP/1.1 200 OK", answer
    finally:
        assert served.stop() == 0, served.log_tail()
