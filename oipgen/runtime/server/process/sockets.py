"""What every server process needs of the operating system, in one place: bound sockets, the ports file, and
the signals that stop it (the first drains, a second exits at once)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Ports", "SignalLatch", "address", "bound_socket", "listening_socket", "write_ports_file"]


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
