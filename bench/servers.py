"""The servers under test, started the same way: single process, pinned to CPU 0, loopback, free ports.

- oipgen: `python -m oip serve` over examples/models (the generated package in generated/, the project's .venv).
- mlserver: MLServer 1.7.1 over bench/servers/mlserver_repo, `parallel_workers=0` (inference in the server
  process; its default, 1, halves its throughput and needs a second process).
- kserve: KServe 0.21.0, bench/servers/kserve_server.py, its defaults otherwise.
The peers come from bench/setup.sh's virtual environments. Each server runs in its own session (process group),
so that stopping it stops exactly the processes it started; `stop` sends SIGTERM to that group, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen import rss_kib

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
MODELS = ("simple", "identity_fp32")
SERVERS = ("oipgen", "mlserver", "kserve")
LABELS = {"oipgen": "oipgen", "mlserver": "MLServer 1.7.1", "kserve": "KServe 0.21.0"}
OIPGEN_MODELS = ROOT / "examples" / "models"  # what our server serves
SERVER_CPU = "0"
CLIENT_CPU = "1"


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    startup_s: float = 0.0
    ready_rss_mib: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def rest(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing(name: str, cache: Path) -> str | None:
    """Why server `name` cannot run here (None: it can)."""
    if name == "oipgen":
        return (
            None if (ROOT / "generated" / "oip" / "server").is_dir() else "generated/oip/server is missing (make build)"
        )
    venv = cache / f"venv-{name}"
    return None if (venv / ".installed").exists() else f"{venv} is not set up (bash bench/setup.sh)"


def command(name: str, cache: Path, http_port: int, grpc_port: int) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    if name == "oipgen":
        env["PYTHONPATH"] = str(ROOT / "generated")
        argv = [
            sys.executable,
            "-m",
            "oip",
            "serve",
            "--model-repository",
            str(OIPGEN_MODELS),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--log-level",
            "warning",
        ]
    elif name == "mlserver":
        env.update(
            MLSERVER_HTTP_PORT=str(http_port),
            MLSERVER_GRPC_PORT=str(grpc_port),
            MLSERVER_METRICS_PORT=str(free_port()),
            MLSERVER_PARALLEL_WORKERS="0",
            MLSERVER_HOST="127.0.0.1",
        )
        argv = [str(cache / "venv-mlserver" / "bin" / "mlserver"), "start", str(BENCH / "servers" / "mlserver_repo")]
    elif name == "kserve":
        argv = [
            str(cache / "venv-kserve" / "bin" / "python"),
            str(BENCH / "servers" / "kserve_server.py"),
            "--http_port",
            str(http_port),
            "--grpc_port",
            str(grpc_port),
        ]
    else:
        raise ValueError(f"unknown server {name!r}")
    return ["taskset", "-c", SERVER_CPU, *argv], env


def _get(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        connection.close()


def _grpc_ready(target: str, deadline: float) -> bool:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=pb.ServerReadyRequest.SerializeToString,
            response_deserializer=pb.ServerReadyResponse.FromString,
        )
        while time.monotonic() < deadline:
            try:
                if call(pb.ServerReadyRequest(), timeout=2).ready:
                    return True
            except grpc.RpcError:
                time.sleep(0.05)
    return False


def start(name: str, cache: Path, workdir: Path, timeout: float = 90.0) -> Running:
    """Start server `name` and wait (bounded) until REST says it and both models are ready, then until gRPC
    answers. `startup_s`: from the process start until the REST answers (polled every 20 ms)."""
    workdir.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    argv, env = command(name, cache, http_port, grpc_port)
    log = workdir / f"{name}.log"
    with log.open("ab") as sink:
        begin = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    server = Running(name, process, http_port, grpc_port, log)
    deadline = begin + timeout
    try:
        waiting = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in MODELS)]
        while waiting:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode} while starting; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready within {timeout:.0f} s; see {log}")
            if _get(http_port, waiting[0]) == 200:
                waiting.pop(0)
                continue
            time.sleep(0.02)
        server.startup_s = time.monotonic() - begin
        server.ready_rss_mib = rss_kib(process.pid) / 1024
        if not _grpc_ready(server.grpc, deadline):
            raise RuntimeError(f"{name}: gRPC was not ready within {timeout:.0f} s; see {log}")
    except BaseException:
        stop(server)
        raise
    return server


def stop(server: Running, grace: float = 15.0) -> None:
    """SIGTERM to the server's own process group (only what it started), then SIGKILL after `grace` seconds."""
    process = server.process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):  # children left behind, or a server that ignored SIGTERM
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


@contextlib.contextmanager
def running(name: str, cache: Path, workdir: Path) -> Iterator[Running]:
    server = start(name, cache, workdir)
    try:
        yield server
    finally:
        stop(server)


def run_loadgen(
    running: Running,
    workload: str,
    *,
    concurrency: int,
    duration: float,
    warmup: float,
    elements: int,
    request_timeout: float,
    extra: tuple[str, ...] = (),
    limit: float | None = None,
) -> dict[str, Any]:
    """One measurement by bench/loadgen.py in its own process, pinned to the client CPU; its JSON result, or
    {"error": ...}."""
    argv = [
        "taskset", "-c", CLIENT_CPU, sys.executable, str(BENCH / "loadgen.py"),
        "--rest", running.rest, "--grpc", running.grpc, "--workload", workload,
        "-c", str(concurrency), "-d", str(duration), "-w", str(warmup), "--elements", str(elements),
        "--server-pid", str(running.pid), "--timeout", str(request_timeout), *extra,
    ]
    limit = limit if limit is not None else duration + warmup + request_timeout * 2 + 60
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the load generator did not finish within {limit:.0f} s"}
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": f"load generator exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
