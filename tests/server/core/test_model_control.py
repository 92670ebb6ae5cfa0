"""Operating the server as Triton's operators do, through `python -m oip serve` on real sockets: model control
(`--model-control-mode none|explicit|poll`, `--load-model`, `--repository-poll-secs`), readiness
(`--strict-readiness`, `--exit-on-error`), the repository index and the answers about a model that failed to
load, and listen failures.

With `--workers 2`, "every worker" is checked connection by connection: each new connection is answered by one
worker, which the `whoami` model names (its pid) before the check runs on the same connection, until both workers
passed over each transport.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import (
    TIMEOUT,
    Server,
    assert_error_body,
    build_repository,
    grpc_call,
    running,
    server_env,
    start_server,
)

WORKERS = 2
POLL = "0.3"  # --repository-poll-secs of the poll mode tests
WAIT = 60.0  # for a change on disk to reach every worker

# Answers `marker` (model.toml's [parameters]) plus CODE for every element, and its process's pid and version as
# response parameters; sleeps `delay` seconds first. Its load() sleeps `load_delay` seconds, then writes the moment
# it finished into the folder `marks` (when given) as loaded-<pid>-<marker>.
MARKED = '''
import os
import time
from pathlib import Path

import numpy as np

from oip.server.model import Model, TensorSpec

CODE = {code}


class Marked(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def load(self):
        time.sleep(float(self.settings.get("load_delay", 0)))
        if self.settings.get("marks"):
            mark = Path(self.settings["marks"]) / f"loaded-{{os.getpid()}}-{{self.settings['marker']}}"
            mark.write_text(repr(time.time()))

    def infer(self, inputs, parameters):
        time.sleep(float(self.settings.get("delay", 0)))
        value = int(self.settings["marker"]) + CODE
        return ({{"OUTPUT0": np.full(inputs["INPUT0"].shape, value, np.int32)}},
                {{"pid": os.getpid(), "version": self.version}})
'''

# Names the process that answers: how a test knows which worker a connection reached.
WHOAMI = '''
import os

import numpy as np

from oip.server.model import Model, TensorSpec


class WhoAmI(Model):
    inline = True
    inputs = [TensorSpec("INPUT0", "INT32", [1])]
    outputs = [TensorSpec("OUTPUT0", "INT64", [1])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": np.array([os.getpid()], np.int64)}
'''

# load() fails with a message of 100,000 characters.
VERBOSE = '''
from oip.server.model import Model, TensorSpec


class Verbose(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def load(self):
        raise RuntimeError("the weights are " + "very " * 20000 + "missing")
'''


def write_model(folder: Path, source: str, toml: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    (folder / "model.toml").write_text(toml)
    return folder


def marked_toml(marker: int, **parameters: Any) -> str:
    lines = [f"{key} = {json.dumps(value)}" for key, value in {"marker": marker, **parameters}.items()]
    return 'class = "model:Marked"\n[parameters]\n' + "\n".join(lines) + "\n"


def write_marked(folder: Path, marker: int, code: int = 0, **parameters: Any) -> Path:
    return write_model(folder, MARKED.format(code=code), marked_toml(marker, **parameters))


def write_whoami(root: Path) -> None:
    write_model(root / "whoami", WHOAMI, 'class = "model:WhoAmI"\n')


def serve_command(*options: str) -> list[str]:
    return [sys.executable, "-m", "oip", "serve", "--host", "127.0.0.1", *options]


def run_serve(*options: str, cwd: Path, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """`python -m oip serve ...` to its end: for the options that stop it (its exit status and output)."""
    return subprocess.run(serve_command(*options), cwd=cwd, env=server_env(), capture_output=True, text=True,
                          timeout=timeout)


# --- the answers of one connection ---------------------------------------------------------------------------


def infer_body() -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32", "data": [0, 0]}]}


def infer_request(model: str = "marked", version: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    request.raw_input_contents.append(np.zeros(2, "<i4").tobytes())
    return request


@dataclass(frozen=True)
class Answer:
    """What one inference request of `marked` got: the value and version it answered, or the error."""

    transport: str
    status: int | str  # HTTP status, or the gRPC code's name
    value: int | None = None
    version: str = ""
    pid: int | None = None
    error: str = ""
    start: float = 0.0  # time.time() when it was sent and answered
    end: float = 0.0


def rest_infer(http: httpx.Client, model: str = "marked") -> Answer:
    start = time.time()
    response = http.post(f"/v2/models/{model}/infer", json=infer_body())
    end = time.time()
    if response.status_code != 200:
        return Answer("rest", response.status_code, error=response.json().get("error", response.text), start=start,
                      end=end)
    body = response.json()
    values = set(body["outputs"][0]["data"])
    assert len(values) == 1, body
    return Answer("rest", 200, values.pop(), body["model_version"], int(body["parameters"]["pid"]), start=start,
                  end=end)


def grpc_infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str = "marked") -> Answer:
    start = time.time()
    code, reply = grpc_call(stub, "ModelInfer", infer_request(model))
    end = time.time()
    if code is not grpc.StatusCode.OK:
        return Answer("grpc", code.name, error=reply.details(), start=start, end=end)
    values = set(codec.from_raw(reply.raw_output_contents[0], "INT32", [2]).tolist())
    assert len(values) == 1, reply
    return Answer("grpc", "OK", values.pop(), reply.model_version, reply.parameters["pid"].int64_param, start=start,
                  end=end)


def rest_pid(http: httpx.Client) -> int:
    response = http.post("/v2/models/whoami/infer", json={"inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0]}]})
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def grpc_pid(stub: pb_grpc.GRPCInferenceServiceStub) -> int:
    request = pb.ModelInferRequest(model_name="whoami")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.zeros(1, "<i4").tobytes())
    reply = stub.ModelInfer(request, timeout=TIMEOUT)
    return int(codec.from_raw(reply.raw_output_contents[0], "INT64", [1])[0])


RestCheck = Callable[[httpx.Client], bool]
GrpcCheck = Callable[[pb_grpc.GRPCInferenceServiceStub], bool]


def on_every_worker(server: Server, rest: RestCheck, grpc_check: GrpcCheck, workers: int = WORKERS,
                    wait: float = WAIT) -> None:
    """Until `wait` runs out, check new connections (REST and gRPC) until on each transport `workers` distinct
    workers passed the check in a row since it last failed on any; otherwise fail with what the checks saw."""
    deadline = time.monotonic() + wait
    passed: dict[str, set[int]] = {"rest": set(), "grpc": set()}
    tries = 0
    while True:
        tries += 1
        with server.http_client() as http:
            pid = rest_pid(http)
            if rest(http):
                passed["rest"].add(pid)
            else:
                passed = {"rest": set(), "grpc": set()}
        with server.channel() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            pid = grpc_pid(stub)
            if grpc_check(stub):
                passed["grpc"].add(pid)
            else:
                passed = {"rest": set(), "grpc": set()}
        if all(len(pids) >= workers for pids in passed.values()):
            return
        assert time.monotonic() < deadline, f"not on every worker after {tries} connections: {passed}\n" + \
            server.log_tail(60)
        if not any(passed.values()):
            time.sleep(0.1)


def answers(value: int | None, version: str = "1", model: str = "marked") -> tuple[RestCheck, GrpcCheck]:
    """Checks that `model` answers `value` from `version` (None: that it answers 503 / UNAVAILABLE)."""
    def rest(http: httpx.Client) -> bool:
        got = rest_infer(http, model)
        return (got.status == 503) if value is None else (got.value, got.version) == (value, version)

    def grpc_check(stub: pb_grpc.GRPCInferenceServiceStub) -> bool:
        got = grpc_infer(stub, model)
        return (got.status == "UNAVAILABLE") if value is None else (got.value, got.version) == (value, version)

    return rest, grpc_check


def indexed(entries: set[tuple[str, str, str]]) -> tuple[RestCheck, GrpcCheck]:
    """Checks that the repository index (without the whoami model) is `entries`: (name, version, state)."""
    def rest(http: httpx.Client) -> bool:
        index = http.post("/v2/repository/index", json={}).json()
        return {(m["name"], m.get("version", ""), m["state"]) for m in index if m["name"] != "whoami"} == entries

    def grpc_check(stub: pb_grpc.GRPCInferenceServiceStub) -> bool:
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=TIMEOUT).models
        return {(m.name, m.version, m.state) for m in index if m.name != "whoami"} == entries

    return rest, grpc_check


def refused(mode: str) -> tuple[RestCheck, GrpcCheck]:
    """Checks that load and unload requests are refused (503 / UNAVAILABLE) naming the mode."""
    def rest(http: httpx.Client) -> bool:
        for action in ("load", "unload"):
            message = assert_error_body(http.post(f"/v2/repository/models/marked/{action}"), 503)
            assert f"--model-control-mode {mode}" in message, message
        return True

    def grpc_check(stub: pb_grpc.GRPCInferenceServiceStub) -> bool:
        for operation, request in (("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="marked")),
                                   ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="marked"))):
            code, error = grpc_call(stub, operation, request)
            assert code is grpc.StatusCode.UNAVAILABLE and f"--model-control-mode {mode}" in error.details()
        return True

    return rest, grpc_check


# --- model control ---------------------------------------------------------------------------------------------


def test_without_a_mode_every_model_loads_and_load_requests_are_served_which_help_names(tmp_path: Path) -> None:
    help_text = run_serve("--help", cwd=tmp_path).stdout
    assert "Without it: explicit with --load-model '*'" in " ".join(help_text.split())
    root = tmp_path / "models"
    write_marked(root / "marked", 1)
    write_marked(root / "other", 2)
    write_whoami(root)
    with running(root, tmp_path, ready=("marked", "other", "whoami")) as server, server.clients() as (http, stub):
        assert http.post("/v2/repository/models/other/unload").status_code == 200
        assert grpc_call(stub, "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="other"))[0] is \
            grpc.StatusCode.OK
        assert rest_infer(http, "other").value == 2 and grpc_infer(stub, "marked").value == 1
    assert "--model-control-mode explicit" in server.log_text()


def test_none_mode_loads_every_model_once_and_refuses_load_and_unload_on_every_worker(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_marked(root / "marked", 1)
    write_whoami(root)
    build_repository(root, ("broken",), only=())
    server = start_server(root, tmp_path / "run", "--model-control-mode", "none", "--workers", str(WORKERS),
                          ready=("marked", "whoami"))
    try:
        on_every_worker(server, *answers(1), wait=10)
        on_every_worker(server, *refused("none"), wait=10)
        # The repository changing is not followed: a new folder is listed (not loaded), an edit is not reloaded.
        write_marked(root / "later", 5)
        write_marked(root / "marked", 2)
        time.sleep(1.0)
        on_every_worker(server, *answers(1), wait=10)
        on_every_worker(server, *indexed({("marked", "1", "READY"), ("broken", "1", "UNAVAILABLE"),
                                          ("later", "", "UNAVAILABLE")}), wait=10)
        on_every_worker(server, *answers(None, model="later"), wait=10)  # listed, so known: 503, not loaded
        with server.clients() as (http, stub):
            later = next(m for m in http.post("/v2/repository/index", json={}).json() if m["name"] == "later")
            assert later["reason"] == "not loaded"
            assert http.get("/v2/health/ready").status_code == 503  # broken should be loaded, and is not
            assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
    finally:
        assert server.stop() == 0, server.log_text()


def test_explicit_mode_serves_what_is_named_then_what_is_loaded_on_every_worker(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_marked(root / "marked", 1)
    write_marked(root / "other", 2)
    write_whoami(root)
    server = start_server(root, tmp_path / "run", "--model-control-mode", "explicit", "--load-model", "marked",
                          "--load-model", "whoami", "--workers", str(WORKERS), ready=("marked", "whoami"))
    try:
        on_every_worker(server, *answers(1), wait=10)
        on_every_worker(server, *answers(None, model="other"), wait=10)
        on_every_worker(server, *indexed({("marked", "1", "READY"), ("other", "", "UNAVAILABLE")}), wait=10)
        with server.clients() as (http, stub):
            assert rest_infer(http, "other").error == "model 'other' has no ready version: not loaded"
            assert http.get("/v2/health/ready").status_code == 200  # what was not asked for does not count
            assert grpc_call(stub, "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="other"))[0] is \
                grpc.StatusCode.OK
        on_every_worker(server, *answers(2, model="other"), wait=10)
        with server.http_client() as http:
            assert http.post("/v2/repository/models/marked/unload").status_code == 200
        on_every_worker(server, *answers(None), wait=10)
        on_every_worker(server, *indexed({("marked", "1", "UNAVAILABLE"), ("other", "1", "READY")}), wait=10)
    finally:
        assert server.stop() == 0, server.log_text()


def test_explicit_mode_named_on_the_command_line_loads_nothing_else(tmp_path: Path) -> None:
    """As Triton: `--model-control-mode explicit` without `--load-model` loads no model at start."""
    root = tmp_path / "models"
    write_marked(root / "marked", 1)
    with running(root, tmp_path, "--model-control-mode", "explicit") as server, server.clients() as (http, stub):
        index = http.post("/v2/repository/index", json={}).json()
        assert index == [{"name": "marked", "state": "UNAVAILABLE", "reason": "not loaded"}]
        assert grpc_infer(stub).status == "UNAVAILABLE"
        assert http.post("/v2/repository/models/marked/load").status_code == 200
        assert grpc_infer(stub).value == 1


@pytest.mark.parametrize(("options", "words"), [
    (("--load-model", "*", "--load-model", "marked"), "give it alone"),
    (("--model-control-mode", "none", "--load-model", "marked"), "--load-model is for --model-control-mode explicit"),
    (("--model-control-mode", "poll", "--load-model", "marked"), "--load-model is for --model-control-mode explicit"),
    (("--model-control-mode", "poll", "--repository-poll-secs", "0"), "must be a positive number of seconds"),
    (("--load-model", ""), "--load-model takes model names"),
])
def test_model_control_options_that_do_not_go_together_exit_2_in_one_line(tmp_path: Path, options: tuple[str, ...],
                                                                          words: str) -> None:
    write_marked(tmp_path / "models" / "marked", 1)
    result = run_serve("--model-repository", str(tmp_path / "models"), *options, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_a_load_model_that_is_not_in_the_repository_is_logged_and_stops_the_server_with_exit_on_error(
        tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_marked(root / "marked", 1)
    with running(root, tmp_path / "a", "--load-model", "nosuch", "--load-model", "marked") as server, \
            server.http_client() as http:
        assert rest_infer(http).value == 1
    assert "--load-model nosuch: no such model in the model repository" in server.log_text()
    result = run_serve("--model-repository", str(root), "--http-port", "0", "--grpc-port", "0", "--load-model",
                       "nosuch", "--exit-on-error", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "--exit-on-error" in result.stderr and "--load-model nosuch" in result.stderr, result.stderr


# --- poll mode ------------------------------------------------------------------------------------------------


def test_poll_mode_follows_the_repository_on_every_worker(tmp_path: Path) -> None:
    """A changed model.toml, a changed python file and a new version folder reload the model; a new folder loads,
    a removed one unloads and leaves the index; an edit that does not load keeps the loaded model serving; load
    and unload requests are refused."""
    root = tmp_path / "models"
    folder = write_marked(root / "marked", 1)
    (folder / "1").mkdir()
    write_whoami(root)
    server = start_server(root, tmp_path / "run", "--model-control-mode", "poll", "--repository-poll-secs", POLL,
                          "--workers", str(WORKERS), ready=("marked", "whoami"))
    try:
        on_every_worker(server, *answers(1), wait=10)
        on_every_worker(server, *refused("poll"), wait=10)
        (folder / "model.toml").write_text(marked_toml(2))  # its model.toml
        on_every_worker(server, *answers(2))
        (folder / "model.py").write_text(textwrap.dedent(MARKED.format(code=100)))  # its python file
        on_every_worker(server, *answers(102))
        (folder / "2").mkdir()  # a new version folder: served as the highest version
        on_every_worker(server, *answers(102, version="2"))
        on_every_worker(server, *indexed({("marked", "1", "READY"), ("marked", "2", "READY")}))
        write_marked(root / "added", 7)  # a new model folder
        on_every_worker(server, *answers(7, model="added"))
        shutil.rmtree(root / "added")  # removed: unloaded, and gone from the index
        on_every_worker(server, *indexed({("marked", "1", "READY"), ("marked", "2", "READY")}))
        on_every_worker(server, lambda http: rest_infer(http, "added").status == 404,
                        lambda stub: grpc_infer(stub, "added").status == "NOT_FOUND")
        (folder / "model.py").write_text("raise RuntimeError('a half-written edit')\n")
        deadline = time.monotonic() + WAIT
        tried = "repository poll: model 'marked': failed to load"
        while server.log_text().count(tried) < WORKERS:  # each worker tried, once
            assert time.monotonic() < deadline, server.log_tail(60)
            time.sleep(0.1)
        on_every_worker(server, *answers(102, version="2"), wait=10)  # the loaded model still serves
        with server.http_client() as http:
            assert http.get("/v2/health/ready").status_code == 200
    finally:
        assert server.stop() == 0, server.log_text()


def load_while_changed(server: Server, change: Callable[[], None], seconds: float = 1.0,
                       clients: int = 4) -> list[Answer]:
    """`clients` REST and `clients` gRPC callers of `marked`, each on a new connection per request, for `seconds`
    before `change()` and until both workers have answered the new marker (2) for `seconds` more."""
    results: list[Answer] = []
    lock = threading.Lock()
    stop = threading.Event()

    def rest_caller() -> None:
        while not stop.is_set():
            with server.http_client() as http:
                try:
                    got = rest_infer(http)
                except httpx.HTTPError as exc:
                    got = Answer("rest", "transport", error=repr(exc))
            with lock:
                results.append(got)

    def grpc_caller() -> None:
        while not stop.is_set():
            with server.channel() as channel:
                got = grpc_infer(pb_grpc.GRPCInferenceServiceStub(channel))
            with lock:
                results.append(got)

    threads = [threading.Thread(target=rest_caller) for _ in range(clients)]
    threads += [threading.Thread(target=grpc_caller) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(seconds)
        change()
        deadline = time.monotonic() + WAIT
        while True:
            with lock:
                new = {a.pid for a in results if a.value == 2}
            if len(new) >= WORKERS:
                break
            assert time.monotonic() < deadline, server.log_tail(60)
            time.sleep(0.05)
        time.sleep(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=TIMEOUT)
    return results


def test_poll_mode_reloads_a_changed_model_under_load_without_failing_a_request(tmp_path: Path) -> None:
    """Requests in flight over both transports while model.toml changes on disk: each is answered by the old
    instance (1) or the new one (2), none fails; requests that started before the new instance took over and ended
    after it did were answered by the old one (it finished them), and once a worker answered with the new one no
    request sent later than that is answered by the old one."""
    root = tmp_path / "models"
    marks = tmp_path / "marks"
    marks.mkdir()
    folder = write_marked(root / "marked", 1, delay=0.2, marks=str(marks))
    server = start_server(root, tmp_path / "run", "--model-control-mode", "poll", "--repository-poll-secs", POLL,
                          "--workers", str(WORKERS), "--model-threads", "16", ready=("marked",))
    try:
        def change() -> None:  # the new instance takes a second to load: the old one serves meanwhile
            # Replaced whole, as a deployment does: a poll never reads the file half written (and loads twice).
            staged = tmp_path / "model.toml"
            staged.write_text(marked_toml(2, delay=0.2, marks=str(marks), load_delay=1.0))
            os.replace(staged, folder / "model.toml")

        # Eight callers per transport: each request opens its own connection, which the kernel hands to either
        # worker at random, so with fewer a worker can be without a request in flight at the moment it swaps.
        results = load_while_changed(server, change, clients=8)
    finally:
        assert server.stop() == 0, server.log_text()
    failed = [a for a in results if a.value not in (1, 2)]
    counts = {transport: {"old": sum(1 for a in results if a.transport == transport and a.value == 1),
                          "new": sum(1 for a in results if a.transport == transport and a.value == 2),
                          "failed": sum(1 for a in failed if a.transport == transport)}
              for transport in ("rest", "grpc")}
    print(f"\npoll reload under load ({WORKERS} workers): {counts}")
    assert not failed, failed[:5]
    assert all(c["old"] > 0 and c["new"] > 0 for c in counts.values()), counts
    for pid in {a.pid for a in results}:
        took_over = float((marks / f"loaded-{pid}-2").read_text())  # the new instance loaded: it swaps in now
        mine = [a for a in results if a.pid == pid]
        around = sorted((round(a.start - took_over, 3), round(a.end - took_over, 3), a.transport, a.value)
                        for a in mine if abs(a.start - took_over) < 1 or abs(a.end - took_over) < 1)
        assert any(a.value == 1 and a.start < took_over < a.end for a in mine), (
            f"none in flight on {pid} when it swapped; its requests around then (start, end, transport, value): "
            f"{around}; {server.log_tail(40)}")
        first_new = min(a.end for a in mine if a.value == 2)
        late = [a for a in mine if a.value == 1 and a.start > first_new]
        assert not late, late[:3]


# --- readiness -------------------------------------------------------------------------------------------------


def failing_repository(root: Path) -> Path:
    """`marked` (ready), `broken` (its load fails: weights not found), `verbose` (its load fails at length),
    `spare` (unloaded by the test)."""
    write_marked(root / "marked", 1)
    write_marked(root / "spare", 3)
    write_model(root / "verbose", VERBOSE, 'class = "model:Verbose"\n')
    return build_repository(root, ("broken",), only=())


def check_ready_agrees_with_index(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, strict: bool) -> None:
    """Each model's ready answer over both transports is what its index entry says: READY is ready, a failed
    load is 503 / UNAVAILABLE naming the model and the reason, anything else is not ready; the server's readiness
    is every model asked to load being ready (or, not strict, being live)."""
    index = http.post("/v2/repository/index", json={}).json()
    assert {m["name"] for m in index} == {"marked", "spare", "verbose", "broken"}
    for entry in index:
        name, version = entry["name"], entry.get("version", "")
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
        request = pb.ModelReadyRequest(name=name, version=version)
        response = http.get(path)
        code, reply = grpc_call(stub, "ModelReady", request)
        if entry["state"] == "READY":
            assert response.status_code == 200 and response.json()["ready"] is True
            assert code is grpc.StatusCode.OK and reply.ready
        elif entry["reason"] == "unloaded":
            assert (response.status_code, response.json()["ready"]) == (503, False)
            assert code is grpc.StatusCode.OK and not reply.ready
        else:
            message = assert_error_body(response, 503)
            assert code is grpc.StatusCode.UNAVAILABLE and reply.details() == message
            assert f"model '{name}'" in message and entry["reason"][:100] in message, (message, entry)
    failed = any(m["state"] != "READY" and m.get("reason") != "unloaded" for m in index)
    expected = not (strict and failed)
    assert (http.get("/v2/health/ready").status_code == 200) is expected
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready is expected


@pytest.mark.parametrize("strict", [True, False])
def test_ready_answers_agree_with_the_index_and_strict_readiness_decides_the_server(tmp_path: Path,
                                                                                    strict: bool) -> None:
    root = failing_repository(tmp_path / "models")
    options = () if strict else ("--strict-readiness=false",)
    with running(root, tmp_path, *options, ready=("marked", "spare")) as server, server.clients() as (http, stub):
        check_ready_agrees_with_index(http, stub, strict)
        assert http.post("/v2/repository/models/spare/unload").status_code == 200
        check_ready_agrees_with_index(http, stub, strict)
        for name in ("broken", "verbose"):  # unloaded, a failed model asks for nothing any more
            assert http.post(f"/v2/repository/models/{name}/unload").status_code == 200
        check_ready_agrees_with_index(http, stub, strict)
        assert http.get("/v2/health/ready").status_code == 200


def test_a_failed_load_is_answered_with_the_model_and_its_reason_bounded(tmp_path: Path) -> None:
    """Inference, metadata and ready requests name the model and the load error's reason (REST 503, gRPC
    UNAVAILABLE), and a reason of 100,000 characters is cut: in the index and in every answer."""
    root = failing_repository(tmp_path / "models")
    with running(root, tmp_path, ready=("marked",)) as server, server.clients() as (http, stub):
        reason = next(m["reason"] for m in http.post("/v2/repository/index", json={}).json() if m["name"] == "verbose")
        assert reason.startswith("the weights are very ") and len(reason) < 600, len(reason)
        rest = [http.post("/v2/models/verbose/infer", json=infer_body()), http.get("/v2/models/verbose"),
                http.get("/v2/models/verbose/ready"), http.get("/v2/models/verbose/versions/1/ready")]
        grpc_answers = [grpc_call(stub, "ModelInfer", infer_request("verbose")),
                        grpc_call(stub, "ModelMetadata", pb.ModelMetadataRequest(name="verbose")),
                        grpc_call(stub, "ModelReady", pb.ModelReadyRequest(name="verbose"))]
        for message in [assert_error_body(response, 503) for response in rest] + \
                [error.details() for code, error in grpc_answers if code is grpc.StatusCode.UNAVAILABLE]:
            assert message.startswith("model 'verbose' ") and "failed to load: the weights are very" in message
            assert len(message) <= 1100, len(message)
        assert all(code is grpc.StatusCode.UNAVAILABLE for code, _ in grpc_answers)
        broken = assert_error_body(http.post("/v2/models/broken/infer", json=infer_body()), 503)
        assert broken == "model 'broken' has no ready version: version 1: failed to load: weights not found"


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_exit_on_error_stops_the_server_at_start_when_a_model_fails(tmp_path: Path, workers: int) -> None:
    root = build_repository(tmp_path / "models", ("broken",), only=("simple",))
    result = run_serve("--model-repository", str(root), "--http-port", "0", "--grpc-port", "0", "--exit-on-error",
                       "--workers", str(workers), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "stopping (--exit-on-error): 1 model(s) failed to load: model 'broken'" in result.stderr
    assert "weights not found" in result.stderr and "Traceback" not in result.stderr


def test_starting_without_a_repository_says_how_to_give_one(tmp_path: Path) -> None:
    for workers in ("1", str(WORKERS)):  # one line, before any worker starts
        result = run_serve("--http-port", "0", "--grpc-port", "0", "--workers", workers, cwd=tmp_path)
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert "no models to serve" in line and "--model-repository DIR" in line and "ModelRepository.add" in line
    script = textwrap.dedent("""
        import asyncio
        from oip.server import Settings
        from oip.server.process.serve import serve
        try:
            asyncio.run(serve(Settings(http_port=0, grpc_port=None)))
        except ValueError as exc:
            print(exc)
    """)
    python = subprocess.run([sys.executable, "-c", script], env=server_env(), capture_output=True, text=True,
                            timeout=60)
    assert "no models to serve" in python.stdout, python.stderr


# --- listen failures -------------------------------------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another socket listens on (without SO_REUSEPORT: nothing can share it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield int(sock.getsockname()[1])
    sock.close()


@pytest.mark.parametrize("workers", [1, WORKERS])
@pytest.mark.parametrize(("what", "flag"), [("REST", "--http-port"), ("gRPC", "--grpc-port"),
                                            ("metrics", "--metrics-port")])
def test_a_port_in_use_is_named_with_its_host(tmp_path: Path, taken_port: int, what: str, flag: str,
                                              workers: int) -> None:
    ports = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", flag: str(taken_port)}
    root = build_repository(tmp_path / "models", only=())
    result = run_serve("--model-repository", str(root), *(x for item in ports.items() for x in item),
                       "--workers", str(workers), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen for {what} on 127.0.0.1:{taken_port}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("first", "second"), [("--http-port", "--grpc-port"), ("--grpc-port", "--metrics-port"),
                                               ("--http-port", "--metrics-port")])
def test_two_listeners_on_one_port_are_refused_before_the_models_load(tmp_path: Path, first: str,
                                                                      second: str) -> None:
    ports = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", first: "18999", second: "18999"}
    root = build_repository(tmp_path / "models", only=("simple",))
    result = run_serve("--model-repository", str(root), *(x for item in ports.items() for x in item), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{first} and {second} are both 18999: each listener needs a port of its own" in result.stderr
    assert "is ready" not in result.stderr and "Traceback" not in result.stderr
