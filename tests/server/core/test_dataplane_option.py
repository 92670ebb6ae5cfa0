"""A data plane of one's own: `python -m <package> serve --dataplane MODULE:CLASS`, and `serve(..., dataplane=)`.

The `grpc_only_added` spec (tests/specs) adds a gRPC-only RPC, `WhoAmI`, built here into a folder of its own (its
`oip` first on PYTHONPATH, for the server and the client alike): the generated server answers it UNIMPLEMENTED
until a subclass of `DataPlane` implements `who_am_i`; served with `--dataplane`, the generated client's
`who_am_i` reaches the subclass on every worker, and REST reaches it too (the subclass changes server metadata).
A bad `--dataplane` is one line and exit 2, whatever the module does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import variants
from serving import Server, build_repository, running, server_env, start_server

WORKERS = 2
CONNECTIONS = 30  # new connections: with two workers, both are all but certain to get some

PLANE = '''
import os

from oip.grpc import grpc_service_pb2 as pb
from oip.server import DataPlane


class WhoAmIPlane(DataPlane):
    """Implements the spec's WhoAmI, and names itself in server metadata."""

    async def who_am_i(self, request: pb.WhoAmIRequest) -> pb.WhoAmIResponse:
        return pb.WhoAmIResponse(pid=os.getpid(), plane=type(self).__name__)

    async def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        answer = await super().server_metadata(request)
        answer.name = f"{answer.name} by {type(self).__name__} in {os.getpid()}"
        return answer
'''


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the grpc_only_added spec's package `oip`."""
    return variants.build("grpc_only_added", tmp_path_factory.mktemp("variant")).parent


ASK = """
import json
import sys

from oip.client import GrpcClient
from oip.grpc import grpc_service_pb2 as pb

seen = {}
for _ in range(int(sys.argv[2])):  # a client each: a connection each
    with GrpcClient(sys.argv[1]) as client:
        answer = client.who_am_i(pb.WhoAmIRequest(), timeout=30)
    seen[answer.pid] = answer.plane
print(json.dumps(seen))
"""


def who_answers(server: Server, variant: Path, count: int = CONNECTIONS) -> dict[int, str]:
    """Ask WhoAmI with the variant's generated gRPC client over `count` new connections: pid -> data plane class
    (an error of the call fails the test with its output)."""
    result = subprocess.run([sys.executable, "-c", ASK, server.target, str(count)], env=server_env(variant),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return {int(pid): plane for pid, plane in json.loads(result.stdout).items()}


def worker_pids(server: Server) -> set[int]:
    return set(json.loads((server.log.parent / "ports.json").read_text())["workers"])


def test_a_grpc_only_rpc_is_served_by_the_subclass_on_every_worker_and_transport(variant: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plane.py").write_text(textwrap.dedent(PLANE))  # imported from the server's folder (sys.path)
    repository = build_repository(tmp_path / "models", only=())
    with running(repository, run, "--dataplane", "plane:WhoAmIPlane", "--workers", str(WORKERS),
                 package_dir=variant) as server:
        pids = worker_pids(server)
        assert who_answers(server, variant) == dict.fromkeys(pids, "WhoAmIPlane")
        names = set()
        for _ in range(CONNECTIONS):
            with server.http_client() as http:
                names.add(http.get("/v2").json()["name"])
        assert names == {f"oip by WhoAmIPlane in {pid}" for pid in pids}, names


def test_without_the_subclass_the_rpc_is_unimplemented(variant: Path, tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=())
    with running(repository, tmp_path, package_dir=variant) as server:
        result = subprocess.run([sys.executable, "-c", ASK, server.target, "1"], env=server_env(variant),
                                capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "WhoAmI is not implemented by this server" in result.stderr, result.stderr


def test_a_python_file_names_the_data_plane_and_may_import_its_neighbours(variant: Path, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "naming.py").write_text('NAME = "from the neighbour"\n')
    (plugins / "plane.py").write_text(textwrap.dedent('''
        from oip.grpc import grpc_service_pb2 as pb
        from oip.server import DataPlane
        from naming import NAME


        class Plane(DataPlane):
            async def who_am_i(self, request):
                return pb.WhoAmIResponse(pid=0, plane=NAME)
    '''))
    repository = build_repository(tmp_path / "models", only=())
    server = start_server(repository, tmp_path / "run", "--dataplane", f"{plugins / 'plane.py'}:Plane",
                          package_dir=variant)
    try:
        assert who_answers(server, variant, count=1) == {0: "from the neighbour"}
    finally:
        assert server.stop() == 0, server.log_text()


def test_serve_takes_the_data_plane_class_from_python(tmp_path: Path) -> None:
    """`serve(settings, repository, dataplane=...)`: the subclass answers over both transports."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    script = textwrap.dedent(f"""
        import asyncio
        import json
        import urllib.request

        import grpc
        from oip.grpc import grpc_service_pb2 as pb
        from oip.grpc import grpc_service_pb2_grpc as pb_grpc
        from oip.server import DataPlane, ModelRepository, Settings, serve


        class Plane(DataPlane):
            async def server_metadata(self, request):
                answer = await super().server_metadata(request)
                answer.name = "made in python"
                return answer


        def ask(ports):
            with urllib.request.urlopen(f"http://127.0.0.1:{{ports.http}}/v2", timeout=30) as answer:
                rest = json.load(answer)["name"]
            with grpc.insecure_channel(f"127.0.0.1:{{ports.grpc}}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                return rest, stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=30).name


        async def main():
            started, stop = asyncio.get_running_loop().create_future(), asyncio.Event()
            settings = Settings(http_port=0, grpc_port=0)
            task = asyncio.create_task(serve(settings, ModelRepository({str(repository)!r}), dataplane=Plane,
                                             started=started, stop=stop))
            ports = await started
            print(json.dumps(await asyncio.to_thread(ask, ports)))
            stop.set()
            await task


        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", script], env=server_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["made in python", "made in python"]


# --- a bad --dataplane: one line, exit 2 ---------------------------------------------------------------------

MODULES = {
    "raising.py": "raise RuntimeError('cannot start:\\n  the second line of a long story')\n",
    "exiting.py": "import sys\nsys.exit(3)\n",
    "syntax.py": "class Plane(:\n",
    "badinit.py": textwrap.dedent('''
        from oip.server import DataPlane


        class Plane(DataPlane):
            def __init__(self, *args, **kwargs):
                raise TypeError("this data plane takes other arguments")
    '''),
}


@pytest.mark.parametrize(("value", "words"), [
    ("plane", "--dataplane takes MODULE:CLASS"),
    ("plane:", "--dataplane takes MODULE:CLASS"),
    (":Plane", "--dataplane takes MODULE:CLASS"),
    ("plane:Plane; rm -rf /", "--dataplane takes MODULE:CLASS"),
    ("../../etc/passwd:Plane", "--dataplane takes MODULE:CLASS"),
    ("nosuchmodule_at_all:Plane", "cannot import 'nosuchmodule_at_all': ModuleNotFoundError"),
    ("json:NoSuchClass", "'json' has no 'NoSuchClass'"),
    ("os:path", "names something other than a subclass of DataPlane as 'path'"),
    ("json:JSONDecoder", "names something other than a subclass of DataPlane as 'JSONDecoder'"),
    ("raising:Plane", "cannot import 'raising': RuntimeError: cannot start: the second line of a long story"),
    ("exiting:Plane", "cannot import 'exiting': SystemExit: 3"),
    ("syntax:Plane", "cannot import 'syntax': SyntaxError"),
    ("./missing.py:Plane", "no python file './missing.py'"),
    ("badinit:Plane", "cannot make the data plane Plane: TypeError: this data plane takes other arguments"),
    ("x" * 10000 + ":Plane", "cannot import 'xxxx"),
])
def test_a_bad_dataplane_is_one_line_and_exit_2(tmp_path: Path, value: str, words: str) -> None:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    repository = build_repository(tmp_path / "models", only=())
    result = subprocess.run(
        [sys.executable, "-m", "oip", "serve", "--model-repository", str(repository), "--http-port", "0",
         "--grpc-port", "0", "--dataplane", value],
        cwd=tmp_path, env=server_env(), capture_output=True, text=True, timeout=120,
    )
    lines: list[Any] = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert len(lines[0]) < 1000, len(lines[0])


def test_a_bad_dataplane_stops_every_worker_before_any_starts(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=())
    result = subprocess.run(
        [sys.executable, "-m", "oip", "serve", "--model-repository", str(repository), "--http-port", "0",
         "--grpc-port", "0", "--workers", str(WORKERS), "--dataplane", "json:JSONDecoder"],
        cwd=tmp_path, env=server_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "worker" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

