"""The generated package stands alone: it imports, runs and type-checks without oipgen; a second copy under
another name works beside it and beside tritonclient's own copy of `package inference`, with the wire unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import GENERATED, oipgen
from venvs import cached_venv

TYPING_PACKAGES = ["mypy>=1.10", "types-protobuf>=6.30", "types-grpcio>=1.0.0.20250000"]


def _run(python: Path | str, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", **env})


@pytest.fixture(scope="session")
def runtime_venv() -> Path:
    """A virtual environment with only what the manifest says the package needs (and mypy): no oipgen (cached:
    tests/venvs.py)."""
    manifest = json.loads((GENERATED / "oip" / "_oipgen_manifest.json").read_text())
    return cached_venv("runtime", [*manifest["runtime_requirements"], *TYPING_PACKAGES])


@pytest.fixture(scope="session")
def vendored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project tree holding the committed `oip` and a second copy built as `acme_oip`."""
    root = tmp_path_factory.mktemp("vendored")
    import shutil

    shutil.copytree(GENERATED / "oip", root / "oip", ignore=shutil.ignore_patterns("__pycache__"))
    result = oipgen("build", "--package", "acme_oip", "--out", str(root))
    assert result.returncode == 0, result.stderr
    return root


def test_the_package_runs_without_oipgen(runtime_venv: Path, vendored: Path) -> None:
    result = _run(runtime_venv / "bin" / "python", """
        import importlib.util, compileall, sys
        assert importlib.util.find_spec("oipgen") is None, "oipgen must not be installed here"
        assert compileall.compile_dir("oip", quiet=1)
        from oip import codec, convert, models
        from oip.grpc import grpc_service_pb2, grpc_service_pb2_grpc
        request = models.InferenceRequest.model_validate(
            {"id": "1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}]})
        msg = convert.inference_request_to_proto(request, raw=True, model_name="identity_fp32")
        again = grpc_service_pb2.ModelInferRequest.FromString(msg.SerializeToString())
        assert codec.from_raw(again.raw_input_contents[0], "FP32", [2]).tolist() == [1.5, 2.5]
        assert "oipgen" not in sys.modules and not any(m.startswith("oipgen") for m in sys.modules)
        print("ok")
    """, cwd=vendored)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_package_type_checks_strictly(runtime_venv: Path, vendored: Path) -> None:
    # Strict for everything; protoc's message stubs use bare generics, so that one check is relaxed for them.
    stubs = sorted(f"{pkg}.grpc.{p.stem}" for pkg in ("oip", "acme_oip")
                   for p in (vendored / pkg / "grpc").glob("*_pb2.pyi"))
    (vendored / "mypy.ini").write_text(
        f"[mypy]\nstrict = True\n\n[mypy-{','.join(stubs)}]\ndisallow_any_generics = False\n"
    )
    usage = vendored / "usage.py"
    usage.write_text(textwrap.dedent("""
        import grpc
        from oip import convert, models
        from oip.grpc import grpc_service_pb2 as pb
        from oip.grpc.grpc_service_pb2_grpc import GRPCInferenceServiceStub

        def call(channel: grpc.Channel) -> models.InferenceResponse:
            stub = GRPCInferenceServiceStub(channel)
            reply: pb.ModelInferResponse = stub.ModelInfer(pb.ModelInferRequest(model_name="simple"))
            return convert.inference_response_from_proto(reply)
    """))
    result = subprocess.run(
        [str(runtime_venv / "bin" / "mypy"), "oip", "acme_oip", "usage.py"],
        cwd=vendored, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_copies_and_tritonclient_share_one_process_and_one_wire(vendored: Path) -> None:
    result = _run(sys.executable, """
        import tritonclient.grpc as triton
        from tritonclient.grpc import service_pb2 as triton_pb
        from oip.grpc import grpc_service_pb2 as oip_pb, grpc_service_pb2_grpc as oip_grpc
        from acme_oip.grpc import grpc_service_pb2 as acme_pb, grpc_service_pb2_grpc as acme_grpc
        from acme_oip import convert as acme_convert

        # Same names, separate pools: every copy is whole.
        for pb in (oip_pb, acme_pb, triton_pb):
            assert pb.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
        assert oip_pb.DESCRIPTOR.pool is not acme_pb.DESCRIPTOR.pool

        # Bytes written by one copy are read by the others.
        msg = acme_convert.rest_to_proto("InferenceRequest", {"id": "7", "parameters": {"p": 2.5}, "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [[1, 2]]}]}, path={"model_name": "simple"})
        data = msg.SerializeToString()
        for other in (oip_pb, triton_pb):
            parsed = other.ModelInferRequest.FromString(data)
            assert parsed.model_name == "simple" and parsed.parameters["p"].double_param == 2.5
            assert list(parsed.inputs[0].contents.int_contents) == [1, 2]

        # A server built on one copy answers a client built on tritonclient: the RPC paths are the same.
        import grpc
        from concurrent import futures

        class Servicer(acme_grpc.GRPCInferenceServiceServicer):
            def ServerLive(self, request, context):
                return acme_pb.ServerLiveResponse(live=True)

            def ServerMetadata(self, request, context):
                return acme_pb.ServerMetadataResponse(name="acme", version="1", extensions=["x"])

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        acme_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            client = triton.InferenceServerClient(f"127.0.0.1:{port}")
            assert client.is_server_live()
            assert client.get_server_metadata().name == "acme"
            stub = oip_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
            assert stub.ServerLive(oip_pb.ServerLiveRequest()).live
            try:
                stub.ModelInfer(oip_pb.ModelInferRequest())
                raise AssertionError("expected UNIMPLEMENTED")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            server.stop(None)
        print("ok")
    """, cwd=vendored)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
