"""Generation beyond the one spec: the small extra specs of tests/specs (one RPC added, one extension removed, the
proto package renamed) build to exactly their goldens, and what they generate works.

Each variant is built once for the module (a few seconds each); the renamed package's server runs for one test
(loopback, ephemeral ports, stopped by PID). About 40 s in all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import variants
from serving import assert_error_body, build_repository, running, server_env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every variant, built into its own folder: name -> the package directory (`oip`)."""
    yield {name: variants.build(name, tmp_path_factory.mktemp(name)) for name in variants.VARIANTS}


@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_variant_equals_its_golden(built: dict[str, Path], name: str) -> None:
    """The build differs from generated/oip by exactly the committed diff (`make goldens` refreshes it)."""
    actual = variants.diff(variants.files(variants.GENERATED), variants.files(built[name]))
    golden = variants.golden_path(name).read_text(encoding="utf-8")
    assert actual, f"the {name} variant generates nothing different from the main spec"
    assert actual == golden, f"{variants.golden_path(name)} is stale: refresh it with `make goldens` and review"


def _python(package_dir: Path, code: str) -> Any:
    result = subprocess.run([sys.executable, "-c", code], env=server_env(package_dir.parent), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_extension_removed_is_gone_everywhere(built: dict[str, Path]) -> None:
    facts = _python(built["extension_removed"], """
import json
from oip import extensions
from oip.client import GrpcClient, RestClient
from oip.server import DataPlane, ModelRepository
from oip.server.rest import ENDPOINTS
print(json.dumps({
    "extensions": list(extensions.EXTENSIONS),
    "owned": sorted(set(extensions.OPERATIONS.values())),
    "routes": [e.path for e in ENDPOINTS if "cuda" in e.path],
    "client": [n for n in dir(RestClient) + dir(GrpcClient) if "cuda" in n],
    "served": DataPlane(ModelRepository()).extensions,
}))
""")
    assert "cuda_shared_memory" not in facts["extensions"] and "system_shared_memory" in facts["extensions"]
    assert "cuda_shared_memory" not in facts["owned"]
    assert facts["routes"] == [] and facts["client"] == []
    assert "cuda_shared_memory" not in facts["served"] and "model_repository" in facts["served"]


def test_an_rpc_added_is_planned(built: dict[str, Path]) -> None:
    facts = _python(built["rpc_added"], """
import json
from oip.client import RestClient
from oip.server.core.dataplane_base import DataPlaneBase
from oip.server.rest import ENDPOINTS
print(json.dumps({
    "base": hasattr(DataPlaneBase, "server_live_again"),
    "routes": [e.path for e in ENDPOINTS if e.operation == "server_live_again"],
    "client": hasattr(RestClient, "server_live_again"),
}))
""")
    assert facts == {"base": True, "routes": ["/v2/health/live_again"], "client": True}


def test_a_renamed_package_serves_under_its_own_name(built: dict[str, Path], tmp_path: Path) -> None:
    """`package acme.serving`: the RPC paths carry the new name (the old ones are unknown), REST is unchanged, and
    the variant's own conformance suite passes against its own server."""
    package = built["renamed_package"]
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, package_dir=package.parent, ready=("simple",)) as server, \
            server.http_client() as http, server.channel() as channel:
        assert http.get("/v2/health/live").json() == {"live": True}
        assert_error_body(http.get("/v2/nope"), 404)
        renamed: Any = channel.unary_unary("/acme.serving.GRPCInferenceService/ServerLive")
        assert renamed(b"", timeout=30) == b"\x08\x01"  # live: true
        old: Any = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError) as info:
            old(b"", timeout=30)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        result = subprocess.run(
            [sys.executable, "-m", "oip.conformance", "--url", server.url, "--grpc", server.target,
             "--only", "infer_simple_*", "--only", "server_*", "--only", "model_metadata_simple"],
            env=server_env(package.parent), capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[-1].endswith(" passed, 0 failed"), result.stdout
