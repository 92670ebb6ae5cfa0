"""Serving: the REST app (uvicorn) and the gRPC server (`grpc_threads`) in one process, over one event loop.

`python -m <package> serve --model-repository DIR` loads every model of the repository, listens on both
ports and serves until SIGTERM or SIGINT; then it stops accepting connections, lets the requests in flight
finish (up to `--graceful-shutdown-seconds`), unloads the models and exits 0. A second signal exits at once
with status 128 + the signal's number.
Port 0 picks a free port; `--ports-file F` writes `{"http": N, "grpc": M}` to F once both listen.
`--workers N` runs N such servers on the same ports under one supervisor (`workers.py`, `cluster.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import datetime
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc.aio
import uvicorn

from ... import extensions
from ..core.dataplane import DataPlane
from ..core.repository import ModelRepository
from ..grpc.service import create_grpc_server
from ..observe import events, tracing
from ..observe.metrics import CONTENT_TYPE, render
from ..rest.app import create_app
from ..rest.http import http_protocol
from ..settings import Settings

if TYPE_CHECKING:
    from .supervisor import WorkerRole

PACKAGE: Final = __name__.rsplit(".", 3)[0]  # the generated package's name, as vendored

__all__ = [
    "Ports", "build_parser", "configure_logging", "main", "run", "run_worker", "serve", "settings_from_args",
    "tune_allocator",
]

log = logging.getLogger(__name__)

_LEVELS: Final = ("critical", "error", "warning", "info", "debug")
_STARTUP_TIMEOUT: Final = 60.0


@dataclass(frozen=True)
class Ports:
    """The ports the server listens on (None: that transport is off)."""

    http: int | None
    grpc: int | None
    metrics: int | None = None  # --metrics-port


# --- logging --------------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, when there is one). A line
    written while an inference request runs carries its `request_id`, and when it is traced its `trace_id` and
    `span_id`; an access log line carries the request's fields (`access`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,  # which worker, with --workers
        }
        timer = events.current()
        if timer is not None:
            if timer.request_id:
                entry["request_id"] = timer.request_id
            ids = tracing.current_ids()
            if ids is not None:
                entry["trace_id"], entry["span_id"] = ids
        fields = getattr(record, "access", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Log records of every logger (the server's, uvicorn's, grpc's) to stderr at `level` and above."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


# --- serving --------------------------------------------------------------------------------------------------


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling: `serve` owns the signals of the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        return None


def bound_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: a free port), not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # one of several workers on this port: the kernel spreads connections over them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _http_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    sock = bound_socket(host, port, reuse_port)
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _write_ports_file(path: Path, ports: Ports) -> None:
    tmp = path.with_name(path.name + ".tmp")
    doc = {"http": ports.http, "grpc": ports.grpc, **({"metrics": ports.metrics} if ports.metrics else {})}
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)


async def serve(
    settings: Settings,
    repository: ModelRepository | None = None,
    *,
    ports_file: Path | None = None,
    started: asyncio.Future[Ports] | None = None,
    stop: asyncio.Event | None = None,
    worker: WorkerRole | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until `stop` is set), then drain and return.

    Loads every model of `repository` (default: the folder `settings.model_repository`) first. `started`, if
    given, receives the bound ports once both transports listen. `worker` makes this process one worker of
    several (`--workers`): it shares the ports and its control plane with the others.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    signals: list[int] = []

    def on_signal(sig: int) -> None:
        signals.append(sig)
        name = signal.Signals(sig).name
        if len(signals) == 1:
            log.info("received %s: draining in-flight requests, then stopping", name)
            stop.set()
            return
        log.warning("received %s again: stopping now, without waiting for requests in flight", name)
        logging.shutdown()
        os._exit(128 + sig)

    installed: list[int] = []
    # A worker stops on its supervisor's SIGTERM only (Ctrl-C reaches the supervisor, which passes it on).
    for sig in (signal.SIGTERM,) if worker is not None else (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass

    http: _Uvicorn | None = None
    http_task: asyncio.Task[None] | None = None
    metrics_http: _Uvicorn | None = None
    metrics_task: asyncio.Task[None] | None = None
    sockets: list[socket.socket] = []
    grpc_server: grpc.Server | None = None
    control: Any = None
    dataplane_made: DataPlane | None = None
    if repository is None:
        repository = ModelRepository(settings.model_repository)
    # Plain `infer` methods run in the loop's default executor: exactly `model_threads` of them at once, the
    # instance count the model configuration extension reports.
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=settings.model_threads, thread_name_prefix="model")
    )
    try:
        await repository.load_all()
        if stop.is_set():  # a signal came while the models loaded
            return
        if worker is None:
            dataplane = DataPlane(repository, settings)
        else:
            from .cluster import ClusterDataPlane, ControlServer, Peers, socket_path

            dataplane = ClusterDataPlane(repository, settings, Peers(worker.folder, worker.index, worker.key))
            control = ControlServer(dataplane, socket_path(worker.folder, worker.index), worker.key, loop)
            if worker.copy_state:
                await dataplane.copy_state_from_peers()
        dataplane_made = dataplane
        grpc_port: int | None = None
        if settings.grpc_port is not None:
            grpc_server = create_grpc_server(dataplane, settings)
            host = f"[{settings.host}]" if ":" in settings.host else settings.host
            try:
                grpc_port = grpc_server.add_insecure_port(f"{host}:{settings.grpc_port}")
            except RuntimeError as exc:
                raise OSError(f"cannot listen for gRPC on {host}:{settings.grpc_port}: {exc}") from None
            if not grpc_port:
                raise OSError(f"cannot listen for gRPC on {host}:{settings.grpc_port}")
            grpc_server.start()
        http_port: int | None = None
        if settings.http_port is not None:
            sock = _http_socket(settings.host, settings.http_port, reuse_port=settings.reuse_port)
            sockets.append(sock)
            http_port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                create_app(dataplane, settings),
                log_config=None,
                access_log=False,  # the app writes its own access log (`--access-log`), over both transports
                lifespan="off",
                timeout_graceful_shutdown=math.ceil(settings.graceful_shutdown_seconds),
                timeout_keep_alive=settings.http_keep_alive_seconds,
                http=http_protocol(settings.http_header_timeout, settings.http_body_timeout),
                ws="none",
                server_header=False,
            )
            http = _Uvicorn(config)
            http_task = await _start_uvicorn(http, sockets[-1:], "the REST server")
        metrics_port: int | None = None
        if settings.metrics and settings.metrics_port is not None:
            sock = _http_socket(settings.host, settings.metrics_port, reuse_port=settings.reuse_port)
            sockets.append(sock)
            metrics_port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                _metrics_app(dataplane), log_config=None, access_log=False, lifespan="off", server_header=False
            )
            metrics_http = _Uvicorn(config)
            metrics_task = await _start_uvicorn(metrics_http, sockets[-1:], "the metrics listener")
        ports = Ports(http_port, grpc_port, metrics_port)
        if ports_file is not None:
            _write_ports_file(ports_file, ports)
        if started is not None and not started.done():
            started.set_result(ports)
        log.info(
            "serving on %s (REST port %s, gRPC port %s) with %d model(s)",
            settings.host, http_port, grpc_port, len(repository.names()),
        )

        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        if http_task is not None:
            waiters.append(http_task)
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        waiters[0].cancel()
        if not stop.is_set():
            raise RuntimeError("the REST server stopped unexpectedly")
    finally:
        # Everything below (draining, the last trace export, unloading) fits in the graceful shutdown's time.
        deadline = time.monotonic() + settings.graceful_shutdown_seconds
        if control is not None:
            control.close()
        await _shutdown(settings, http, http_task, grpc_server)
        if metrics_http is not None and metrics_task is not None:
            metrics_http.should_exit = True
            await asyncio.gather(metrics_task, return_exceptions=True)
        if dataplane_made is not None and dataplane_made.tracing is not None:
            await asyncio.to_thread(dataplane_made.tracing.shutdown, deadline)
        for sock in sockets:
            sock.close()
        await repository.unload_all()
        for number in installed:
            loop.remove_signal_handler(number)
    log.info("stopped")


async def _start_uvicorn(server: _Uvicorn, sockets: list[socket.socket], what: str) -> asyncio.Task[None]:
    """Serve on `sockets` in a task, once it has started (bounded)."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(server.serve(sockets=sockets))
    deadline = loop.time() + _STARTUP_TIMEOUT
    while not server.started:
        if task.done():
            await task
            raise RuntimeError(f"{what} stopped while starting")
        if loop.time() > deadline:
            raise RuntimeError(f"{what} did not start in time")
        await asyncio.sleep(0.005)
    return task


def _metrics_app(dataplane: DataPlane) -> Any:
    """The `--metrics-port` listener: GET /metrics, and 404 for anything else."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, body, kind = 200, render(await dataplane.metric_families()), CONTENT_TYPE
        else:
            status, body, kind = 404, b'{"error":"not found: this listener serves GET /metrics"}', "application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


async def _shutdown(
    settings: Settings, http: _Uvicorn | None, http_task: asyncio.Task[None] | None, grpc_server: grpc.Server | None
) -> None:
    """Stop both transports together: no new connections or calls, in-flight ones finish within the grace."""
    steps: list[Awaitable[Any]] = []
    if http is not None and http_task is not None:
        http.should_exit = True
        steps.append(http_task)
    if grpc_server is not None:
        stopped = grpc_server.stop(settings.graceful_shutdown_seconds)  # a threading.Event, set once drained
        steps.append(asyncio.get_running_loop().run_in_executor(None, stopped.wait))
    for result in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.error("error while stopping", exc_info=result)


# --- command line ---------------------------------------------------------------------------------------------


def _port(text: str) -> int | None:
    if text.lower() in ("off", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0-65535")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _buckets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(sorted({float(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or values[0] <= 0 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"bucket bounds must be positive numbers, got {text!r}")
    return values


def _workers(text: str) -> str:
    if text != "auto":
        _positive(text)
    return text


def worker_count(value: str) -> int:
    from .supervisor import cpu_count

    return cpu_count() if value == "auto" else int(value)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The options of `serve` (added to `parser` when given). Defaults are those of `Settings`."""
    defaults = Settings()
    p = parser or argparse.ArgumentParser(prog=f"{PACKAGE} serve", description="Serve models over REST and gRPC.")
    p.add_argument("--model-repository", type=Path, default=defaults.model_repository, metavar="DIR",
                   help="folder of models: one sub-folder with a model.toml per model")
    p.add_argument("--host", default=defaults.host, help="address to listen on (default: %(default)s)")
    p.add_argument("--http-port", type=_port, default=defaults.http_port, metavar="PORT",
                   help="REST port; 0 picks a free one, 'off' serves no REST (default: %(default)s)")
    p.add_argument("--grpc-port", type=_port, default=defaults.grpc_port, metavar="PORT",
                   help="gRPC port; 0 picks a free one, 'off' serves no gRPC (default: %(default)s)")
    p.add_argument("--grpc-threads", type=_positive, default=defaults.grpc_threads, metavar="N",
                   help="gRPC calls served at once, a thread each; a stream holds one while open "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=_workers, default="1", metavar="N",
                   help="server processes sharing the ports (SO_REUSEPORT) under one supervisor; 'auto': one per "
                        "available core (default: %(default)s)")
    p.add_argument("--ports-file", type=Path, metavar="FILE",
                   help='once listening, write {"http": N, "grpc": M} to FILE (for tests and scripts)')
    p.add_argument("--server-name", default=defaults.server_name, help="name in server metadata")
    p.add_argument("--server-version", default=defaults.server_version, help="version in server metadata")
    p.add_argument("--not-ready-status", type=int, choices=(400, 503), default=defaults.not_ready_status,
                   help="REST status of a not-ready answer: 503 (default) or 400, as Triton and MLServer answer")
    p.add_argument("--max-request-bytes", type=_positive, default=defaults.max_request_bytes, metavar="N",
                   help="largest REST body and gRPC message, each way (default: %(default)s)")
    p.add_argument("--max-tensor-elements", type=_positive, default=defaults.max_tensor_elements, metavar="N",
                   help="most elements per tensor, checked before anything is allocated (default: %(default)s)")
    p.add_argument("--graceful-shutdown-seconds", type=float, default=defaults.graceful_shutdown_seconds,
                   metavar="S", help="how long requests in flight may finish after SIGTERM (default: %(default)s)")
    p.add_argument("--http-header-timeout", type=_positive_float, default=defaults.http_header_timeout, metavar="S",
                   help="REST: close a connection (408) whose request line and headers take longer "
                        "(default: %(default)s)")
    p.add_argument("--http-body-timeout", type=_positive_float, default=defaults.http_body_timeout, metavar="S",
                   help="REST: close a connection (408) whose request body pauses longer between two pieces "
                        "(default: %(default)s)")
    p.add_argument("--http-keep-alive-seconds", type=_positive, default=defaults.http_keep_alive_seconds,
                   metavar="S", help="REST: close a keep-alive connection idle this long (default: %(default)s)")
    p.add_argument("--shared-memory", choices=("system", "off"), default=defaults.shared_memory,
                   help="system shared memory extension: 'system' (as Triton: any object the server's user can open, "
                        "unless --shared-memory-prefix) or 'off' (default: %(default)s)")
    p.add_argument("--shared-memory-prefix", default=defaults.shared_memory_prefix, metavar="PREFIX",
                   help="register only shared memory keys that start with PREFIX, such as /myapp_ (default: any)")
    p.add_argument("--shared-memory-max-regions", type=_positive, default=defaults.shared_memory_max_regions,
                   metavar="N", help="most shared memory regions registered at once (default: %(default)s)")
    p.add_argument("--shared-memory-max-bytes", type=_positive, default=defaults.shared_memory_max_bytes,
                   metavar="N", help="most bytes mapped for shared memory regions in all (default: %(default)s)")
    p.add_argument("--log-level", choices=_LEVELS, default=defaults.log_level, help="default: %(default)s")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="text lines, or one JSON object per line (default: %(default)s)")
    p.add_argument("--access-log", action="store_true", default=defaults.access_log,
                   help="log one line per request, REST and gRPC: status, duration, sizes (logger oip.access)")
    p.add_argument("--extensions", type=_extensions, default=None, metavar="LIST",
                   help="comma-separated extensions to serve, by Triton's names (default: every one this server "
                        f"can serve); the protocol's: {', '.join(extensions.EXTENSIONS)}. One left out is not "
                        "listed in server metadata and its operations answer 501 / UNIMPLEMENTED")
    p.add_argument("--model-threads", type=_positive, default=defaults.model_threads, metavar="N",
                   help="worker threads running models' plain infer() methods; the instance count the model "
                        "configuration reports (default: %(default)s)")
    p.add_argument("--metrics", choices=("on", "off"), default="on" if defaults.metrics else "off",
                   help="Prometheus metrics at GET /metrics (default: %(default)s)")
    p.add_argument("--metrics-port", type=_port, default=defaults.metrics_port, metavar="PORT",
                   help="also serve /metrics on a separate listener on PORT (0 picks a free one)")
    p.add_argument("--metrics-buckets", type=_buckets, default=defaults.metrics_buckets, metavar="S,S,...",
                   help="upper bounds in seconds of the request duration histogram's buckets")
    return p


def _extensions(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in extensions.EXTENSIONS:
            raise argparse.ArgumentTypeError(
                f"unknown extension {name!r}; choose from {', '.join(extensions.EXTENSIONS)}"
            )
    return names


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        model_repository=args.model_repository,
        server_name=args.server_name,
        server_version=args.server_version,
        not_ready_status=args.not_ready_status,
        max_request_bytes=args.max_request_bytes,
        max_tensor_elements=args.max_tensor_elements,
        log_level=args.log_level,
        access_log=args.access_log,
        grpc_threads=args.grpc_threads,
        metrics=args.metrics == "on",
        metrics_port=args.metrics_port,
        metrics_buckets=args.metrics_buckets,
        graceful_shutdown_seconds=args.graceful_shutdown_seconds,
        http_header_timeout=args.http_header_timeout,
        http_body_timeout=args.http_body_timeout,
        http_keep_alive_seconds=args.http_keep_alive_seconds,
        extensions=args.extensions,
        model_threads=args.model_threads,
        shared_memory=args.shared_memory,
        shared_memory_prefix=args.shared_memory_prefix,
        shared_memory_max_regions=args.shared_memory_max_regions,
        shared_memory_max_bytes=args.shared_memory_max_bytes,
    )


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def main(argv: Sequence[str] | None = None) -> int:
    """`serve` on the command line: parse the options, serve, and return the exit status."""
    return run(build_parser().parse_args(argv))


# glibc's malloc serves every allocation of 128 KiB and more with fresh pages from mmap and unmaps them on free,
# so each request with large tensors page-faults its bodies and buffers in again: measured on 1M-element FP32
# identities, 4 MB over REST binary cost 7 ms of CPU per inference, 80% of it in the kernel, against 2 ms with
# the memory kept for reuse (and 117 against 89 ms over REST JSON). Allocations up to 32 MiB (glibc's upper
# bound) come from the heap instead, and up to 128 MiB of freed heap is kept for the next request. One heap
# (arena) for all threads: the buffers grpc's thread frees are reused by the event loop's (peak memory of a 4 MB
# gRPC raw identity: +30 MiB over a fresh server with one arena, +38 MiB with two, +60 MiB with glibc's default
# of 8 per core; small requests cost the same).
_MMAP_THRESHOLD: Final = 32 * 1024 * 1024
_TRIM_THRESHOLD: Final = 128 * 1024 * 1024
_ARENA_MAX: Final = 1


def tune_allocator() -> bool:
    """Keep large buffers on the C heap between requests, in one arena (glibc only; the
    MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_ARENA_MAX environment variables, when set, win).
    Whether it was done."""
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # <malloc.h>
    return all(
        mallopt(option, value)
        for option, value in ((m_arena_max, _ARENA_MAX), (m_mmap_threshold, _MMAP_THRESHOLD),
                              (m_trim_threshold, _TRIM_THRESHOLD))
    )


def run(args: argparse.Namespace) -> int:
    """Serve with the options `build_parser` parsed; the exit status."""
    settings = settings_from_args(args)
    configure_logging(settings.log_level, args.log_format)
    if settings.model_repository is not None and not settings.model_repository.is_dir():
        log.error("model repository %s is not a directory", settings.model_repository)
        return 2
    workers = worker_count(args.workers)
    if workers > 1:
        from .supervisor import supervise

        return supervise(args, workers)
    return _serve_process(args, settings)


def run_worker(args: argparse.Namespace, worker: WorkerRole) -> int:
    """One worker of `--workers N` (started by the supervisor): serve on the shared ports; the exit status."""
    settings = settings_from_args(args)
    settings.reuse_port = True
    return _serve_process(args, settings, worker)


def _serve_process(args: argparse.Namespace, settings: Settings, worker: WorkerRole | None = None) -> int:
    if tune_allocator():
        log.debug("allocator: buffers up to %d bytes stay on the heap", _MMAP_THRESHOLD)
    try:
        with _runner() as runner:
            runner.run(serve(settings, ports_file=args.ports_file, worker=worker))
    except ValueError as exc:  # settings the server cannot honour (an extension it cannot serve here)
        log.error("%s", exc)
        return 2
    except (OSError, RuntimeError) as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
