"""The package as a distribution, and each of its parts alone.

- `generated/pyproject.toml` (target `dist`) makes `generated/` installable with extras per part; its wheel is the
  same bytes twice and holds `py.typed`.
- Each part runs in a venv holding that part's extra and nothing else: the REST client without grpcio, protobuf
  or FastAPI; the gRPC client and the converters without httpx or FastAPI; the server from its extra. The clients
  run at the newest versions and at the declared floor of every requirement they have (protobuf's and grpcio's the
  stubs' own: not below them); the server's floors must install together, and its own tests of what meets its
  dependencies run again with the server at them.
- Our `rest` and `grpc` parts beside tritonclient[all], MLServer 1.7.1 and KServe 0.21 in one venv each, theirs
  imported first, against the generated server.

The venvs are cached under .cache/venvs (tests/venvs.py), keyed by their requirements, and built three at a time;
the package's own wheel is reinstalled into them on each run. Measured on a shared 2-core machine (load ~10), with
pip's download cache warm, this module and test_install.py together: about 13 minutes with no venv cached (before
the venvs were built in parallel), about 3 minutes with them cached. Each install is bounded (tests/venvs.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import GENERATED, ROOT
from serving import Server, build_repository, running
from venvs import cached_venv, installed, pip, python, run

from oipgen.targets import REQUIREMENTS

PYPROJECT = GENERATED / "pyproject.toml"
SOURCE_DATE_EPOCH = "1700000000"


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def floor(name: str) -> str:
    """The lowest version REQUIREMENTS declares for `name`."""
    for reqs in REQUIREMENTS.values():
        for r in reqs:
            if _name(r) == name:
                found = re.search(r">=([\w.]+)", r)
                assert found, r
                return found.group(1)
    raise KeyError(name)


def at_the_floors(*parts: str) -> list[str]:
    """Every requirement of `parts` pinned to the lowest version it declares (extras kept)."""
    pinned = set()
    for part in parts:
        for requirement in REQUIREMENTS[part]:
            pinned.add(re.split(r"[<>=!~; ]", requirement, maxsplit=1)[0] + "==" + floor(_name(requirement)))
    return sorted(pinned)


def extra(name: str) -> list[str]:
    """What `pip install "./generated[name]"` asks for: the base requirements and the extra's."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return sorted({*project["dependencies"], *project["optional-dependencies"][name]})


def build_wheel(source: Path, out: Path, **env: str) -> Path:
    """A wheel of the distribution in `source` (hatchling, as pip would build it), written into `out`."""
    copy = out / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom hatchling.build import build_wheel\nprint(build_wheel(sys.argv[1]))",
         str(out)], cwd=copy, capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", **env})
    assert result.returncode == 0, result.stderr
    return out / result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(GENERATED, tmp_path_factory.mktemp("wheel"), SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of generated/ (the distribution) for pip to install from."""
    copy = tmp_path_factory.mktemp("dist-source") / "generated"
    shutil.copytree(GENERATED, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def venv_specs(source: Path) -> dict[str, tuple[list[str], list[str] | None]]:
    """Every venv of this module: name -> (its requirements, the key; what pip installs, if not those). The
    parts' venvs are built by `pip install "./generated[PART]"` (by path)."""
    ours = sorted({*extra("rest"), *extra("grpc")})
    return {
        "dist-rest": (extra("rest"), [f"{source}[rest]"]),
        "dist-rest-floors": (at_the_floors("core", "rest"), None),
        "dist-grpc": (extra("grpc"), [f"{source}[grpc]"]),
        "dist-grpc-floors": (at_the_floors("core", "grpc"), None),
        "dist-server": (extra("server"), [f"{source}[server]"]),
        "dist-server-floors": (at_the_floors("core", "grpc", "server"), None),
        "below-floors": ([*REQUIREMENTS["core"], "protobuf==6.30.2", "grpcio==1.75.1"], None),
        **{f"beside-{theirs}": ([*install, *ours], None) for theirs, (install, _) in THEIRS.items()},
    }


@pytest.fixture(scope="module", autouse=True)
def prefetch(source: Path) -> Iterator[None]:
    """Build the module's venvs three at a time in the background (each test waits for its own, by its lock):
    installing is mostly waiting on the network and the disk."""
    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="venv")
    for name, (requirements, install) in venv_specs(source).items():
        pool.submit(cached_venv, name, requirements, install=install)  # a failure is the test's to report
    yield
    pool.shutdown(wait=True, cancel_futures=True)


def venv_for(name: str, source: Path, wheel: Path) -> Path:
    """The venv `name` of `venv_specs`, cached or built now, with this run's wheel of the package installed."""
    requirements, install = venv_specs(source)[name]
    venv = cached_venv(name, requirements, install=install)
    pip(venv, "--no-deps", "--force-reinstall", str(wheel))
    return venv


# --- the distribution ---------------------------------------------------------------------------------------------


def test_pyproject_extras_are_the_parts() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "oip" and project["version"] == "2.0"  # defaults: the package, the spec's version
    assert sorted(project["dependencies"]) == sorted(REQUIREMENTS["core"])
    extras = project["optional-dependencies"]
    assert set(extras) == {"rest", "grpc", "server", "all"}
    assert set(extras["rest"]) == set(REQUIREMENTS["rest"])
    assert set(extras["grpc"]) == set(REQUIREMENTS["grpc"])
    assert set(extras["server"]) == {*REQUIREMENTS["grpc"], *REQUIREMENTS["server"]}
    assert set(extras["all"]) == {r for part in ("rest", "grpc", "server") for r in REQUIREMENTS[part]}
    manifest = json.loads((GENERATED / "oip" / "_oipgen_manifest.json").read_text())
    assert manifest["parts"] == {part: sorted({*REQUIREMENTS["core"], *extras[part]})
                                 for part in ("rest", "grpc", "server")} | {"core": sorted(REQUIREMENTS["core"])}


def test_the_wheel_is_reproducible_and_typed(wheel: Path, tmp_path: Path) -> None:
    again = build_wheel(GENERATED, tmp_path / "again", SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
    assert again.name == wheel.name == "oip-2.0-py3-none-any.whl"
    assert again.read_bytes() == wheel.read_bytes()
    without = build_wheel(GENERATED, tmp_path / "without")  # hatchling's fixed default timestamp
    assert without.read_bytes() == build_wheel(GENERATED, tmp_path / "without-again").read_bytes()
    names = zipfile.ZipFile(wheel).namelist()
    assert "oip/py.typed" in names and "oip/grpc/grpc_service_pb2.pyi" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    on_disk = sorted(p.relative_to(GENERATED).as_posix() for p in (GENERATED / "oip").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert sorted(n for n in names if n.startswith("oip/")) == on_disk


def test_name_and_version_come_from_tool_oipgen(tmp_path: Path) -> None:
    from conftest import oipgen

    (tmp_path / "pyproject.toml").write_text(
        '[tool.oipgen]\nout = "vendor"\npackage = "acme_oip"\ndist_name = "acme-oip"\ndist_version = "1.2.3"\n'
        'targets = ["models", "client", "dist"]\n')
    result = oipgen("build", "--spec", str(ROOT / "spec"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    project = tomllib.loads((tmp_path / "vendor" / "pyproject.toml").read_text())["project"]
    assert (project["name"], project["version"]) == ("acme-oip", "1.2.3")
    assert set(project["optional-dependencies"]) == {"rest", "grpc", "all"}  # no server built
    built = build_wheel(tmp_path / "vendor", tmp_path / "wheel")
    assert built.name == "acme_oip-1.2.3-py3-none-any.whl"
    assert "acme_oip/client/rest.py" in zipfile.ZipFile(built).namelist()
    (tmp_path / "pyproject.toml").write_text('[tool.oipgen]\nout = "vendor"\ndist_version = "not a version"\n')
    result = oipgen("build", "--spec", str(ROOT / "spec"), cwd=tmp_path)
    assert result.returncode == 2 and "dist_version 'not a version' is not a valid version" in result.stderr


def test_a_foreign_pyproject_is_never_overwritten(tmp_path: Path) -> None:
    from conftest import oipgen

    mine = '[project]\nname = "mine"\n'
    (tmp_path / "pyproject.toml").write_text(mine)
    result = oipgen("build", "--spec", str(ROOT / "spec"), "--out", ".", "--package", "p", cwd=tmp_path)
    assert result.returncode == 1 and "was not written by oipgen; nothing was written" in result.stderr
    assert (tmp_path / "pyproject.toml").read_text() == mine and not (tmp_path / "p").exists()
    result = oipgen("build", "--spec", str(ROOT / "spec"), "--out", ".", "--package", "p", "--target", "models",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # without `dist`, the folder's own pyproject.toml is left alone
    assert (tmp_path / "pyproject.toml").read_text() == mine


# --- each part alone ----------------------------------------------------------------------------------------------

GRPC_STACK = {"grpcio", "protobuf"}
SERVER_STACK = {"fastapi", "starlette", "uvicorn"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("dist-server")
    with running(build_repository(root / "models", only=("simple",)), root, ready=["simple"]) as server:
        yield server


# Run in a venv: both clients asked for must work, against the server at URL / TARGET; the modules a part must not
# import are checked after all of it ran.
CLIENTS = """
import os, sys
import numpy as np
from oip import bodies, codec, datatypes, models
from oip.client import NotFound

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)
for kind in os.environ["CLIENTS"].split(","):
    if kind == "rest":
        from oip.client import RestClient
        client = RestClient(os.environ["URL"], trust_env=False)
    else:
        from oip.client import GrpcClient
        client = GrpcClient(os.environ["TARGET"])
    with client:
        result = client.infer("simple", {"INPUT0": A, "INPUT1": B})
        assert (result.as_numpy("OUTPUT0") == A + B).all() and (result.as_numpy("OUTPUT1") == A - B).all()
        assert [t.name for t in client.model_metadata("simple").inputs] == ["INPUT0", "INPUT1"]
        config = client.model_config("simple")
        assert config.name == "simple" and config.max_batch_size == 0  # completed with its defaults
        statistics = client.model_statistics("simple")
        assert statistics.model_stats[0].inference_stats.success.count >= 1
        try:
            client.model_metadata("nope")
            raise AssertionError("expected NotFound")
        except NotFound as e:
            assert (e.status == 404) if kind == "rest" else (e.code.name == "NOT_FOUND"), e
if os.environ.get("CONVERT"):
    from oip import convert
    from oip.grpc import grpc_service_pb2 as pb
    request = models.InferenceRequest.model_validate(
        {"id": "1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}]})
    message = convert.inference_request_to_proto(request, raw=True, model_name="identity_fp32")
    again = pb.ModelInferRequest.FromString(message.SerializeToString())
    assert codec.from_raw(again.raw_input_contents[0], "FP32", [2]).tolist() == [1.5, 2.5]
    body = convert.proto_to_rest("InferenceRequest", convert.rest_to_proto("InferenceRequest", request.model_dump(
        mode="json", exclude_none=True)))
    assert body["inputs"][0]["data"] == [1.5, 2.5] and body["id"] == "1"
absent = [m for m in os.environ.get("ABSENT", "").split(",") if m]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in absent)
assert not loaded, f"imported: {loaded}"
import google.protobuf, grpc
print(google.protobuf.__version__, grpc.__version__) if os.environ.get("CONVERT") else print("ok")
"""


def assert_at_the_floors(venv: Path, *parts: str) -> None:
    """Every requirement of `parts` is installed in `venv` at its declared floor."""
    from packaging.version import Version

    have = installed(venv)
    for pinned in at_the_floors(*parts):
        name, version = pinned.split("==")
        assert Version(have[_name(name)]) == Version(version), (name, have[_name(name)], version)


@pytest.mark.parametrize("versions", ["newest", "floors"])
def test_rest_part_alone(versions: str, wheel: Path, source: Path, server: Server) -> None:
    venv = venv_for("dist-rest" if versions == "newest" else "dist-rest-floors", source, wheel)
    if versions == "floors":
        assert_at_the_floors(venv, "core", "rest")
    have = installed(venv)
    assert "oip" in have and "httpx" in have
    assert not (GRPC_STACK | SERVER_STACK) & set(have), sorted(have)
    code = CLIENTS.replace("import google.protobuf, grpc\n", "")
    run(venv, code, env={"CLIENTS": "rest", "URL": server.url, "ABSENT": "grpc,google,fastapi,starlette,uvicorn"})
    result = subprocess.run([str(python(venv)), "-c", "from oip.client import GrpcClient"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "GrpcClient needs" in result.stderr and "`grpc` extra" in result.stderr


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _grpc_part(venv: Path, server: Server) -> tuple[str, str]:
    have = installed(venv)
    assert "oip" in have and not ({"httpx"} | SERVER_STACK) & set(have), sorted(have)
    result = run(venv, CLIENTS, env={"CLIENTS": "grpc", "TARGET": server.target, "CONVERT": "1",
                                     "ABSENT": "httpx,fastapi,starlette,uvicorn"})
    protobuf, grpcio = result.stdout.split()
    assert (protobuf, grpcio) == (have["protobuf"], have["grpcio"])
    assert "warn" not in result.stderr.lower(), result.stderr  # no gencode/runtime warning either
    return protobuf, grpcio


def test_grpc_part_alone_at_the_newest_versions(wheel: Path, source: Path, server: Server) -> None:
    protobuf, grpcio = _grpc_part(venv_for("dist-grpc", source, wheel), server)
    assert _version(protobuf) >= (7, 0), protobuf  # the newest major that <8 allows
    assert _version(grpcio) > _version(floor("grpcio")), grpcio


def test_grpc_part_alone_at_the_declared_floors(wheel: Path, source: Path, server: Server) -> None:
    venv = venv_for("dist-grpc-floors", source, wheel)
    assert_at_the_floors(venv, "core", "grpc")
    protobuf, grpcio = _grpc_part(venv, server)
    assert (protobuf, grpcio) == (floor("protobuf"), floor("grpcio"))


def test_below_the_floors_the_stubs_refuse_to_load(wheel: Path, source: Path) -> None:
    """The floors are the stubs' own: one release below either one, the generated code refuses to import."""
    venv = venv_for("below-floors", source, wheel)
    result = subprocess.run([str(python(venv)), "-c", "import oip.grpc.grpc_service_pb2"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "gencode 6.31.1 runtime 6.30.2" in result.stderr, result.stderr
    result = subprocess.run([str(python(venv)), "-c", "import oip.grpc.grpc_service_pb2_grpc"], capture_output=True,
                            text=True, timeout=120, env={"TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK": "true"})
    assert result.returncode == 1 and "depends on grpcio>=1.76.0" in result.stderr, result.stderr
    assert floor("protobuf") == "6.31.1" and floor("grpcio") == "1.76.0"


def test_server_part_alone(wheel: Path, source: Path, tmp_path: Path) -> None:
    venv = venv_for("dist-server", source, wheel)
    assert "httpx" in installed(venv)  # the conformance suite's
    empty = tmp_path / "nothing"
    empty.mkdir()
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, package_dir=empty, ready=["simple"], python=python(venv)) as served, \
            served.http_client() as http:
        body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                           for n in ("INPUT0", "INPUT1")]}
        reply = http.post("/v2/models/simple/infer", json=body)
        assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2 * i for i in range(16)]


# The server's own tests of what meets its dependencies the most (the HTTP layer on uvicorn's protocol and
# httptools, FastAPI and Starlette, grpcio, prometheus_client, the OpenTelemetry exporters), about 70 s.
AT_THE_FLOORS = (
    "tests/server/test_server.py",
    "tests/server/test_bad_input.py",
    "tests/server/rest/test_direct.py",
    "tests/server/rest/test_generate.py",
    "tests/server/grpc/test_grpc_unary.py",
    "tests/server/observe/test_served_metrics.py",
    "tests/server/process/test_grpc_io.py",
    "tests/server/observe/test_tracing.py::test_traces_join_the_callers_trace",
    "tests/server/observe/test_tracing.py::test_a_collector_that_is_down_holds_neither_the_requests_nor_the_stop",
    "tests/server/observe/test_tracing.py::test_invalid_trace_contexts_log_no_client_text",
)


def test_the_server_at_its_declared_floors(wheel: Path, source: Path) -> None:
    """The lowest version of every requirement the server declares (its part and the parts it builds on) installs
    with the others', and the server's own tests of what meets those dependencies pass with the server at them
    (`OIP_SERVER_PYTHON`: the servers the tests start run on that venv's python)."""
    venv = venv_for("dist-server-floors", source, wheel)
    assert_at_the_floors(venv, "core", "grpc", "server")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *AT_THE_FLOORS], cwd=ROOT,
        capture_output=True, text=True, timeout=900, env={**os.environ, "OIP_SERVER_PYTHON": str(python(venv))})
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]


# --- beside the clients people already have --------------------------------------------------------------------

# theirs: what to install, and what to import (first) and call in the same process
THEIRS = {
    "tritonclient": (["tritonclient[all]"], """
        import tritonclient.grpc as triton_grpc, tritonclient.http as triton_http
        from tritonclient.grpc import service_pb2
        assert triton_grpc.InferenceServerClient(os.environ["TARGET"]).is_server_live()
        assert triton_http.InferenceServerClient(os.environ["URL"][len("http://"):]).is_server_live()
    """),
    "mlserver": (["mlserver==1.7.1"], """
        import mlserver, mlserver.codecs
        from mlserver.grpc import dataplane_pb2 as service_pb2
    """),
    "kserve": (["kserve==0.21.0"], """
        import kserve
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as service_pb2
    """),
}


@pytest.mark.parametrize("theirs", list(THEIRS))
def test_beside_theirs(theirs: str, wheel: Path, source: Path, server: Server) -> None:
    _, use = THEIRS[theirs]
    venv = venv_for(f"beside-{theirs}", source, wheel)
    first = "import os\n" + textwrap.dedent(use) + textwrap.dedent("""
        assert service_pb2.DESCRIPTOR.pool is not None and "inference.ModelInferRequest" in str(
            service_pb2.ModelInferRequest.DESCRIPTOR.full_name)
    """)
    result = run(venv, first + CLIENTS, env={"CLIENTS": "rest,grpc", "URL": server.url, "TARGET": server.target,
                                             "CONVERT": "1"})
    protobuf, grpcio = result.stdout.split()[-2:]
    have = installed(venv)
    assert (protobuf, grpcio) == (have["protobuf"], have["grpcio"])
