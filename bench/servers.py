"""The servers under test, started the same way: single process, pinned to CPU 0, loopback, free ports.

- oipgen: `python -m oip serve` over bench/servers/oipgen_repo (the generated package in generated/, the project's
  .venv): `simple` and `identity_fp32` of examples/models (linked), and the benchmark's own models.
- triton: the `tritonserver` 2.51 binary and Python backend from the nvidia-pytriton wheel (no container, no GPU)
  over bench/servers/triton_repo; its Python-backend stubs are child processes, pinned with it.
- mlserver: MLServer 1.7.1 over bench/servers/mlserver_repo, `parallel_workers=0` (inference in the server
  process; its default, 1, halves its throughput and needs a second process).
- kserve: KServe 0.21.0, bench/servers/kserve_server.py, its defaults otherwise.
Every model is the same computation on each server that serves it (MODELS; MLServer and KServe serve SERVED's).
The peers come from bench/setup.sh's cache folder. Each server runs in its own session (process group), so that
stopping it stops exactly the processes it started; `stop` sends SIGTERM to that group, then SIGKILL.

Logging, the same policy for every server (LOGGING): start-up, warnings and errors are logged; nothing is
logged per request (no access log, no per-request latency line). That is Triton's and oipgen's default; MLServer
gets it from `debug: false` (settings.json) and KServe from `--enable_latency_logging false` and
servers/kserve_logging.json (no access log; its `kserve` logger at WARNING, since it logs every gRPC call at INFO).
bench/run.py measures the bytes each server logs per request to hold this.

Memory at rest (`idle`): once a server is ready, before any inference, the harness waits IDLE_SETTLE_S and reads
the resident (RSS) and proportional (PSS: shared pages split between the processes that map them) memory of its
whole process tree. PSS is the figure compared across servers: Triton's stubs share libraries with each other.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen import _tree, cpu_seconds, rss_kib

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
MODELS = ("simple", "identity_fp32", "text", "batched", "decoupled", "text_generate", "text_tokens")
# The models each server serves, where not every one of MODELS: MLServer and KServe serve no dynamic batching,
# decoupled model or generate extension in Triton's sense.
SERVED = {"mlserver": ("simple", "identity_fp32", "text"), "kserve": ("simple", "identity_fp32", "text")}
# The model each workload of bench/loadgen.py asks for.
WORKLOAD_MODEL = {
    "simple_rest": "simple", "simple_grpc": "simple", "simple_contents_grpc": "simple", "simple_params_grpc": "simple",
    "simple_params_rest": "simple", "identity_rest_json": "identity_fp32", "identity_rest_binary": "identity_fp32",
    "identity_grpc_raw": "identity_fp32", "text_rest_json": "text", "text_rest_binary": "text", "text_grpc": "text",
    "batched_rest": "batched", "batched_grpc": "batched", "decoupled_grpc": "decoupled",
    "generate": "text_generate", "generate_stream": "text_tokens",
}


def serves(name: str, workload: str) -> bool:
    """Whether server `name` serves the model `workload` asks for."""
    return WORKLOAD_MODEL[workload] in SERVED.get(name, MODELS)


def answered_in_polling_thread(model: str) -> bool:
    """Whether our server answers a unary call to `model` (of OIPGEN_MODELS) in grpcio's polling thread rather than
    a pool thread: its class declares `inline` and a plain `infer`, and neither it nor its model.toml asks for
    decoupled answers (what `Plan.inline` and `Plan.batches_on_arrival` read of the loaded model: under dynamic
    batching the polling thread runs the batches its arrivals fill, the batcher's timer those whose delay ran out).
    The gRPC floor replays such a model's answer the same way (bench/grpc_floor.py). Imports the model's module:
    needs our package."""
    import importlib.util
    import inspect
    import tomllib

    folder = OIPGEN_MODELS / model
    config = tomllib.loads((folder / "model.toml").read_text())
    module_name, class_name = config["class"].split(":")
    spec = importlib.util.spec_from_file_location(f"bench_model_{model}", folder / f"{module_name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = getattr(module, class_name)
    plain = not (inspect.iscoroutinefunction(cls.infer) or inspect.isasyncgenfunction(cls.infer))
    decoupled = config.get("decoupled", False) or getattr(cls, "decoupled", False)
    return bool(getattr(cls, "inline", False)) and plain and not decoupled
SERVERS = ("oipgen", "triton", "mlserver", "kserve")
REFERENCE = "triton"  # the report's first table is every server's ratios against this one
LABELS = {"oipgen": "oipgen", "triton": "Triton 2.51", "mlserver": "MLServer 1.7.1", "kserve": "KServe 0.21.0",
          "floor": "the bare transport (floor)"}
LOGGING = "start-up, warnings and errors; nothing per request (no access log, no per-request latency line)"
OIPGEN_MODELS = BENCH / "servers" / "oipgen_repo"  # what our server serves
TRITON_MODELS = BENCH / "servers" / "triton_repo"
IDLE_SETTLE_S = 1.0
# The Python packages whose versions are recorded with each run, per environment.
# Our server with other options. Observability (make bench, on VARIANT_SCENARIOS): as shipped (metrics on, tracing
# off; the same as "oipgen", measured beside the other two), metrics and tracing off, and tracing on (every request
# sampled, exported over OTLP/HTTP to the sink bench/otlp_sink.py, whose address run.py puts in OTLP_ENV). Workers
# (make bench-scale): `--workers N`, given as `options` and the cores as `cpus` (bench/scale.py).
VARIANTS = {
    "oipgen_metrics": (),
    "oipgen_bare": ("--metrics", "off"),
    "oipgen_traced": (),
}
OBSERVABILITY = ("oipgen_bare", "oipgen_metrics", "oipgen_traced")
VARIANT_LABELS = {"oipgen_bare": "metrics and tracing off", "oipgen_metrics": "metrics on (default)",
                  "oipgen_traced": "metrics on, every request traced (OTLP/HTTP)"}
VARIANT_SCENARIOS = ("simple_rest_c8", "simple_grpc_c8")
OTLP_ENV = "OIP_BENCH_OTLP_ENDPOINT"

PACKAGES = {
    "oipgen": ("oipgen", "fastapi", "uvicorn", "grpcio", "protobuf", "orjson", "numpy", "uvloop"),
    "triton": ("nvidia-pytriton", "numpy"),
    "mlserver": ("mlserver", "fastapi", "uvicorn", "grpcio", "uvloop", "numpy"),
    "kserve": ("kserve", "fastapi", "uvicorn", "grpcio", "orjson", "numpy"),
    "loadgen": ("aiohttp", "grpcio", "tritonclient", "uvloop", "numpy", "orjson"),
}
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
    ready_rss_mib: float = 0.0  # the tree's RSS when the REST endpoint first says ready
    idle_rss_mib: float = 0.0  # RSS and PSS of the tree IDLE_SETTLE_S later, before any inference
    idle_pss_mib: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)  # the server's own GET /v2 answer
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
    if name == "oipgen_traced" and not os.environ.get(OTLP_ENV):
        return f"no OTLP endpoint to export to ({OTLP_ENV} is unset)"
    if name == "oipgen" or name in VARIANTS:
        return (
            None if (ROOT / "generated" / "oip" / "server").is_dir() else "generated/oip/server is missing (make build)"
        )
    stamp = cache / ("triton" if name == "triton" else f"venv-{name}") / ".installed"
    return None if stamp.exists() else f"{stamp.parent} is not set up (bash bench/setup.sh)"


def pss_kib(pid: int) -> int:
    """Proportional set size of the process tree of `pid` (/proc/<pid>/smaps_rollup), KiB."""
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def command(
    name: str, cache: Path, http_port: int, grpc_port: int, repository: Path | None = None,
    options: tuple[str, ...] = (), cpus: str = SERVER_CPU, env: Mapping[str, str] | None = None,
    package: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of server `name`, pinned to `cpus` (taskset's list); `repository` is where
    it reads its models from (default: the benchmark's): a model repository, or for KServe the folder of its
    kserve_server.py; `options` go last; `env` is added to the environment. Ours runs the `oip` package of this
    checkout's generated/, or of `package` (the folder that holds an `oip` package: another build's)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("PYTHONPATH", None)
    if name == "oipgen_traced":
        env.update(
            OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_TRACES_SAMPLER="always_on",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=os.environ.get(OTLP_ENV, ""), OTEL_SERVICE_NAME="oipgen-bench",
        )
    if name == "oipgen" or name in VARIANTS:
        env["PYTHONPATH"] = str(package or ROOT / "generated")
        argv = [
            sys.executable,
            "-m",
            "oip",
            "serve",
            "--model-repository",
            str(repository or OIPGEN_MODELS),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--log-level",
            "info",  # the default: start-up and errors, no access log
            *VARIANTS.get(name, ()),
        ]
    elif name == "triton":
        venv = cache / "venv-triton"
        site = next((venv / "lib").glob("python3*/site-packages"))
        # The Python-backend stub finds numpy in this environment's `python` (first on PATH, as PyTriton does) and
        # links libpython: that of the interpreter the environment was made from (its `home`), not the system's.
        home = next(line.split("=", 1)[1].strip() for line in (venv / "pyvenv.cfg").read_text().splitlines()
                    if line.split("=", 1)[0].strip() == "home")  # fmt: skip
        env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = f"{site / 'nvidia_pytriton.libs'}:{Path(home).parent / 'lib'}"
        argv = [
            str(cache / "triton" / "tritonserver"),
            f"--model-repository={repository or TRITON_MODELS}",
            f"--backend-directory={cache / 'triton' / 'backends'}",
            "--http-address=127.0.0.1",
            f"--http-port={http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={grpc_port}",
            "--allow-metrics=false",
            "--log-verbose=0",  # the default: start-up and errors, nothing per request
        ]
    elif name == "mlserver":
        env.update(
            MLSERVER_HTTP_PORT=str(http_port),
            MLSERVER_GRPC_PORT=str(grpc_port),
            MLSERVER_METRICS_PORT=str(free_port()),
            MLSERVER_PARALLEL_WORKERS="0",
            MLSERVER_HOST="127.0.0.1",
        )
        argv = [str(cache / "venv-mlserver" / "bin" / "mlserver"), "start",
                str(repository or BENCH / "servers" / "mlserver_repo")]
    elif name == "kserve":
        argv = [
            str(cache / "venv-kserve" / "bin" / "python"),
            str((repository or BENCH / "servers") / "kserve_server.py"),
            "--http_port",
            str(http_port),
            "--grpc_port",
            str(grpc_port),
            "--enable_latency_logging",
            "false",
            "--log_config_file",
            str(BENCH / "servers" / "kserve_logging.json"),
        ]
    else:
        raise ValueError(f"unknown server {name!r}")
    return ["taskset", "-c", cpus, *argv, *options], env


def _get(port: int, path: str) -> int:
    return _fetch(port, path)[0]


def _fetch(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        connection.close()


def get_json(address: str, path: str) -> dict[str, Any] | None:
    """GET http://{address}{path} as JSON (None: not a 200 JSON object)."""
    status, body = _fetch(int(address.rsplit(":", 1)[1]), path)
    try:
        answer = json.loads(body) if status == 200 else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def inference_count(running: Running, models: tuple[str, ...] | None = None) -> int | None:
    """Inferences the server says it completed, from its statistics extension (Triton's GET
    /v2/models/{m}/stats: ours and Triton have it); None where the server has no such extension."""
    total = 0
    for model in models if models is not None else SERVED.get(running.name, MODELS):
        answer = get_json(running.rest, f"/v2/models/{model}/stats")
        if answer is None:
            return None
        total += sum(int(entry.get("inference_count", 0)) for entry in answer.get("model_stats", []))
    return total


def log_bytes(running: Running) -> int:
    try:
        return running.log.stat().st_size
    except OSError:
        return 0


def versions(name: str, cache: Path) -> dict[str, str]:
    """Installed versions of PACKAGES[name] in the environment that runs `name` (the project's .venv for oipgen
    and the load generator)."""
    name = "oipgen" if name in VARIANTS else name
    python = sys.executable if name in ("oipgen", "loadgen") else str(cache / f"venv-{name}" / "bin" / "python")
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        done = subprocess.run([python, "-c", code, *PACKAGES[name]], capture_output=True, text=True, timeout=60)
        return dict(json.loads(done.stdout)) if done.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


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


def start(
    name: str, cache: Path, workdir: Path, timeout: float = 90.0, *, models: tuple[str, ...] | None = None,
    repository: Path | None = None, options: tuple[str, ...] = (), cpus: str = SERVER_CPU,
    env: Mapping[str, str] | None = None, package: Path | None = None, log_name: str | None = None,
) -> Running:
    """Start server `name` (over `repository`, with `options`, `env` and `package`: see `command`) and wait
    (bounded) until REST says it and `models` are ready, then until gRPC answers. `startup_s`: from the process
    start until the REST answers (polled every 20 ms). Its output goes to `workdir`/`log_name` (default: its
    name).log."""
    workdir.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    argv, env = command(name, cache, http_port, grpc_port, repository, options, cpus, env, package)
    log = workdir / f"{log_name or name}.log"
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
        served = models if models is not None else SERVED.get(name, MODELS)
        waiting = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in served)]
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
        server.metadata = get_json(server.rest, "/v2") or {}
        time.sleep(IDLE_SETTLE_S)  # memory at rest: ready, settled, no inference yet
        server.idle_rss_mib = rss_kib(process.pid) / 1024
        server.idle_pss_mib = pss_kib(process.pid) / 1024
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


def tuned_malloc() -> dict[str, str]:
    """glibc's malloc settings as `oip.server.process.allocator.tune_allocator` makes them in our server, as the
    environment variables it defers to (for the floors: a bare server under the same settings)."""
    sys.path.insert(0, str(ROOT / "generated"))
    from oip.server.process import allocator

    return {"MALLOC_ARENA_MAX": str(allocator.ARENA_MAX), "MALLOC_MMAP_THRESHOLD_": str(allocator.MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(allocator.TRIM_THRESHOLD)}


def tuned_grpc_io() -> dict[str, str]:
    """grpcio's settings as `python -m oip serve` makes them (`oip.server.process.grpc_io.tune_grpc_io`, which
    defers to a GRPC_EXPERIMENTS of the environment), as environment variables: for the floors, a bare grpcio server
    doing its socket work as ours does. Empty where ours keeps grpcio's defaults."""
    return dict(_grpc_io_settings())


@functools.cache
def _grpc_io_settings() -> tuple[tuple[str, str], ...]:
    # Asked of a fresh interpreter (this one may have imported grpc, which stops `tune_grpc_io`), once per run.
    code = ("import os\nfrom oip.server.process.grpc_io import tune_grpc_io\ntune_grpc_io()\n"
            "print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "generated")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=env)
    value = done.stdout.strip()
    return () if value == "<unset>" else (("GRPC_EXPERIMENTS", value),)


def record_answer(server: Running, workload: str, elements: int, path: Path, timeout: float = 60.0) -> None:
    """One request of `workload` to `server`, its checked answer written to `path` (bench/loadgen.py --record), for
    a floor server to replay; RuntimeError when the server did not answer it right."""
    argv = ["taskset", "-c", CLIENT_CPU, sys.executable, str(BENCH / "loadgen.py"), "--rest", server.rest,
            "--grpc", server.grpc, "--workload", workload, "--elements", str(elements), "--timeout", str(timeout),
            "--record", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60, check=False)
    if done.returncode != 0 or not path.exists():
        raise RuntimeError(f"recording {workload}'s answer failed: {done.stderr.strip()[-300:]}")


def start_floor(answer: Path, workdir: Path, timeout: float = 30.0) -> Running:
    """The bare transport answering every request with the answer recorded in `answer` (`record_answer`): uvicorn
    (bench/floor.py) for a REST answer, grpcio's thread pool server with our pool (bench/grpc_floor.py) for a gRPC
    one, pinned to the server CPU in its own process group under our server's malloc and grpcio settings, ready once
    its port accepts connections; its RSS at rest read IDLE_SETTLE_S later."""
    rest = json.loads(answer.read_text())["transport"] == "rest"
    port, other = free_port(), free_port()
    env = {**os.environ, **tuned_malloc(), **({} if rest else tuned_grpc_io())}
    script = ["floor.py", "--serve-rest", str(answer)] if rest else \
        ["grpc_floor.py", "--serve", "replay", "--answer", str(answer)]
    argv = ["taskset", "-c", SERVER_CPU, sys.executable, str(BENCH / script[0]), *script[1:], "--port", str(port)]
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "floor.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=workdir, start_new_session=True, env=env)
    server = Running("floor", process, port if rest else other, other if rest else port, log)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"the floor server did not start; see {log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        time.sleep(0.05)
    time.sleep(IDLE_SETTLE_S)  # its memory at rest, as a server's: ready and settled
    server.idle_rss_mib = rss_kib(process.pid) / 1024
    return server


@contextlib.contextmanager
def running(name: str, cache: Path, workdir: Path, timeout: float = 90.0, **where: Any) -> Iterator[Running]:
    server = start(name, cache, workdir, timeout, **where)
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
    cpus: str = CLIENT_CPU,
) -> dict[str, Any]:
    """One measurement by bench/loadgen.py in its own process, pinned to `cpus` (default: the client CPU); its JSON
    result, or {"error": ...}."""
    argv = [
        "taskset", "-c", cpus, sys.executable, str(BENCH / "loadgen.py"),
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


def run_loadgen_on(
    running: Running, workload: str, cpus: list[str], *, concurrency: int, duration: float, warmup: float,
    elements: int, request_timeout: float,
) -> dict[str, Any]:
    """One measurement by one bench/loadgen.py process per core of `cpus` at once, each pinned to its core with its
    share of `concurrency` (a load generator that can outrun several server processes): their requests added up,
    the server tree's CPU read around them all (per request: over every request answered), the highest p50 and p99
    of the processes (each process's own percentiles; not those of all requests together)."""
    import concurrent.futures

    shares = [concurrency // len(cpus) + (1 if i < concurrency % len(cpus) else 0) for i in range(len(cpus))]
    used = [(cpu, share) for cpu, share in zip(cpus, shares, strict=True) if share]
    cpu_before = cpu_seconds(running.pid)
    with concurrent.futures.ThreadPoolExecutor(len(used)) as pool:
        results = list(pool.map(lambda item: run_loadgen(
            running, workload, concurrency=item[1], duration=duration, warmup=warmup, elements=elements,
            request_timeout=request_timeout, cpus=item[0]), used))
    spent = cpu_seconds(running.pid) - cpu_before
    failed = [r["error"] for r in results if "error" in r]
    if failed:
        return {"workload": workload, "concurrency": concurrency, "error": failed[0]}
    requests = sum(r["requests"] for r in results)
    completed = sum(r["completed"] for r in results)
    return {
        "workload": workload, "concurrency": concurrency, "client_cpus": [cpu for cpu, _ in used],
        "requests": requests, "completed": completed, "errors": sum(r["errors"] for r in results),
        "infer_per_s": sum(r["infer_per_s"] for r in results),
        "p50_ms": max(r["p50_ms"] for r in results), "p99_ms": max(r["p99_ms"] for r in results),
        # the server's CPU over the processes' whole runs, warm-ups included: per request it answered in them
        "server_cpu_us_per_infer": spent / completed * 1e6 if completed else None,
    }
