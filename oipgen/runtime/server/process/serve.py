"""One server process: the composition root (`Assembly`: the repository's data plane, its observers and both
transports, each given what it needs) and its life (`serve`).

`serve` loads the models the model control mode loads at start (`core.model_control`; with `exit_on_error`, one
that fails stops it), listens on both ports and serves until SIGTERM or SIGINT, polling the repository in poll
mode; then, for `Settings.shutdown_delay_seconds`, it goes on serving while its readiness says not ready (so that
load balancers stop sending); then it stops accepting connections, lets the requests in flight finish (up to
`Settings.graceful_shutdown_seconds`), unloads the models and returns. A second signal exits at once with status
128 + the signal's number. One worker of several (`--workers`, `supervisor`) shares the ports and its control
plane with the others (`cluster`); worker 0 polls, for every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import time
from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import uvicorn

from ..core import model_control
from ..core.dataplane import DataPlane
from ..core.invoke import set_model_threads
from ..core.pipeline import Pipeline
from ..core.repository import ModelRepository
from ..grpc import Servicer
from ..grpc.server import create_server
from ..observe.observing import Observing
from ..observe.tracing_setup import configure
from ..rest.app import OipApp, create_app, metrics_app
from ..rest.http import http_protocol
from ..settings import Settings
from .cluster import ClusterDataPlane, ControlServer, Peers, WorkerRole, cluster_dataplane, socket_path
from .sockets import Ports, SignalLatch, address, listening_socket, write_ports_file

__all__ = ["NO_MODELS", "Assembly", "serve"]

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT: Final = 60.0

NO_MODELS: Final = (
    "no models to serve: give a model repository, `--model-repository DIR` (a folder with one sub-folder per "
    "model, each holding a model.toml), or add models from Python (`ModelRepository.add`) and pass the repository "
    "to `serve`"
)


@dataclass(frozen=True)
class Assembly:
    """What one server process is made of, built in one place (`build`): the repository, the observers of its
    inference (`observing`), the data plane over both, and the transports, each given what it needs of them."""

    settings: Settings
    repository: ModelRepository
    observing: Observing
    dataplane: DataPlane

    @classmethod
    def build(cls, repository: ModelRepository | None, settings: Settings, peers: Peers | None = None,
              dataplane: type[DataPlane] = DataPlane) -> Assembly:
        """The parts over `repository` (None: the folder `settings.model_repository`; its models are loaded by
        whoever serves them): tracing as the OpenTelemetry environment asks, the statistics and metrics as
        `settings` ask, the data plane of class `dataplane` (a `DataPlane` subclass, made with its arguments);
        with `peers`, one worker of several. ValueError for a setting it cannot honour or a data plane class it
        cannot make."""
        model_control.check(settings)
        if not (isinstance(dataplane, type) and issubclass(dataplane, DataPlane)):
            raise ValueError(f"the data plane must be a subclass of DataPlane, got {dataplane!r}")
        if repository is None:
            repository = ModelRepository(settings.model_repository)
        observing = Observing.of(settings, repository.inflight, configure(settings.server_name))
        try:
            if peers is None:
                plane = dataplane(repository, settings, observing)
            else:
                plane = cluster_dataplane(dataplane)(repository, settings, peers, observing)
        except Exception as exc:
            raise ValueError(f"cannot make the data plane {dataplane.__qualname__}: {type(exc).__name__}: {exc}"
                             ) from exc
        return cls(settings, repository, observing, plane)

    @property
    def tracing(self) -> bool:
        return self.observing.tracing is not None

    @property
    def lean(self) -> Pipeline | None:
        """The pipeline the transports' lean ways of inference run over (`rest.lean`, `grpc.in_thread`): the data
        plane's, unless its class answers inference its own way (it overrides `model_infer`): then every request
        goes to that."""
        if type(self.dataplane).model_infer is not DataPlane.model_infer:
            return None
        return self.dataplane.pipeline

    def rest_app(self) -> OipApp:
        """The REST app (`rest.app.create_app`)."""
        metrics = self.observing.metrics
        return create_app(self.dataplane, self.settings, enabled=self.dataplane.enabled, repository=self.repository,
                          metrics=metrics, scrape=self.dataplane.metric_families if metrics is not None else None,
                          tracing=self.tracing, pipeline=self.lean)

    def servicer(self) -> Servicer:
        """The gRPC servicer (`grpc.service.Servicer`), for a server of one's own (as Ray's gRPC proxy)."""
        return Servicer(self.dataplane, self.settings, self.tracing)

    def grpc_server(self) -> grpc.Server:
        """The gRPC server (`grpc.server.create_server`); call from the event loop."""
        return create_server(self.servicer(), pipeline=self.lean, metrics=self.observing.metrics)

    def metrics_app(self) -> Any:
        """The `--metrics-port` listener (`rest.app.metrics_app`)."""
        return metrics_app(self.dataplane.metric_families)

    async def stop_tracing(self, deadline: float) -> None:
        """Export the last spans, by `deadline` (`time.monotonic()`)."""
        if self.observing.tracing is not None:
            await asyncio.to_thread(self.observing.tracing.shutdown, deadline)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling: `serve` owns the signals of the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        return None


async def serve(
    settings: Settings,
    repository: ModelRepository | None = None,
    *,
    dataplane: type[DataPlane] = DataPlane,
    ports_file: Path | None = None,
    started: asyncio.Future[Ports] | None = None,
    stop: asyncio.Event | None = None,
    worker: WorkerRole | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until `stop` is set), then drain and return.

    Loads the models of `repository` (default: the folder `settings.model_repository`) that the model control
    mode loads at start first (ValueError when there is neither a folder nor a model added from Python;
    RuntimeError when one fails to load and `settings.exit_on_error`). `dataplane`: the class of the data plane,
    `DataPlane` or a subclass, for both transports (and every worker). `started`, if given, receives the bound
    ports once both transports listen. `worker` makes this process one worker of several (`--workers`): it
    shares the ports and its control plane with the others.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    peers = None if worker is None else Peers(worker.folder, worker.index, worker.key)
    assembly = Assembly.build(repository, settings, peers, dataplane)
    repository = assembly.repository
    if repository.path is None and not repository.names():
        raise ValueError(NO_MODELS)

    def draining(name: str) -> None:
        log.info("received %s: draining in-flight requests, then stopping", name)
        stop.set()

    def stopping_now(name: str) -> None:
        log.warning("received %s again: stopping now, without waiting for requests in flight", name)

    latch = SignalLatch(draining, stopping_now)
    installed: list[int] = []
    # A worker stops on its supervisor's SIGTERM only (Ctrl-C reaches the supervisor, which passes it on).
    for sig in (signal.SIGTERM,) if worker is not None else (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, latch, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass

    http: _Uvicorn | None = None
    http_task: asyncio.Task[None] | None = None
    metrics_http: _Uvicorn | None = None
    metrics_task: asyncio.Task[None] | None = None
    sockets: list[socket.socket] = []
    grpc_server: grpc.Server | None = None
    control: ControlServer | None = None
    poller: asyncio.Task[None] | None = None
    set_model_threads(loop, settings.model_threads)
    try:
        failures = await model_control.load_at_start(repository, settings)
        if failures and settings.exit_on_error:
            raise RuntimeError(f"stopping (--exit-on-error): {len(failures)} model(s) failed to load: "
                               + "; ".join(failures))
        if stop.is_set():  # a signal came while the models loaded
            return
        cluster = assembly.dataplane
        if worker is not None and isinstance(cluster, ClusterDataPlane):
            control = ControlServer(cluster, socket_path(worker.folder, worker.index), worker.key)
            if worker.copy_state:
                cluster.copied.clear()  # the peers' operations from now on apply after the copy
            await control.listen()
            if worker.copy_state:
                await cluster.copy_state_from_peers()
        if model_control.polls(settings) and (worker is None or worker.index == 0):  # one poller for all
            sync = cluster.sync_everywhere if isinstance(cluster, ClusterDataPlane) else repository.sync
            poller = asyncio.create_task(model_control.poll(sync, settings.repository_poll_secs))
        grpc_port: int | None = None
        if settings.grpc_port is not None:
            grpc_server = assembly.grpc_server()
            where = address(settings.host, settings.grpc_port)
            try:
                grpc_port = grpc_server.add_insecure_port(where)
            except RuntimeError as exc:
                raise OSError(f"cannot listen for gRPC on {where}: {exc}") from None
            if not grpc_port:
                raise OSError(f"cannot listen for gRPC on {where}")
            grpc_server.start()
        http_port: int | None = None
        if settings.http_port is not None:
            sock = listening_socket(settings.host, settings.http_port, reuse_port=settings.reuse_port, what="REST")
            sockets.append(sock)
            http_port = int(sock.getsockname()[1])
            app = assembly.rest_app()
            config = uvicorn.Config(
                app,
                log_config=None,
                access_log=False,  # the app writes its own access log (`--access-log`), over both transports
                lifespan="off",
                timeout_graceful_shutdown=math.ceil(settings.graceful_shutdown_seconds),
                timeout_keep_alive=settings.http_keep_alive_seconds,
                http=http_protocol(settings.http_header_timeout, settings.http_body_timeout,
                                   settings.http_max_header_bytes, app, settings.max_request_bytes),
                h11_max_incomplete_event_size=settings.http_max_header_bytes,  # without httptools
                ws="none",
                server_header=False,
            )
            http = _Uvicorn(config)
            http_task = await _start_uvicorn(http, sockets[-1:], "the REST server")
        metrics_port: int | None = None
        if settings.metrics and settings.metrics_port is not None:
            sock = listening_socket(settings.host, settings.metrics_port, reuse_port=settings.reuse_port,
                                    what="metrics")
            sockets.append(sock)
            metrics_port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                assembly.metrics_app(), log_config=None, access_log=False, lifespan="off", server_header=False
            )
            metrics_http = _Uvicorn(config)
            metrics_task = await _start_uvicorn(metrics_http, sockets[-1:], "the metrics listener")
        ports = Ports(http_port, grpc_port, metrics_port)
        if ports_file is not None:
            write_ports_file(ports_file, ports)
        if started is not None and not started.done():
            started.set_result(ports)
        ready = sum(1 for name in repository.names() if repository.ready_versions(name))
        log.info(
            "serving on %s (REST port %s, gRPC port %s): %d of %d model(s) ready, --model-control-mode %s",
            settings.host, http_port, grpc_port, ready, len(repository.names()), settings.model_control_mode,
        )

        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        if http_task is not None:
            waiters.append(http_task)
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        waiters[0].cancel()
        if not stop.is_set():
            raise RuntimeError("the REST server stopped unexpectedly")
        if settings.shutdown_delay_seconds > 0:
            assembly.dataplane.stopping = True
            log.info("not ready for %g s (--shutdown-delay-seconds), serving meanwhile; then draining",
                     settings.shutdown_delay_seconds)
            await asyncio.sleep(settings.shutdown_delay_seconds)
    finally:
        # Everything below (draining, the last trace export, unloading) fits in the graceful shutdown's time.
        deadline = time.monotonic() + settings.graceful_shutdown_seconds
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        if control is not None:
            control.close()
        await _shutdown(settings, http, http_task, grpc_server)
        if metrics_http is not None and metrics_task is not None:
            metrics_http.should_exit = True
            await asyncio.gather(metrics_task, return_exceptions=True)
        await assembly.stop_tracing(deadline)
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


