"""The harness for every test that runs the generated server over real sockets (tests/server/, tests/client/,
tests/interop/, tests/deploy/, the bench's and the model client's tests).

- `build_repository` writes a model repository: the models of spec/examples/models.yaml (one small generic model
  per entry, or only those named), plus, on request, EXTRA_MODELS (slow, broken, failing, byte_count,
  rendezvous).
- `start_server` runs `python -m oip serve` in a subprocess on 127.0.0.1 and ephemeral ports (--ports-file), and
  waits, bounded, until both transports listen and, optionally, until named models are ready. `running` does the
  same for the length of a `with` block; then it stops the server with SIGTERM, which must exit 0.
- `Server` is the process, its ports and its log: `url` (REST), `target` (gRPC), clients for both, `stop()`.
- What a test of a running server checks again and again: error bodies, gRPC calls and their status, and a
  correct inference over both transports after anything (`check_simple`).
- `scrape` reads a server's /metrics with Prometheus' own parser; `value` reads one sample of it, `count_before`
  one counter before a request, `resident_bytes` a process's RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import yaml
from conftest import GENERATED, SPEC
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

EXAMPLES = SPEC / "examples"
MODELS_YAML = EXAMPLES / "models.yaml"
START_TIMEOUT = 60.0  # from the start until the ports are written and the models waited for are ready
STOP_TIMEOUT = 30.0  # from SIGTERM until the exit
TIMEOUT = 30.0  # one request

SIMPLE_A = list(range(16))
SIMPLE_B = [1] * 16

# --- the model repository ---------------------------------------------------------------------------------------

# One model per entry of models.yaml: the entry's platform and tensors, and the behaviour it names (identity or
# add_sub), whatever the tensors are.
EXAMPLE_MODEL = '''\
"""Example model {name!r} of spec/examples/models.yaml: behaviour {behaviour!r}."""

import numpy as np

from oip.server.model import Model, TensorSpec


class Example(Model):
    platform = {platform!r}
    inputs = [TensorSpec.of(t) for t in {inputs!r}]
    outputs = [TensorSpec.of(t) for t in {outputs!r}]
    behaviour = {behaviour!r}

    def infer(self, inputs, parameters):
        arrays = [inputs[t.name] for t in self.inputs]
        names = [t.name for t in self.outputs]
        if self.behaviour == "words":  # decoupled: a generator, one response per word
            return ({{names[0]: np.array([word], dtype=object)}} for word in bytes(arrays[0][0]).split())
        if self.behaviour == "add_sub":
            with np.errstate(over="ignore"):
                return {{names[0]: arrays[0] + arrays[1], names[1]: arrays[0] - arrays[1]}}
        # identity: output k is input k, unchanged
        return dict(zip(names, arrays))
'''
BEHAVIOURS = ("identity", "add_sub", "words")

# Models beyond models.yaml, for the tests the golden cases cannot express.
EXTRA_MODELS = {
    # Sleeps `delay` seconds (a request parameter) in a worker thread; first writes a `started-*` file into its
    # folder, one per request.
    "slow": '''
import time
import uuid
from pathlib import Path

from oip.server.model import Model, TensorSpec


class Slow(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        (Path(self.path) / f"started-{uuid.uuid4().hex}").write_text("1")
        time.sleep(float(parameters.get("delay", 0)))
        return {"OUTPUT0": inputs["INPUT0"]}
''',
    # Its load() fails: the model stays UNAVAILABLE and the server keeps serving the others.
    "broken": '''
from oip.server.model import Model, TensorSpec


class Broken(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def load(self):
        raise RuntimeError("weights not found")
''',
    # Raises inside infer(): a model failure (500 / INTERNAL), never a traceback on the wire.
    "failing": '''
from oip.server.model import Model, TensorSpec


class Failing(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        raise ValueError("the model cannot do this")
''',
    # One BYTES element in, its length out: the shape a raw binary request (no JSON header) can carry.
    "byte_count": '''
import numpy as np

from oip.server.model import Model, TensorSpec


class ByteCount(Model):
    inputs = [TensorSpec("INPUT0", "BYTES", [1])]
    outputs = [TensorSpec("OUTPUT0", "INT64", [1])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": np.array([len(inputs["INPUT0"][0])], dtype=np.int64)}
''',
    # Plain infer() in the worker threads: returns only once `parties` requests of the same `group` (request
    # parameters) are inside infer() at the same time, so a success proves they ran concurrently; a request that
    # waits 30 s in vain fails. Answers its input and the parameters it saw (as response parameters).
    "rendezvous": '''
import threading

from oip.server.model import Model, TensorSpec

_lock = threading.Lock()
_barriers = {}


class Rendezvous(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        parties = int(parameters.get("parties", 1))
        with _lock:
            barrier = _barriers.setdefault(str(parameters.get("group", "")), threading.Barrier(parties, timeout=30))
        barrier.wait()
        return {"OUTPUT0": inputs["INPUT0"]}, dict(parameters)
''',
}
EXTRA_CLASSES = {"slow": "Slow", "broken": "Broken", "failing": "Failing", "byte_count": "ByteCount",
                 "rendezvous": "Rendezvous"}


def example_models() -> list[dict[str, Any]]:
    """The entries of spec/examples/models.yaml."""
    models: list[dict[str, Any]] = yaml.safe_load(MODELS_YAML.read_text())["models"]
    return models


def build_repository(root: Path, extra: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> Path:
    """A model repository holding the models of models.yaml (or those named in `only`) and the `extra` ones of
    EXTRA_MODELS: one folder per model, model.toml + model.py."""
    root.mkdir(parents=True, exist_ok=True)
    for model in example_models():
        if only is not None and model["name"] not in only:
            continue
        assert model["behaviour"] in BEHAVIOURS, model
        folder = root / model["name"]
        folder.mkdir()
        versions = ", ".join(json.dumps(v) for v in model["versions"])
        decoupled = "decoupled = true\n" if model.get("decoupled") else ""
        (folder / "model.toml").write_text(f'class = "model:Example"\nversions = [{versions}]\n{decoupled}')
        (folder / "model.py").write_text(EXAMPLE_MODEL.format(**model))
    for name in extra:
        folder = root / name
        folder.mkdir()
        (folder / "model.toml").write_text(f'class = "model:{EXTRA_CLASSES[name]}"\n')
        (folder / "model.py").write_text(textwrap.dedent(EXTRA_MODELS[name]))
    return root


# Doubles its INT32 input, inline (answered where the request is) and under dynamic batching.
DOUBLED = """
import numpy as np

from oip.server.model import Model, TensorSpec


class Doubled(Model):
    inputs = [TensorSpec("IN", "INT32", [1])]
    outputs = [TensorSpec("OUT", "INT32", [1])]
    inline = True

    def infer(self, inputs, parameters):
        return {"OUT": inputs["IN"] * 2}
"""


def write_doubled(root: Path, max_batch_size: int, delay_us: int) -> Path:
    """The model folder `root`/doubled: DOUBLED, batches of up to `max_batch_size` rows formed within `delay_us`."""
    folder = root / "doubled"
    folder.mkdir(parents=True)
    (folder / "model.toml").write_text(f'class = "model:Doubled"\nmax_batch_size = {max_batch_size}\n'
                                       f"[dynamic_batching]\nmax_queue_delay_microseconds = {delay_us}\n")
    (folder / "model.py").write_text(DOUBLED)
    return folder


# --- the server process -----------------------------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    repository: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def http_client(self, timeout: float = TIMEOUT) -> httpx.Client:
        """A REST client of this server (never through a proxy)."""
        return httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)

    def channel(self) -> grpc.Channel:
        """A gRPC channel with a connection of its own: grpcio otherwise shares one connection among the channels
        of a process open to the same target, so that with --workers every channel would reach the same worker."""
        return grpc.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)])

    @contextlib.contextmanager
    def clients(self) -> Iterator[tuple[httpx.Client, pb_grpc.GRPCInferenceServiceStub]]:
        """A REST client and a gRPC stub of this server, both closed on the way out."""
        with self.http_client() as http, self.channel() as channel:
            yield http, pb_grpc.GRPCInferenceServiceStub(channel)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_TIMEOUT)

    def stop(self) -> int:
        """SIGTERM, then wait (bounded); kill if it hangs. The exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("the server did not stop on SIGTERM\n" + self.log_text()) from None
        return self.process.returncode


# The python the servers run on: this one, or another venv's (its dependencies: the server at its declared floors,
# tests/package/test_dist.py); the package comes from PYTHONPATH either way.
SERVER_PYTHON = os.environ.get("OIP_SERVER_PYTHON", sys.executable)


def server_env(package_dir: Path = GENERATED) -> dict[str, str]:
    """This environment with `package_dir` (where `oip` is) first on PYTHONPATH: for `python -m oip ...`."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(package_dir) + (os.pathsep + path if path else "")}


def start_server(repository: Path, workdir: Path, *options: str, package_dir: Path = GENERATED,
                 ready: Iterable[str] = (), python: Path | str = SERVER_PYTHON,
                 env: dict[str, str] | None = None) -> Server:
    """`python -m oip serve` over `repository` with `options` (and the environment variables `env`), on 127.0.0.1
    and ephemeral ports, in `workdir` (which gets the ports file and the log, server.log). Waits, within
    START_TIMEOUT in all, until both transports listen and every model named in `ready` is ready; otherwise kills
    the server and fails with its log."""
    workdir.mkdir(parents=True, exist_ok=True)
    ports_file = workdir / "ports.json"
    ports_file.unlink(missing_ok=True)
    log = workdir / "server.log"
    argv = [str(python), "-m", "oip", "serve", "--model-repository", str(repository), "--host", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--ports-file", str(ports_file), *options]
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, cwd=workdir,
                                   env={**server_env(package_dir), "PYTHONUNBUFFERED": "1", **(env or {})})
    server = Server(process, 0, 0, log, repository)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        server.http_port, server.grpc_port = _wait_for_ports(server, ports_file, deadline)
        _wait_until_ready(server, list(ready), deadline)
    except BaseException:
        server.kill()
        raise
    return server


def _wait_for_ports(server: Server, ports_file: Path, deadline: float) -> tuple[int, int]:
    while True:
        try:
            ports = json.loads(ports_file.read_text())
            return int(ports["http"]), int(ports["grpc"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if server.process.poll() is not None:
            raise AssertionError(f"the server exited with {server.process.returncode}\n{server.log_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not write {ports_file} within {START_TIMEOUT}s\n{server.log_text()}")
        time.sleep(0.05)


def _wait_until_ready(server: Server, waiting: list[str], deadline: float) -> None:
    with server.http_client(timeout=5.0) as client:
        while waiting:
            if server.process.poll() is not None:
                raise AssertionError(f"the server exited with {server.process.returncode}\n{server.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"models not ready within {START_TIMEOUT}s: {waiting}\n{server.log_tail()}")
            try:
                if client.get(f"/v2/models/{waiting[0]}/ready").status_code == 200:
                    waiting.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.05)


@contextlib.contextmanager
def running(repository: Path, workdir: Path, *options: str, package_dir: Path = GENERATED,
            ready: Iterable[str] = (), python: Path | str = SERVER_PYTHON) -> Iterator[Server]:
    """`start_server(...)` for the length of the block; then `stop()`, and the server must have exited with 0."""
    server = start_server(repository, workdir, *options, package_dir=package_dir, ready=ready, python=python)
    try:
        yield server
    finally:
        status = server.stop()
    assert status == 0, f"the server exited with {status}\n{server.log_text()}"


# --- what the tests of a running server check ----------------------------------------------------------------------


def assert_error_body(response: httpx.Response, status: int) -> str:
    """The answer is `status` with exactly `{"error": "<message>"}` (JSON); the message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and list(body) == ["error"] and isinstance(body["error"], str), body
    assert body["error"] and "Traceback" not in body["error"], body
    return str(body["error"])


def grpc_call(stub: pb_grpc.GRPCInferenceServiceStub, operation: str, request: Any) -> tuple[grpc.StatusCode, Any]:
    """The status code and the reply (or the error) of one unary call."""
    try:
        return grpc.StatusCode.OK, getattr(stub, operation)(request, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), exc


def simple_body(**extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": SIMPLE_A},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": SIMPLE_B}], **extra}


def simple_grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.array(values, dtype="<i4").tobytes())
    return request


def check_simple(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """The server is live and answers a correct inference over both transports."""
    assert http.get("/v2/health/live").json() == {"live": True}
    response = http.post("/v2/models/simple/infer", json=simple_body(id="check"))
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert outputs[0]["data"] == [a + b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]
    assert outputs[1]["data"] == [a - b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]
    reply = stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT)
    assert codec.from_raw(reply.raw_output_contents[0], "INT32", [16]).tolist() == outputs[0]["data"]
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live


class Recording(httpx.HTTPTransport):
    """An HTTP transport that records what it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return super().handle_request(request)


# --- metrics ----------------------------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics, parsed by Prometheus' reference parser: sample name -> labels -> value. The parser names a
    counter's samples `<name>_total`; Triton's counters are exposed without the suffix, which is checked here and
    undone, so that tests look samples up by the names a dashboard queries."""
    response = httpx.get(f"{url}/metrics", timeout=TIMEOUT, trust_env=False)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and name.startswith("nv_") and name.endswith("_total"):
                name = name.removesuffix("_total")
                assert f"\n{name}{{" in response.text and f"# TYPE {name} counter" in response.text, name
            out.setdefault(name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels; a sample that is not there fails (it never reads as 0)."""
    key = tuple(sorted(labels.items()))
    assert key in samples.get(name, {}), f"no sample {name}{dict(key)}; served: {sorted(samples.get(name, {}))}"
    return float(samples[name][key])


def count_before(samples: dict[str, Any], name: str, **labels: str) -> float:
    """A labelled counter read before the requests a test counts: its child for these labels appears with its
    first count (prometheus_client), so before that it is absent, which is 0 here (and only here)."""
    return float(samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0))


def requests_answered(before: dict[str, Any], after: dict[str, Any], **labels: str) -> float:
    """The requests `oip_requests_total` counted with these labels between two scrapes (it must have one after)."""
    return value(after, "oip_requests_total", **labels) - count_before(before, "oip_requests_total", **labels)


def resident_bytes(pid: int) -> int:
    """A process's resident memory, as the kernel reports it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024
