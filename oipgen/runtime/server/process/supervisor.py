"""`serve --workers N`: N server processes on the same ports, under one supervising process, which is handed what
each of them runs (`supervise(args, count, target)`: `main.run_worker`) and never imports the command line.

The supervisor reserves the REST and gRPC ports (a port of 0 becomes a free one), makes a private folder for the
workers' control sockets (`cluster`) and starts N workers, each a full server (data plane, models, both
transports) listening with SO_REUSEPORT, so the kernel spreads connections over them. It reports ready (the
ports file, the log line) only once every worker is serving. A worker that dies is logged and started again; the
new one copies the others' control-plane state before it listens, and the ports file names it once it does. A
worker that is alive but stuck is treated as dead: the supervisor pings every worker on its control socket every
`_PROBE_EVERY` seconds (`cluster.ping`, answered by the worker's event loop), and one that has answered none for
`UNRESPONSIVE_AFTER` seconds while serving, or that a peer reports as having missed an operation that changes state
(`cluster.missed_path`), is killed (SIGKILL), logged, and started again like any worker that died.
SIGTERM or SIGINT is passed on to every worker as SIGTERM: each drains its requests in flight, and the supervisor
exits 0 when all did. A second signal kills the workers at once. If the supervisor itself is killed, the workers
get SIGTERM (Linux' parent-death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Final

from ..observe.logs import configure_logging
from .cluster import WorkerRole, missed_path, ping, socket_path
from .sockets import Ports, SignalLatch, bound_socket, write_ports_file

__all__ = ["Target", "cpu_count", "private_folder", "supervise"]

Target = Callable[[argparse.Namespace, WorkerRole], int]
"""What a worker process runs, given the options and its role; its exit status (`main.run_worker`). A module's
function: the spawned process imports it by name."""

log = logging.getLogger(__name__)

_RESTARTS: Final = 5  # a worker that dies this many times within _RESTART_WINDOW seconds stops the server
_RESTART_WINDOW: Final = 60.0
_POLL: Final = 0.2
_PROBE_EVERY: Final = 2.0  # seconds between two pings of each worker
_PING_TIMEOUT: Final = 2.0
UNRESPONSIVE_AFTER: Final = 30.0
"""Seconds a serving worker may go without answering a ping before it is killed and started again."""


_SOCKET_PATH: Final = 107  # bytes of a Unix socket's path that Linux takes (sun_path: 108, with its NUL)


def private_folder(count: int) -> Path:
    """A new folder (mode 0700) for the control sockets of `count` workers: under TMPDIR, or under /tmp when
    TMPDIR is too deep for a socket's path (a socket cannot be bound at a longer one)."""
    folder = Path(tempfile.mkdtemp(prefix="oip-workers-"))
    if len(os.fsencode(socket_path(folder, count - 1))) <= _SOCKET_PATH:
        return folder
    folder.rmdir()
    short = Path(tempfile.mkdtemp(prefix="oip-workers-", dir="/tmp"))
    log.info("the workers' control sockets are under %s: the temporary folder %s is too deep for a socket's path",
             short, folder.parent)
    return short


def cpu_count() -> int:
    """The cores this process may run on (`--workers auto`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _reserve(host: str, port: int, what: str) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding `port` (0: a free one) while the workers bind it too
    (OSError naming `what` it is for, the host and the port when it cannot)."""
    return bound_socket(host, port, reuse_port=True, what=what)


def _die_with_parent() -> None:
    """SIGTERM this process when the supervisor dies, whatever killed it (Linux' PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _worker_main(target: Target, args: argparse.Namespace, role: WorkerRole, log_format: str) -> None:
    """The entry point of a worker process (spawned: a fresh interpreter)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor passes Ctrl-C on as SIGTERM
    configure_logging(args.log_level, log_format)
    raise SystemExit(target(args, role))


class _Prober(threading.Thread):
    """Pings every worker that listens on its control socket, every _PROBE_EVERY seconds, all at once; `answered`
    holds when each last answered (time.monotonic(), by index)."""

    def __init__(self, folder: Path, key: bytes) -> None:
        super().__init__(name="oip-probe", daemon=True)
        self.folder = folder
        self.key = key
        self.answered: dict[int, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(_PROBE_EVERY):
            asyncio.run(self._round())

    async def _round(self) -> None:
        paths = {int(number): p for p in self.folder.glob("worker-*.sock")
                 if (number := p.stem.removeprefix("worker-")).isdigit()}
        answers = await asyncio.gather(*(ping(path, self.key, _PING_TIMEOUT) for path in paths.values()))
        now = time.monotonic()
        for index, answered in zip(paths, answers, strict=True):
            if answered:
                self.answered[index] = now


class _Supervisor:
    def __init__(self, args: argparse.Namespace, count: int, target: Target) -> None:
        self.args = args
        self.count = count
        self.target = target
        self.folder = private_folder(count)
        self.key = os.urandom(32)
        self.context = multiprocessing.get_context("spawn")
        self.workers: dict[int, BaseProcess] = {}
        self.restarts: dict[int, list[float]] = {i: [] for i in range(count)}
        self.signals = SignalLatch(self.draining, self.killing)
        self.metrics_port: int | None = None
        self.prober = _Prober(self.folder, self.key)
        self.serving_since: dict[int, float] = {}  # by index: when the supervisor saw the worker serving
        self.stuck: set[int] = set()  # killed for being stuck, not yet seen dead

    def ready_file(self, index: int) -> Path:
        return self.folder / f"worker-{index}.json"

    def start(self, index: int, copy_state: bool) -> None:
        self.ready_file(index).unlink(missing_ok=True)
        missed_path(socket_path(self.folder, index)).unlink(missing_ok=True)  # the new worker copies the state
        self.stuck.discard(index)
        args = argparse.Namespace(**vars(self.args))
        args.workers = "1"
        args.ports_file = self.ready_file(index)
        role = WorkerRole(index, self.folder, self.key, copy_state)
        process = self.context.Process(
            target=_worker_main, args=(self.target, args, role, self.args.log_format), name=f"oip-worker-{index}",
            daemon=False,
        )
        process.start()
        self.workers[index] = process
        note = ", copying the others' state" if copy_state else ""
        log.info("worker %d started (pid %s)%s", index, process.pid, note)

    def all_ready(self) -> bool:
        return all(self.ready_file(i).exists() for i in range(self.count))

    def write_ports_file(self, http: int | None, grpc: int | None) -> None:
        if self.args.ports_file is not None:
            write_ports_file(Path(self.args.ports_file), Ports(http, grpc, self.metrics_port),
                             workers=[self.workers[i].pid for i in range(self.count)])

    def draining(self, name: str) -> None:
        log.info("received %s: draining every worker, then stopping", name)

    def killing(self, name: str) -> None:
        log.warning("received %s again: killing the workers now", name)
        for process in self.workers.values():
            with contextlib.suppress(OSError):
                if process.pid is not None:
                    os.kill(process.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> list[int]:
        """Wait up to `timeout` for a worker to exit; the indexes of the workers that are not alive."""
        sentinels = [p.sentinel for p in self.workers.values() if p.is_alive()]
        if sentinels:
            multiprocessing.connection.wait(sentinels, timeout)
        return [i for i, p in self.workers.items() if not p.is_alive()]

    def serving(self, *indexes: int) -> None:
        now = time.monotonic()
        for index in indexes:
            self.serving_since[index] = now

    def kill_stuck(self, starting: set[int]) -> None:
        """Kill every worker that is stuck: serving and silent for UNRESPONSIVE_AFTER seconds, or reported by a
        peer as having missed an operation (it dies, and is started again as any worker that dies)."""
        now = time.monotonic()
        for index, process in self.workers.items():
            if index in self.stuck or not process.is_alive() or process.pid is None:
                continue
            missed = missed_path(socket_path(self.folder, index))
            if missed.exists():
                operation = missed.read_text(errors="replace")[:100]
                missed.unlink(missing_ok=True)
                why = f"missed an operation that changes state ({operation}): a peer could not reach it in time"
            elif index in starting:
                continue
            else:
                silent = now - max(self.prober.answered.get(index, 0.0), self.serving_since.get(index, now))
                if silent <= UNRESPONSIVE_AFTER:
                    continue
                why = f"answered no ping for {silent:.0f}s"
            log.error("worker %d (pid %s) %s: killing it", index, process.pid, why)
            self.stuck.add(index)
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)

    def restart(self, index: int) -> bool:
        """Start a dead worker again; False when it keeps dying."""
        process = self.workers[index]
        code = process.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"status {code}"
        log.error("worker %d (pid %s) exited with %s; starting it again", index, process.pid, how)
        now = time.monotonic()
        recent = [t for t in self.restarts[index] if now - t < _RESTART_WINDOW] + [now]
        self.restarts[index] = recent
        if len(recent) > _RESTARTS:
            log.error("worker %d died %d times within %.0fs: stopping", index, len(recent), _RESTART_WINDOW)
            return False
        socket_path(self.folder, index).unlink(missing_ok=True)
        self.start(index, copy_state=True)
        return True

    def stop(self) -> bool:
        """SIGTERM every worker and wait for them to drain; whether all exited with 0."""
        for process in self.workers.values():
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = (time.monotonic() + float(self.args.shutdown_delay_seconds)
                    + float(self.args.graceful_shutdown_seconds) + 15.0)
        clean = True
        for index, process in self.workers.items():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("worker %d did not stop in time: killing it", index)
                process.kill()
                process.join(5.0)
                clean = False
            elif process.exitcode == -signal.SIGTERM:
                # A worker handles SIGTERM from before it listens: killed by it, it was still starting.
                log.info("worker %d stopped while it was starting", index)
            elif process.exitcode != 0:
                log.error("worker %d exited with %s", index, process.exitcode)
                clean = False
        return clean

    def run(self) -> int:
        settings_host = self.args.host
        reserved: list[socket.socket] = []
        try:
            http = grpc = None
            if self.args.http_port is not None:
                reserved.append(_reserve(settings_host, self.args.http_port, "REST"))
                http = self.args.http_port = int(reserved[-1].getsockname()[1])
            if self.args.grpc_port is not None:
                reserved.append(_reserve(settings_host, self.args.grpc_port, "gRPC"))
                grpc = self.args.grpc_port = int(reserved[-1].getsockname()[1])
            if getattr(self.args, "metrics", "on") == "on" and getattr(self.args, "metrics_port", None) is not None:
                reserved.append(_reserve(settings_host, self.args.metrics_port, "metrics"))
                self.metrics_port = self.args.metrics_port = int(reserved[-1].getsockname()[1])
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.signals)
            for index in range(self.count):
                self.start(index, copy_state=False)
            while not self.all_ready():
                dead = self.wait(_POLL)
                if self.signals.received:
                    return 0 if self.stop() else 1
                if dead:
                    log.error("worker %s exited while starting: stopping", ", ".join(map(str, dead)))
                    self.stop()
                    return 1
            self.write_ports_file(http, grpc)
            log.info("serving with %d workers (REST port %s, gRPC port %s)", self.count, http, grpc)
            self.serving(*range(self.count))
            self.prober.start()
            starting: set[int] = set()  # restarted, not yet listening: the ports file names them once they listen
            while not self.signals.received:
                for index in self.wait(_POLL):
                    if self.signals.received:
                        break
                    if not self.restart(index):
                        self.stop()
                        return 1
                    starting.add(index)
                if starting and all(self.ready_file(i).exists() for i in starting):
                    for index in sorted(starting):
                        log.info("worker %d (pid %s) is serving", index, self.workers[index].pid)
                    self.serving(*starting)
                    starting.clear()
                    self.write_ports_file(http, grpc)
                if not self.signals.received:
                    self.kill_stuck(starting)
            return 0 if self.stop() else 1
        finally:
            self.prober.stopping.set()
            for sock in reserved:
                sock.close()
            shutil.rmtree(self.folder, ignore_errors=True)


def supervise(args: argparse.Namespace, count: int, target: Target) -> int:
    """Run `count` workers, each running `target` with the options `args`, until a signal; the exit status."""
    try:
        return _Supervisor(args, count, target).run()
    except OSError as exc:
        log.error("%s", exc)
        return 1
