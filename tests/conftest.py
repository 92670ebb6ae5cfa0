"""Shared fixtures. The generated package `oip` is imported from generated/, as a vendored copy would be."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec"
GENERATED = ROOT / "generated"
BIN = Path(sys.executable).parent

TESTS = ROOT / "tests"  # the helper modules (serving, venvs, netns...) and the data; the tests are in folders
SPECS = TESTS / "specs"  # the extra specs (variants.py) and their goldens

for _path in (GENERATED, SPECS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def oipgen(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `oipgen` command as a user would."""
    return subprocess.run(
        [str(BIN / "oipgen"), *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[Any]:
    """An httpx client of the module's `server` (a `serving.Server`)."""
    with server.http_client() as client:
        yield client


@pytest.fixture(scope="module")
def stub(server: Any) -> Iterator[Any]:
    """A gRPC stub (the generated package's) on the module's `server`."""
    from oip.grpc import grpc_service_pb2_grpc

    with server.channel() as channel:
        yield grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def triton_http(server: Any) -> Iterator[Any]:
    """tritonclient's HTTP client on the module's `server`."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.http_port}", network_timeout=30.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def triton_grpc(server: Any) -> Iterator[Any]:
    """tritonclient's gRPC client on the module's `server`."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.target)
    yield client
    client.close()


@pytest.fixture(scope="session")
def api():  # type: ignore[no-untyped-def]
    from oipgen.load import load_spec

    return load_spec(SPEC)
