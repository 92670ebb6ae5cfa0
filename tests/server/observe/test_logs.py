"""The logs of the generated server: the JSON access log, one line per answered request, a client's request id
cut to its first 256 characters wherever a line carries it, and one line per record whatever clients send. (The
ids of a traced request in its lines: test_tracing.)
"""

from __future__ import annotations

import io
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import grpc
import pytest
from observe_models import access_lines
from oip.grpc import grpc_service_pb2 as pb
from oip.server.observe.logs import Repeats, TextFormatter
from serving import TIMEOUT, Server, build_repository, running, simple_body, start_server


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """JSON log lines and the access log."""
    repository = build_repository(tmp_path_factory.mktemp("logs") / "models", only=("simple",))
    server = start_server(repository, tmp_path_factory.mktemp("logged"), "--access-log", "--log-format", "json",
                          ready=("simple",))
    yield server
    assert server.stop() == 0, server.log_text()


def test_a_long_request_id_is_cut_in_the_log(logged: Server) -> None:
    """A client's 1 MB request id is written to the JSON log as its first 256 characters (the access log writes a
    line per request with it), never whole."""
    request_id = "L" + secrets.token_hex(500_000)
    with logged.http_client() as http:
        answer = http.post("/v2/models/simple/infer", json=simple_body(id=request_id))
        assert answer.status_code == 200 and answer.json()["id"] == request_id
    (line,) = access_lines(logged, request_id[:256])
    assert line["request_id"] == request_id[:256]
    assert request_id[:300] not in logged.log_text()


FORGED = "2026-01-01 00:00:00,000 INFO    oip.server: FORGED"
# Line breaks of every kind, and a terminal escape, in what clients send: paths, model names, request ids.
HOSTILE = ("\n" + FORGED, "\r\n" + FORGED, "\u2028" + FORGED, "\x85" + FORGED, "\x1b[2J\x1b[31mred")
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: ")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_what_clients_send_cannot_forge_or_steer_log_lines(fmt: str, tmp_path: Path) -> None:
    """Paths, model names and request ids holding line breaks (\\n, \\r\\n, U+2028, NEL) and terminal escapes,
    over REST and gRPC, each answered and logged (the access log, at the debug level): every line of the log is
    one record of the server's (text: it starts with a time and a level; JSON: it is an object), no escape reaches
    it, and in JSON the client's text comes back whole."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, "--access-log", "--log-format", fmt, "--log-level", "debug",
                 ready=("simple",)) as server, server.clients() as (http, stub):
        for text in HOSTILE:
            assert http.post(f"/v2/models/{quote(text)}/infer", json=simple_body()).status_code == 404
            assert http.post(f"/v2/repository/models/{quote(text)}/load").status_code == 404
            answer = http.post("/v2/models/simple/infer", json=simple_body(id=text))
            assert answer.status_code == 200 and answer.json()["id"] == text
            for method, message in (("ModelInfer", pb.ModelInferRequest(model_name=text)),
                                    ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=text))):
                with pytest.raises(grpc.RpcError) as caught:
                    getattr(stub, method)(message, timeout=TIMEOUT)
                assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        log = server.log_text()
    assert "\x1b" not in log
    lines = log.splitlines()  # str.splitlines breaks at every line separator a reader may
    if fmt == "text":
        assert all(TEXT_LINE.match(line) for line in lines), [line for line in lines if not TEXT_LINE.match(line)]
        assert sum("FORGED" in line for line in lines) >= 4 * 2  # logged, escaped, within the server's lines
    else:
        messages = [json.loads(line)["message"] for line in lines]
        assert any("\n" + FORGED in message for message in messages)
        assert any("\u2028" + FORGED in message for message in messages)
    assert not any(line.startswith(FORGED) for line in lines)


def test_a_long_path_is_cut_in_the_access_log(logged: Server) -> None:
    """A path of 30,000 characters (within the header limit) is answered, and its access-log line keeps the
    path's first 1,000 characters and says how long it was: a client cannot make the log grow as fast as it
    sends."""
    path = f"/v2/models/{'p' * 30_000}/infer"
    with logged.http_client() as http:
        assert http.post(path, json=simple_body()).status_code == 404
    deadline = time.monotonic() + TIMEOUT
    while not (lines := [json.loads(line) for line in logged.log_text().splitlines() if "ppppp" in line]):
        assert time.monotonic() < deadline, logged.log_tail()
        time.sleep(0.05)
    (line,) = lines
    assert line["path"] == f"{path[:1000]}... ({len(path)} characters)", line["path"][-60:]
    assert len(line["message"]) < 1200 and f"({len('POST ' + path)} characters)" in line["message"]



def test_repeats_keep_a_line_per_message_a_minute() -> None:
    """`Repeats` on a handler: the first warning or error of a message of a thinned logger passes, the next ones
    within the minute are left out (per logger, level and message), the first after it passes saying how many;
    their info lines and other loggers' records all pass, and it remembers a bounded number of messages."""
    now = [0.0]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    repeats = Repeats(("opentelemetry",), 60.0, clock=lambda: now[0])
    handler.addFilter(repeats)
    handler.setFormatter(TextFormatter())
    exporter, other = logging.getLogger("opentelemetry.exporter.test"), logging.getLogger("oip.test_repeats")
    for logger in (exporter, other):
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    try:
        for second in range(0, 125, 5):  # every 5 s for two minutes
            now[0] = float(second)
            exporter.warning("export failed: %s", second)
            exporter.warning("queue full")
            exporter.error("batch dropped")
            exporter.info("retrying")
            other.warning("ours: %s", second)
        for n in range(5000):  # a library that puts what varies in the message itself
            exporter.warning(f"failed at {n}")
        assert len(repeats.last) <= 1000 and len(repeats.left_out) <= 1000
    finally:
        for logger in (exporter, other):
            logger.removeHandler(handler)
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines if "export failed" in line] == [
        "export failed: 0", "export failed: 60 (and 11 more like it since the last one written)",
        "export failed: 120 (and 11 more like it since the last one written)"]
    assert sum("queue full" in line for line in lines) == sum("batch dropped" in line for line in lines) == 3
    assert sum("retrying" in line for line in lines) == sum("ours:" in line for line in lines) == 25



def test_malformed_http_requests_do_not_write_a_line_each(tmp_path: Path) -> None:
    """150 malformed HTTP requests (bytes that are not HTTP, a bad Content-Length, a bad chunk) are each refused
    400, and the log says so once, not 150 times: a client cannot fill it at the rate it sends."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, ready=("simple",)) as server:
        for _ in range(50):
            for request in (b"NOT HTTP \x00\x01\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"ZZZ\r\n"):
                with socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT) as sock:
                    sock.sendall(request)
                    assert sock.recv(100).startswith(b"HTTP/1.1 400 ")
        with server.http_client() as http:
            assert http.get("/v2/health/ready").status_code == 200
        log = server.log_text()
    assert log.count("Invalid HTTP request received.") == 1, log[-3000:]


FAILS = '''
from oip.server.model import Model, TensorSpec


class Fails(Model):
    inputs = [TensorSpec("X", "INT32", [1])]
    outputs = [TensorSpec("Y", "INT32", [1])]

    def infer(self, inputs, parameters):
        raise ValueError(f"cannot do {int(inputs['X'][0]) % 2}")
'''


def test_a_model_failing_the_same_way_writes_its_traceback_once_a_minute(tmp_path: Path) -> None:
    """A model that fails every request, two ways (by its input): each client gets its error and the statistics
    count every failure, but the log has each way's traceback once, not once a request."""
    repository = tmp_path / "models"
    (repository / "fails").mkdir(parents=True)
    (repository / "fails" / "model.toml").write_text('class = "model:Fails"\n')
    (repository / "fails" / "model.py").write_text(FAILS)
    with running(repository, tmp_path, ready=("fails",)) as server, server.clients() as (http, stub):
        for n in range(100):
            answer = http.post("/v2/models/fails/infer", json={
                "inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [n]}]})
            assert answer.status_code == 500 and answer.json() == {"error": f"cannot do {n % 2}"}
        request = pb.ModelInferRequest(model_name="fails", raw_input_contents=[(7).to_bytes(4, "little")])
        request.inputs.add(name="X", datatype="INT32", shape=[1])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=TIMEOUT)
        assert caught.value.code() is grpc.StatusCode.INTERNAL and caught.value.details() == "cannot do 1"
        stats = http.get("/v2/models/fails/stats").json()["model_stats"][0]["inference_stats"]
        assert stats["fail"]["count"] == 101
        log = server.log_text()
    assert log.count("model 'fails' version 1 failed") == 2, log[-3000:]
    assert log.count("ValueError: cannot do 0") == log.count("ValueError: cannot do 1") == 1
