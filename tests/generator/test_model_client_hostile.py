"""`oipgen client` against a hostile server: every answer is refused in one line with exit 1, or makes a module
that cannot be steered (its encoding, its code, its names are the generator's), within one deadline.

Each test runs the real command against a small socket server on loopback (tests/hostile.py) that answers as an
attacker would. About 30 s.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import BIN, GENERATED, ROOT
from hostile import HostileServer, Request, http_answer

from oipgen.model_client import (
    MAX_ANSWER_BYTES,
    MAX_DIMENSIONS,
    MAX_NAME,
    MAX_TENSORS,
    ClientError,
    fetch_metadata,
)

ENCODING_LINE = "# -*- coding: utf-8 -*-"


def metadata(name: str = "m", inputs: Any = None, outputs: Any = None, **extra: Any) -> dict[str, Any]:
    tensor = [{"name": "x", "datatype": "FP32", "shape": [1]}]
    return {"name": name, "versions": ["1"], "platform": "p", "inputs": tensor if inputs is None else inputs,
            "outputs": tensor if outputs is None else outputs, **extra}


def serve_metadata(doc: Any) -> HostileServer:
    return HostileServer(lambda request, connection: connection.sendall(http_answer(doc)))


def client(server: HostileServer, out: Path, *args: str, model: str = "m",
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return oipgen_timed(timeout, "client", "--server", server.url, "--model", model, "--out", str(out), *args)


def oipgen_timed(timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "oipgen"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def assert_refused(result: subprocess.CompletedProcess[str], out: Path, *phrases: str) -> str:
    """Exit 1, one line on stderr starting `oipgen: `, no traceback, nothing written."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("oipgen: "), result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr
    return result.stderr


def run_module(path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Import a generated module in a fresh interpreter (the generated package on the path) and run `code`."""
    return subprocess.run(
        [sys.executable, "-c", f"import {path.stem} as module\n{code}"], cwd=path.parent, capture_output=True,
        text=True, timeout=120, env={"PYTHONPATH": f"{path.parent}:{GENERATED}", "PATH": "/usr/bin:/bin"},
    )


def utf7_hidden(text: str, hide: str = "\"'\n") -> str:
    """`text` with each character of `hide` written as UTF-7 spells it (`"` -> `+ACI-`): plain ASCII that a file
    decoded as UTF-7 reads as the hidden characters."""
    def spelt(c: str) -> str:
        return "+" + base64.b64encode(c.encode("utf-16-be")).decode().rstrip("=") + "-"

    return "".join(spelt(c) if c in hide else c for c in text)


# --- the module's text ------------------------------------------------------------------------------------------

def test_a_coding_declaration_in_a_model_name_cannot_change_the_modules_encoding(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    name = "chat coding:utf_7 v1"
    # Read as UTF-7, the tensor's name closes its string in INPUTS, calls a function and opens a string again.
    tensor = utf7_hidden(f"""x', __import__("pathlib").Path("{marker}").touch(), '""")
    doc = metadata(name, inputs=[{"name": tensor, "datatype": "FP32", "shape": [1]}])
    out = tmp_path / "chat_client.py"
    with serve_metadata(doc) as server:
        result = client(server, out, model=name)
    assert result.returncode == 0, result.stderr
    run = run_module(out, f"print(module.MODEL == {name!r}, module.INPUTS[0][0] == {tensor!r})")
    assert not marker.exists(), "importing the module ran the metadata's code"
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "True"]
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ENCODING_LINE
    assert "coding" not in lines[1] and name not in lines[1]


def test_a_version_with_a_newline_cannot_put_code_in_the_module(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    version = f'1\n__import__("pathlib").Path("{marker}").touch()\n#'
    out = tmp_path / "versioned.py"
    with serve_metadata(metadata()) as server:
        result = client(server, out, "--version", version)
        assert [r.path for r in server.requests] == ["/v2/models/m/versions/" + quote(version, safe="")]
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8").splitlines()[0] == ENCODING_LINE
    run = run_module(out, f"print(module.VERSION == {version!r})")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True"] and not marker.exists()


OWN_NAMES = ["MODEL", "VERSION", "INPUTS", "OUTPUTS", "DATATYPES", "_typed", "_oip", "outputs_of", "np", "npt",
             "self", "request_id", "super", "str", "Any", "Final", "dataclass"]


def infer_answer(names: list[str]) -> Any:
    def answer(request: Request, connection: socket.socket) -> None:
        if request.method == "GET":
            doc = metadata("m", [{"name": n, "datatype": "INT32", "shape": [1]} for n in names],
                           [{"name": n, "datatype": "INT32", "shape": [1]} for n in names])
            connection.sendall(http_answer(doc))
            return
        body = request.json()
        outputs = [{"name": t["name"], "datatype": "INT32", "shape": [1], "data": [t["data"][0] * 2]}
                   for t in body["inputs"]]
        connection.sendall(http_answer({"model_name": "m", "outputs": outputs}))

    return answer


def test_tensor_names_cannot_shadow_the_names_the_modules_code_uses(tmp_path: Path) -> None:
    """Inputs and outputs named like the module's globals, imports, builtins and infer's options: the model, its
    tables and its helpers stay what they are inside `infer`, and every tensor still travels under its name."""
    out = tmp_path / "own_names.py"
    with HostileServer(infer_answer(OWN_NAMES)) as server:
        generated = client(server, out)
        assert generated.returncode == 0, generated.stderr
        run = run_module(out, textwrap.dedent(f"""
            import dataclasses, inspect
            import numpy as np
            from oip.client import RestClient
            arguments = [p for p in inspect.signature(module.MClient.infer).parameters if p != "self"][:-4]
            values = {{a: np.array([i], dtype=np.int32) for i, a in enumerate(arguments)}}
            with module.MClient(RestClient({server.url!r}, binary=False)) as c:
                result = c.infer(**values)
            fields = [f.name for f in dataclasses.fields(result)]
            print(json.dumps({{"arguments": arguments, "fields": fields,
                              "values": [int(getattr(result, f)[0]) for f in fields], "model": module.MODEL}}))
        """).replace("import dataclasses", "import dataclasses, json"))
        assert run.returncode == 0, run.stderr
        seen = [r for r in server.requests if r.method == "POST"]
    report = json.loads(run.stdout)
    assert report["model"] == "m"
    # No argument or field takes a name the module's code reads; each one is still its tensor.
    assert not set(report["arguments"]) & set(OWN_NAMES) and not set(report["fields"]) & set(OWN_NAMES)
    assert [r.path for r in seen] == ["/v2/models/m/infer"]
    assert [t["name"] for t in seen[0].json()["inputs"]] == OWN_NAMES
    assert [t["data"] for t in seen[0].json()["inputs"]] == [[i] for i in range(len(OWN_NAMES))]
    assert report["values"] == [2 * i for i in range(len(OWN_NAMES))]


# --- bounds -----------------------------------------------------------------------------------------------------

def tensors(n: int, shape: list[int] | None = None, name: str = "t{}") -> list[dict[str, Any]]:
    return [{"name": name.format(i), "datatype": "FP32", "shape": [1] if shape is None else shape} for i in range(n)]


BEYOND = {
    "a_shape_longer_than_numpy_allows": (metadata(inputs=tensors(1, [1] * (MAX_DIMENSIONS + 1))),
                                         f"dimensions, more than {MAX_DIMENSIONS}"),
    "a_dimension_beyond_int64": (metadata(outputs=tensors(1, [2**63])), "beyond"),
    "a_dimension_of_a_huge_integer": ('{"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [' +
                                      "9" * 5000 + "]}], \"outputs\": []}", "not JSON"),
    "more_inputs_than_allowed": (metadata(inputs=tensors(MAX_TENSORS + 1)), f"inputs, more than {MAX_TENSORS}"),
    "more_outputs_than_allowed": (metadata(outputs=tensors(MAX_TENSORS + 1)), f"outputs, more than {MAX_TENSORS}"),
    "a_tensor_name_longer_than_allowed": (metadata(inputs=tensors(1, name="x" * (MAX_NAME + 1))),
                                          f"longer than {MAX_NAME} characters"),
    "a_platform_longer_than_allowed": (metadata(platform="p" * (MAX_NAME + 1)), f"longer than {MAX_NAME}"),
    "a_lone_surrogate_in_a_name": ('{"name": "m", "inputs": [{"name": "\\ud800", "datatype": "FP32", "shape": [1]}],'
                                   ' "outputs": []}', "not valid Unicode"),
}


@pytest.mark.parametrize("case", BEYOND)
def test_metadata_beyond_the_bounds_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    doc, phrase = BEYOND[case]
    out = tmp_path / "x.py"
    with serve_metadata(doc) as server:
        assert_refused(client(server, out), out, phrase)


def test_an_answer_larger_than_the_cap_is_refused_while_it_streams(tmp_path: Path) -> None:
    """No Content-Length, and an answer five times the cap: the command stops reading at the cap and hangs up."""
    total = 5 * MAX_ANSWER_BYTES
    shape = b"[" + b"1," * (total // 2) + b"1]"

    def answer(request: Request, connection: socket.socket) -> None:
        server.send(connection, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        server.send(connection, b'{"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": ' + shape)

    out = tmp_path / "x.py"
    with HostileServer(answer) as server:
        assert_refused(client(server, out), out, f"larger than {MAX_ANSWER_BYTES >> 20} MiB")
        assert server.finished.wait(30)
        assert server.sent < 2 * MAX_ANSWER_BYTES  # it hung up: the rest never left the server


def test_an_announced_length_beyond_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    def answer(request: Request, connection: socket.socket) -> None:
        server.send(connection, f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_ANSWER_BYTES + 1}\r\n\r\n".encode())
        server.send(connection, b"{" * MAX_ANSWER_BYTES)

    out = tmp_path / "x.py"
    with HostileServer(answer) as server:
        assert_refused(client(server, out), out, f"larger than {MAX_ANSWER_BYTES >> 20} MiB")
        assert server.finished.wait(30)
        assert server.sent < MAX_ANSWER_BYTES


# --- transport failures -----------------------------------------------------------------------------------------

def raw(data: bytes) -> Any:
    return lambda request, connection: connection.sendall(data)


def short_body(request: Request, connection: socket.socket) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"name": "m"')


FAILURES = {
    "deeply_nested_json": (raw(http_answer(b"[" * 200_000)), "nests too deeply"),
    "a_short_body": (short_body, "ended early"),
    "a_bad_status_line": (raw(b"HTTP/1.1 OK-ish\r\n\r\n{}"), "not HTTP"),
    "not_http_at_all": (raw(b"\x00\x01 hello\r\n"), "not HTTP"),
    "a_70_kB_header": (raw(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n{}"), "header"),
    "too_many_headers": (raw(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n{}"), "header"),
    "no_answer": (lambda request, connection: None, "closed the connection"),
    "not_json": (raw(http_answer(b"<html>hi</html>")), "not JSON"),
    "json_of_the_wrong_type": (raw(http_answer([1, 2])), "must be a JSON object"),
    "a_name_of_the_wrong_type": (raw(http_answer(metadata(inputs=[{"name": 5, "datatype": "FP32", "shape": []}]))),
                                 "name must be a non-empty string"),
    "a_shape_of_the_wrong_type": (raw(http_answer(metadata(inputs=[{"name": "x", "datatype": "FP32",
                                                                     "shape": [True]}]))), "shape must be"),
    "an_error_status_with_a_multiline_message": (
        raw(http_answer({"error": "no\nsuch\x1bmodel\u2028" + "x" * 5000}, status="404 Not Found")), "404"),
    "a_redirect": (raw(http_answer(b"", status="302 Found", headers={"Location": "file:///etc/passwd"})), "302"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_every_transport_failure_is_one_line_and_exit_1(case: str, tmp_path: Path) -> None:
    answer, phrase = FAILURES[case]
    out = tmp_path / "x.py"
    with HostileServer(answer) as server:
        message = assert_refused(client(server, out), out, phrase)
    assert len(message) < 1000


def test_connection_refused_and_tls_errors_are_one_line(tmp_path: Path) -> None:
    out = tmp_path / "x.py"
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    refused = oipgen_timed(60, "client", "--server", f"http://127.0.0.1:{port}", "--model", "m", "--out", str(out))
    assert_refused(refused, out, f"GET http://127.0.0.1:{port}/v2/models/m")
    # TLS to a server that speaks plain HTTP; and to one whose certificate nobody signed
    with socket.create_server(("127.0.0.1", 0)) as plain:
        def answer_at_once() -> None:  # what a plain HTTP server says to anything, a TLS hello included
            connection, _ = plain.accept()
            with connection:
                connection.sendall(http_answer({"error": "not found"}, status="404 Not Found"))

        greeter = threading.Thread(target=answer_at_once, daemon=True)
        greeter.start()
        tls_to_plain = oipgen_timed(60, "client", "--server", f"https://127.0.0.1:{plain.getsockname()[1]}",
                                    "--model", "m", "--out", str(out))
        greeter.join(10)
    assert_refused(tls_to_plain, out, "TLS failed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with HostileServer(lambda request, connection: connection.sendall(http_answer(metadata())), tls=context) as server:
        unsigned = oipgen_timed(60, "client", "--server", f"https://127.0.0.1:{server.port}", "--model", "m",
                                "--out", str(out))
    assert_refused(unsigned, out, "certificate")


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_server_that_drips_bytes_cannot_hold_the_command_past_its_deadline(where: str, tmp_path: Path) -> None:
    """One byte every 0.2 s, for half a minute or more: each read gets a byte in time, the whole fetch does not."""
    answer = http_answer(metadata())
    head_end = answer.index(b"\r\n\r\n") + 4
    start = 0 if where == "head" else head_end
    dripped_all = threading.Event()

    def drip(request: Request, connection: socket.socket) -> None:
        server.send(connection, answer[:start])
        for i in range(start, min(len(answer), start + 300)):
            if server.stopping.wait(0.2):
                return
            server.send(connection, answer[i:i + 1])
        dripped_all.set()

    out = tmp_path / "x.py"
    with HostileServer(drip) as server:
        result = client(server, out, "--timeout", "2", timeout=90)
        assert not dripped_all.is_set()  # the server was still dripping when the command gave up
    assert_refused(result, out, "no complete answer within 2 s")


def test_a_name_lookup_that_does_not_answer_cannot_hold_the_fetch_past_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver has no timeout of its own: a lookup that answers only after 20 s (a DNS server that drops
    queries) is cut at the deadline, like every other part of the fetch."""
    asked = threading.Event()

    def slow_lookup(*args: Any, **kwargs: Any) -> Any:
        asked.set()
        time.sleep(20)
        raise socket.gaierror(socket.EAI_AGAIN, "no answer")

    monkeypatch.setattr(socket, "getaddrinfo", slow_lookup)
    started = time.monotonic()
    lookup = r"GET http://models\.example:8000/v2/models/m: no complete answer within 1 s"
    with pytest.raises(ClientError, match=lookup):
        fetch_metadata("http://models.example:8000", "m", deadline=1)
    assert asked.is_set()
    assert time.monotonic() - started < 5


def test_refusals_are_one_printable_line_whatever_the_command_line_holds(tmp_path: Path) -> None:
    """Paths, addresses and names from the command line are escaped in a refusal like the server's text."""
    out = tmp_path / "x.py"
    for args in (["--metadata", str(tmp_path / "no\nsuch\u2028file.json")],
                 ["--server", "http://exa\x0bmple\u2028host:1", "--model", "m"],
                 ["--server", "http://127.0.0.1:1", "--model", "m\udcff"],
                 ["--server", "gopher://127.0.0.1:1\x1c", "--model", "m"]):
        message = assert_refused(oipgen_timed(60, "client", *args, "--out", str(out)), out)
        assert message[:-1].isprintable(), message
