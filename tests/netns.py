"""Run a script in a private network, PID and mount namespace, as a pod or a cluster node has its own.

Inside, only a loopback interface exists (brought up here) and every port is free, so a command line can be run
exactly as written (`--host 0.0.0.0`, fixed ports) without touching the machine's network, and without clashing
with anything else running on it. The script's processes live in their own PID namespace: when its first process
ends, the kernel ends every process left in it, so nothing outlives the test.

`unshare` (util-linux) makes the namespaces as an unprivileged user (a user namespace maps them to root there).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

UNSHARE = (
    "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
)


def available() -> str | None:
    """None when namespaces can be made here; otherwise why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot make namespaces: {probe.stderr.strip()}"
    return None


def run(script: Path, *args: str, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python script args...` inside fresh namespaces; the JSON object it prints last is its report."""
    result = subprocess.run(
        [*UNSHARE, sys.executable, str(script), *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise AssertionError(
            f"{script.name} failed (exit {result.returncode})\nstdout:\n{result.stdout[-4000:]}\n"
            f"stderr:\n{result.stderr[-6000:]}"
        )
    report: dict[str, Any] = json.loads(lines[-1])
    report["stderr"] = result.stderr
    return report


# --- inside the namespaces --------------------------------------------------------------------------------


def loopback_up() -> None:
    """Bring up `lo` (down in a new network namespace); 127.0.0.0/8 is then all there is. (What `ip link set lo
    up` does, through the SIOCGIFFLAGS / SIOCSIFFLAGS ioctls.)"""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def other_processes() -> list[tuple[int, str]]:
    """Every process of this PID namespace but this one: (pid, command line)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append((int(entry.name), cmdline))
    return sorted(out)


def listening(port: int) -> list[str]:
    """The local addresses with a listening TCP socket on `port` (IPv4 and IPv6), like `ss -ltn`."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            rows = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, state = fields[1], fields[3]
            host, hex_port = address.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                found.append("0.0.0.0" if set(host) == {"0"} and width == 8 else ("::" if set(host) == {"0"} else host))
    return found
