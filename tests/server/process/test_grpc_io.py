"""grpcio's socket work done by the gRPC server's polling thread (`server/process/grpc_io.py`): what
`python -m oip serve` sets up before anything imports grpc, and that grpcio then does it. grpcio's own `tcp` trace
names the code that handled the server's sockets: iomgr's (tcp_posix.cc, tcp_server_posix.cc), which the polling
thread runs, or the EventEngine's (posix_endpoint.cc, posix_interface_posix.cc), which runs on threads of its own."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from serving import SERVER_PYTHON, build_repository, check_simple, server_env, start_server

TRACE = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp"}
IOMGR = ("tcp_posix.cc", "tcp_server_posix.cc")
EVENT_ENGINE = ("posix_endpoint.cc", "posix_interface_posix.cc")
TUNED = "grpc: the polling thread does the socket work"
UNMEASURED = "was not measured with the polling thread doing the socket work"


def _installed() -> tuple[str | None, bool]:
    """The grpcio version the servers run on (SERVER_PYTHON's), and whether the socket work was measured on it."""
    from oip.server.process.grpc_io import measured

    code = "from oip.server.process.grpc_io import grpcio_version; print(grpcio_version())"
    done = subprocess.run([str(SERVER_PYTHON), "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env=server_env())
    version = done.stdout.strip()
    return version, measured(version)


BARE_SERVER = """
import sys
from concurrent import futures

import grpc

echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Echo": echo}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
sys.stdin.readline()
server.stop(None)
"""


def _bare_grpcio_log(env: dict[str, str]) -> str:
    """grpcio's own log of a bare grpcio server (on SERVER_PYTHON, under `env`) that answered one call."""
    with subprocess.Popen([str(SERVER_PYTHON), "-c", BARE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, **env}) as bare:
        try:
            assert bare.stdout is not None and bare.stdin is not None
            port = int(bare.stdout.readline())
            import grpc

            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert channel.unary_unary("/t.T/Echo")(b"ping", timeout=30) == b"ping"
            _, log = bare.communicate("\n", timeout=60)
        finally:
            bare.kill()
    assert bare.returncode == 0, log[-3000:]
    return log


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("models"), only=("simple",))


def _serve_and_log(repository: Path, workdir: Path, env: dict[str, str]) -> str:
    """The log of a server that answered `simple` over both transports under `env`, then stopped cleanly."""
    server = start_server(repository, workdir, "--log-level", "debug", env=env, ready=("simple",))
    try:
        with server.clients() as (http, stub):
            check_simple(http, stub)
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    return server.log_text()


def test_the_polling_thread_does_the_socket_work(repository: Path, tmp_path: Path) -> None:
    version, known = _installed()
    if not known:  # the server keeps grpcio's defaults there, and says so (the test after this one)
        pytest.skip(f"grpcio {version} is not among the versions the socket work was measured on (grpc_io.MEASURED)")
    log = _serve_and_log(repository, tmp_path, TRACE)
    assert all(name in log for name in IOMGR), log[-3000:]
    assert not any(name in log for name in EVENT_ENGINE), log[-3000:]
    assert TUNED in log
    assert UNMEASURED not in log


def test_an_unmeasured_grpcio_keeps_its_defaults(repository: Path, tmp_path: Path) -> None:
    """On a grpcio version not measured (here the installed one, reported as 1.75.1 to the server's process), the
    server sets nothing, answers as ever, and its log says why the polling thread does not do the socket work."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import importlib.metadata as metadata

        _version = metadata.version
        metadata.version = lambda name: "1.75.1" if name == "grpcio" else _version(name)
    """))
    path = os.pathsep.join([str(site), server_env()["PYTHONPATH"]])
    log = _serve_and_log(repository, tmp_path / "server", {"PYTHONPATH": path})
    assert f"grpcio 1.75.1 {UNMEASURED}" in log and "grpcio's own defaults are kept" in log
    assert TUNED not in log


def test_an_operators_grpc_experiments_win(repository: Path, tmp_path: Path) -> None:
    """GRPC_EXPERIMENTS of the environment, even empty, is left as it is: the server's sockets are handled by the
    code that handles a bare grpcio server's under the same environment (grpcio's default, which versions change)."""
    env = {**TRACE, "GRPC_EXPERIMENTS": ""}
    log = _serve_and_log(repository, tmp_path, env)
    bare = _bare_grpcio_log(env)
    for names in (IOMGR, EVENT_ENGINE):
        assert any(name in log for name in names) == any(name in bare for name in names), (names, log[-3000:])
    assert any(name in log for name in IOMGR + EVENT_ENGINE), log[-3000:]
    assert TUNED not in log
    assert UNMEASURED not in log  # the operator's own choice: nothing to explain


def _tune(prelude: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """`tune_grpc_io()` in a fresh interpreter after `prelude`: what it returned, and GRPC_EXPERIMENTS after it."""
    code = textwrap.dedent(prelude) + textwrap.dedent("""
        import os
        from oip.server.process.grpc_io import tune_grpc_io
        print(tune_grpc_io(), os.environ.get("GRPC_EXPERIMENTS", "<unset>"))
    """)
    base = {k: v for k, v in server_env().items() if k != "GRPC_EXPERIMENTS"}
    done = subprocess.run([str(SERVER_PYTHON), "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={**base, **(env or {})})
    returned, _, experiments = done.stdout.strip().partition(" ")
    return returned, experiments


def test_tune_sets_the_experiments_only_where_it_can_take_effect() -> None:
    from oip.server.process.grpc_io import GRPC_EXPERIMENTS

    _, known = _installed()
    assert _tune("") == (("True", GRPC_EXPERIMENTS) if known else ("False", "<unset>"))
    assert _tune("import grpc") == ("False", "<unset>")  # grpcio has read its settings already
    assert _tune("", {"GRPC_EXPERIMENTS": "-some_experiment"}) == ("False", "-some_experiment")
    for version in ("1.75.1", "1.86.0", "2.0.0", "unknown"):  # versions it was not measured on
        prelude = f"import importlib.metadata as m; m.version = lambda name: {version!r}"
        assert _tune(prelude) == ("False", "<unset>"), version
    assert _tune("import importlib.metadata as m; m.version = lambda name: '1.76.0'") == ("True", GRPC_EXPERIMENTS)


@pytest.mark.parametrize(("version", "expected"), [
    ("1.76.0", True), ("1.85.4", True), ("1.86.0rc1", False), ("1.86.0", False), ("1.75.1", False),
    ("2.0.0", False), ("1", False), ("unknown", False), ("", False), (None, False),
])
def test_the_measured_versions(version: str | None, expected: bool) -> None:
    from oip.server.process.grpc_io import measured

    assert measured(version) is expected
