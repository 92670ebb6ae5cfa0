"""Room for many connections (`oip.server.process.sockets.open_files`): `python -m oip serve` started under a soft
limit of open files far below its hard limit (as containerd 2 starts containers: 1,024 against 524,288) raises the
soft limit to the hard one, and so holds more connections than the soft limit it was given and still answers new
clients over both transports.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving import TIMEOUT, build_repository, running

SOFT, HARD = 256, 4096
HELD = 400  # connections held open at once: more than SOFT


def limited_python(folder: Path) -> Path:
    """A python that runs with the open files' soft limit at SOFT and the hard one at HARD."""
    script = folder / "limited-python"
    script.write_text(f"#!{sys.executable}\n"
                      "import os, resource, sys\n"
                      f"resource.setrlimit(resource.RLIMIT_NOFILE, ({SOFT}, {HARD}))\n"
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def open_files_limits(pid: int) -> tuple[int, int]:
    """The process's soft and hard limits of open files, as the kernel has them."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files limit")


def test_the_server_raises_its_soft_limit_and_serves_past_the_one_it_was_given(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=("simple",))
    python = limited_python(tmp_path)
    with running(repository, tmp_path / "run", ready=["simple"], python=python) as server:
        assert open_files_limits(server.process.pid) == (HARD, HARD)
        held: list[socket.socket] = []
        try:
            for port in (server.http_port, server.grpc_port):
                for _ in range(HELD // 2):
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT))
            with server.http_client() as http:
                assert http.get("/v2/health/ready").status_code == 200
                answer = http.post("/v2/models/simple/infer", json={"inputs": [
                    {"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                    for i in (0, 1)]})
                assert answer.status_code == 200, answer.text
            with server.channel() as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert len(os.listdir(f"/proc/{server.process.pid}/fd")) > HELD  # the server holds them all
        finally:
            for sock in held:
                sock.close()
