"""What every server process needs of the operating system, in one place: bound sockets, the ports file, the
signals that stop it (the first drains, a second exits at once), and room for many connections (`open_files`)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["Ports", "SignalLatch", "address", "bound_socket", "listening_socket", "open_files", "write_ports_file"]

# The most open files `open_files` asks for when the hard limit is unlimited (Linux refuses more than
# /proc/sys/fs/nr_open, 1,048,576 by default).
_MOST_FILES: Final = 1 << 20


@dataclass(frozen=True)
class Ports:
    """The ports the server listens on (None: that transport is off)."""

    http: int | None
    grpc: int | None
    metrics: int | None = None  # --metrics-port


def address(host: str, port: int) -> str:
    """`host:port` as it is written in a URL (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bound_socket(host: str, port: int, reuse_port: bool = False, what: str = "") -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: a free port), not yet listening. OSError naming `what` it is for
    ("REST"), the host and the port when it cannot be bound."""
    sock: socket.socket | None = None
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:  # one of several workers on this port: the kernel spreads connections over them
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise OSError(f"cannot listen{' for ' + what if what else ''} on {address(host, port)}: "
                      f"{exc.strerror or exc}") from None
    return sock


def listening_socket(host: str, port: int, reuse_port: bool = False, what: str = "") -> socket.socket:
    """`bound_socket`, listening, not inherited by child processes."""
    sock = bound_socket(host, port, reuse_port, what)
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def open_files() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files to its hard limit; (before, after), or None when it was there
    already or cannot be raised (no such limit here, or refused).

    Each connection is a file. The soft limit is often 1,024 (containerd 2 gives containers 1,024 against a hard
    limit of 524,288), and with it about a thousand clients' connections would take every one: further
    connections are dropped as soon as they arrive. The soft limit stays low for programs that use select(),
    whose sets hold descriptors below 1,024 only; this process waits with epoll (asyncio, uvloop, grpcio), so it
    takes what the hard limit allows, as Go's runtime does for every program. The hard limit stays the operator's
    bound."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        unlimited = resource.RLIM_INFINITY
        wanted = _MOST_FILES if hard == unlimited else hard
        if soft == unlimited or soft >= wanted:  # never lowered
            return None
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError):  # refused: the soft limit stays as it was
        return None
    return soft, wanted


def write_ports_file(path: Path, ports: Ports, workers: Sequence[int | None] | None = None) -> None:
    """`{"http": N, "grpc": M}` (and `"metrics"` when it listens, `"workers"`: their pids) to `path`, atomically."""
    doc: dict[str, Any] = {"http": ports.http, "grpc": ports.grpc}
    if ports.metrics:
        doc["metrics"] = ports.metrics
    if workers is not None:
        doc["workers"] = list(workers)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class SignalLatch:
    """What a process does on SIGTERM or SIGINT: the first asks it to stop (`first(name)`: drain, then stop); a
    second stops it at once (`last(name)`, then exit with 128 + the signal's number). Call it with the signal's
    number (and a frame, as `signal.signal` does)."""

    def __init__(self, first: Callable[[str], None], last: Callable[[str], None]) -> None:
        self.first = first
        self.last = last
        self.received: list[int] = []

    def __call__(self, sig: int, _frame: Any = None) -> None:
        self.received.append(sig)
        name = signal.Signals(sig).name
        if len(self.received) == 1:
            self.first(name)
            return
        self.last(name)
        logging.shutdown()
        os._exit(128 + sig)
