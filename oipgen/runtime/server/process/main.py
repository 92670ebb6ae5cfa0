"""`python -m <package> serve`: the command line, and what runs (`run`): one server process (`serve`), or
`--workers N` of them under one supervisor (`supervisor`), which is handed what each worker runs (`run_worker`).

`python -m <package> serve --model-repository DIR` loads every model of the repository (or those
`--model-control-mode` and `--load-model` say, `core.model_control`), listens on both ports and serves until
SIGTERM or SIGINT; then it stops accepting connections, lets the requests in flight finish (up to
`--graceful-shutdown-seconds`), unloads the models and exits 0. A second signal exits at once with status 128 +
the signal's number. What it cannot do as asked exits at once: 2 for options it cannot honour (no model
repository, a `--dataplane` that does not import...), one line each, 1 for a port it cannot listen on (named)
and, with `--exit-on-error`, a model that fails to load.
Port 0 picks a free port; `--ports-file F` writes `{"http": N, "grpc": M}` to F once both listen.
`--workers N` runs N such servers on the same ports under one supervisor (`supervisor`, `cluster`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.util
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from ... import extensions
from ..core import model_control
from ..core.dataplane import DataPlane
from ..errors import clip
from ..observe.logs import configure_logging
from ..settings import GRPC_CONNECTION, GRPC_THREAD_SCHEDULING, Settings
from .allocator import MMAP_THRESHOLD, tune_allocator
from .cluster import WorkerRole
from .grpc_io import GRPC_EXPERIMENTS, MEASURED, grpcio_version, measured
from .serve import NO_MODELS, serve
from .sockets import open_files
from .supervisor import cpu_count, supervise

PACKAGE: Final = __name__.rsplit(".", 3)[0]  # the generated package's name, as vendored

__all__ = ["build_parser", "dataplane_class", "main", "run", "run_worker", "settings_from_args"]

log = logging.getLogger(__name__)

_LEVELS: Final = ("critical", "error", "warning", "info", "debug")


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


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least or value >= 2**31:  # grpc's arguments are C ints
            raise argparse.ArgumentTypeError(f"must be from {least} to {2**31 - 1}, got {value}")
        return value

    return parse


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
    return cpu_count() if value == "auto" else int(value)


def _boolean(text: str) -> bool:
    """A flag's value as Triton's flags take it (`--strict-readiness=false`)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


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
                   help="folder of models: one sub-folder with a model.toml per model (required)")
    p.add_argument("--model-control-mode", choices=model_control.MODES, default=None,
                   help="Triton's model control. Without it: explicit with --load-model '*' (every model loads at "
                        "start, load and unload requests are served). none: every model loads at start, load and "
                        "unload requests are refused. explicit: only the --load-model models load at start, the "
                        "others on request. poll: as none, and the repository is read again every "
                        "--repository-poll-secs: new models load, changed ones reload, removed ones unload")
    p.add_argument("--load-model", action="append", default=None, metavar="NAME",
                   help="explicit mode: a model to load at start (repeatable; '*' alone: every model)")
    p.add_argument("--repository-poll-secs", type=_seconds, default=defaults.repository_poll_secs, metavar="S",
                   help="poll mode: seconds between two reads of the repository (default: %(default)s)")
    p.add_argument("--strict-readiness", type=_boolean, nargs="?", const=True, default=defaults.strict_readiness,
                   metavar="BOOL", help="ready only when every model asked to load is ready; false: ready when "
                                        "live (default: %(default)s)")
    p.add_argument("--exit-on-error", type=_boolean, nargs="?", const=True, default=defaults.exit_on_error,
                   metavar="BOOL", help="exit (status 1) when a model fails to load at start; false: serve the "
                                        "others (default: %(default)s)")
    p.add_argument("--dataplane", default=None, metavar="MODULE:CLASS",
                   help="serve this subclass of the package's DataPlane (over both transports, in every worker): "
                        "MODULE is imported from sys.path (the current folder, PYTHONPATH), or is the path of a "
                        "python file (./plane.py:MyDataPlane)")
    p.add_argument("--host", default=defaults.host, help="address to listen on (default: %(default)s)")
    p.add_argument("--http-port", type=_port, default=defaults.http_port, metavar="PORT",
                   help="REST port; 0 picks a free one, 'off' serves no REST (default: %(default)s)")
    p.add_argument("--grpc-port", type=_port, default=defaults.grpc_port, metavar="PORT",
                   help="gRPC port; 0 picks a free one, 'off' serves no gRPC (default: %(default)s)")
    p.add_argument("--grpc-threads", type=_positive, default=defaults.grpc_threads, metavar="N",
                   help="gRPC inference calls served at once, a thread each; as many streams open at once (a "
                        "stream holds its thread while open), and as many other calls, on threads of their own "
                        "(default: %(default)s)")
    p.add_argument("--grpc-thread-scheduling", choices=GRPC_THREAD_SCHEDULING, default=defaults.grpc_thread_scheduling,
                   help="the gRPC threads' scheduling policy on Linux (and the gRPC batch timer's): 'batch' "
                        "(SCHED_BATCH: a woken thread waits for the running one rather than preempting it) or "
                        "'normal' (default: %(default)s)")
    for flag, _, least, help_text in GRPC_CONNECTION:
        if least is None:
            p.add_argument(f"--{flag}", type=_boolean, metavar="BOOL", help=help_text)
        else:
            p.add_argument(f"--{flag}", type=_at_least(least), metavar="N", help=help_text)
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
    p.add_argument("--graceful-shutdown-seconds", type=_seconds, default=defaults.graceful_shutdown_seconds,
                   metavar="S", help="how long requests in flight may finish after SIGTERM (default: %(default)s)")
    p.add_argument("--shutdown-delay-seconds", type=_seconds, default=defaults.shutdown_delay_seconds, metavar="S",
                   help="after SIGTERM, go on serving for S seconds while health answers not ready (so that load "
                        "balancers stop sending), then drain (default: %(default)s)")
    p.add_argument("--http-header-timeout", type=_positive_float, default=defaults.http_header_timeout, metavar="S",
                   help="REST: close a connection (408) whose request line and headers take longer "
                        "(default: %(default)s)")
    p.add_argument("--http-max-header-bytes", type=_positive, default=defaults.http_max_header_bytes, metavar="N",
                   help="REST: refuse (431, and close the connection) a request line and headers larger than this; "
                        "gRPC: refuse a call whose metadata is larger (default: %(default)s)")
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
    # As Triton: explicit mode named on the command line loads only the --load-model models (none without it).
    mode = args.model_control_mode or "explicit"
    given = tuple(args.load_model or ())
    load_model = given or ((model_control.ALL,) if args.model_control_mode in (None, "none", "poll") else ())
    return Settings(
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        model_repository=args.model_repository,
        model_control_mode=mode,
        load_model=load_model,
        repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        server_name=args.server_name,
        server_version=args.server_version,
        not_ready_status=args.not_ready_status,
        max_request_bytes=args.max_request_bytes,
        max_tensor_elements=args.max_tensor_elements,
        log_level=args.log_level,
        access_log=args.access_log,
        grpc_threads=args.grpc_threads,
        grpc_thread_scheduling=args.grpc_thread_scheduling,
        metrics=args.metrics == "on",
        metrics_port=args.metrics_port,
        metrics_buckets=args.metrics_buckets,
        graceful_shutdown_seconds=args.graceful_shutdown_seconds,
        shutdown_delay_seconds=args.shutdown_delay_seconds,
        grpc_options=tuple((option, int(value)) for flag, option, _, _ in GRPC_CONNECTION
                           if (value := getattr(args, flag.replace("-", "_"))) is not None),
        http_header_timeout=args.http_header_timeout,
        http_max_header_bytes=args.http_max_header_bytes,
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


def run(args: argparse.Namespace) -> int:
    """Serve with the options `build_parser` parsed; the exit status."""
    settings = settings_from_args(args)
    configure_logging(settings.log_level, args.log_format)
    if settings.model_repository is None:
        log.error("%s", NO_MODELS)
        return 2
    if not settings.model_repository.is_dir():
        log.error("model repository %s is not a directory", settings.model_repository)
        return 2
    try:
        model_control.check(settings)
        check_ports(settings)
        dataplane_class(args.dataplane)  # each worker imports it again
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    workers = worker_count(args.workers)
    if workers > 1:
        return supervise(args, workers, run_worker)
    return _serve_process(args, settings)


def check_ports(settings: Settings) -> None:
    """ValueError when two listeners are given the same port: said before the models load, and as what it is
    rather than as the second listener's "address already in use"."""
    ports = {"--http-port": settings.http_port, "--grpc-port": settings.grpc_port}
    if settings.metrics:
        ports["--metrics-port"] = settings.metrics_port
    taken: dict[int, str] = {}
    for flag, port in ports.items():
        if port:  # None: off; 0: a free port, picked for each
            if port in taken:
                raise ValueError(f"{taken[port]} and {flag} are both {port}: each listener needs a port of its own")
            taken[port] = flag


def run_worker(args: argparse.Namespace, worker: WorkerRole) -> int:
    """One worker of `--workers N` (what the supervisor runs in each worker process): serve on the shared ports;
    the exit status."""
    return _serve_process(args, dataclasses.replace(settings_from_args(args), reuse_port=True), worker)


def dataplane_class(text: str | None) -> type[DataPlane]:
    """The data plane class `--dataplane MODULE:CLASS` names (None: `DataPlane`). MODULE is a module imported from
    sys.path (`plugins.plane`), or the path of a python file (`./plane.py`, imported with its folder first on
    sys.path, so it may import its neighbours); CLASS a subclass of `DataPlane` in it. ValueError, one line, for
    anything else (a module that fails to import says how)."""
    if text is None:
        return DataPlane
    where, _, name = text.rpartition(":")
    usage = "--dataplane takes MODULE:CLASS (mypackage.plane:MyDataPlane, or ./plane.py:MyDataPlane)"
    if not where or not name or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"{usage}, got {clip(text)!r}")
    try:
        if where.endswith(".py"):
            file = Path(where)
            if not file.is_file():
                raise ValueError(f"--dataplane {clip(text)!r}: no python file {clip(where)!r}")
            sys.path.insert(0, str(file.resolve().parent))
            spec = importlib.util.spec_from_file_location(f"_dataplane_{file.stem}", file)
            if spec is None or spec.loader is None:
                raise ValueError(f"--dataplane {clip(text)!r}: cannot import {clip(where)!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        elif all(part.isidentifier() for part in where.split(".")):
            module = importlib.import_module(where)
        else:
            raise ValueError(f"{usage}, got {clip(text)!r}")
    except ValueError:
        raise
    except (Exception, SystemExit) as exc:  # the module's own failure, whatever it is, in one line
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ValueError(f"--dataplane {clip(text)!r}: cannot import {clip(where)!r}: {clip(detail)}") from None
    found: object = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, DataPlane)):
        what = "has no" if found is None else "names something other than a subclass of DataPlane as"
        raise ValueError(f"--dataplane {clip(text)!r}: {clip(where)!r} {what} {clip(name)!r} (a subclass of "
                         f"{DataPlane.__module__.rsplit('.', 2)[0]}.DataPlane)")
    return found


def _serve_process(args: argparse.Namespace, settings: Settings, worker: WorkerRole | None = None) -> int:
    if tune_allocator():
        log.debug("allocator: buffers up to %d bytes stay on the heap", MMAP_THRESHOLD)
    if (raised := open_files()) is not None:
        log.debug("open files: the soft limit is raised from %d to %d, the hard limit", *raised)
    experiments = os.environ.get("GRPC_EXPERIMENTS")
    if experiments == GRPC_EXPERIMENTS:  # `grpc_io.tune_grpc_io`, before grpc was imported
        log.debug("grpc: the polling thread does the socket work (GRPC_EXPERIMENTS=%s)", GRPC_EXPERIMENTS)
    elif experiments is None and not measured(version := grpcio_version()):  # an operator's setting goes unsaid
        log.info("grpc: grpcio %s was not measured with the polling thread doing the socket work (from %d.%d up to "
                 "%d.%d, excluded): grpcio's own defaults are kept", version or "(version unknown)", *MEASURED[0],
                 *MEASURED[1])
    try:
        dataplane = dataplane_class(args.dataplane)
        with _runner() as runner:
            runner.run(serve(settings, dataplane=dataplane, ports_file=args.ports_file, worker=worker))
    except ValueError as exc:  # settings the server cannot honour (an extension it cannot serve here)
        log.error("%s", exc)
        return 2
    except (OSError, RuntimeError) as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
