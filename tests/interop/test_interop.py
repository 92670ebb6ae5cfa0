"""Clients nobody here wrote, unmodified, against the generated server.

One `python -m oip serve` (loopback, ephemeral ports) serves examples/models (simple, identity_fp32,
identity_bytes) for the whole module.

- tritonclient 2.73 (the de facto OIP client): http, http.aio, grpc, grpc.aio; health, metadata, the repository
  index, inference with JSON, with the binary tensor data extension (its default) and over gRPC (it always sends
  raw_input_contents and reads raw_output_contents), BYTES and FP32 tensors, errors.
- KServe 0.21's clients (`InferenceRESTClient`, `InferenceGRPCClient`, async only). kserve and tritonclient both
  register `package inference` in protobuf's default pool and cannot share a process ("duplicate symbol"), so the
  KServe checks run in a subprocess (KSERVE_SCRIPT) that reports one JSON line per check.
- open-inference-openapi 2.0.0.1, the client generated from the public Open Inference Protocol OpenAPI document
  (sync and async): its tensor data are JSON numbers of one kind, so integer tensors travel as 0.0, 1.0, ...
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import open_inference.openapi as oio
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from conftest import ROOT
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from open_inference.openapi.client import AsyncOpenInferenceClient, OpenInferenceClient
from open_inference.openapi.core.api_error import ApiError
from serving import Server, running, server_env
from tritonclient.utils import InferenceServerException

EXAMPLES = ROOT / "examples" / "models"
MODELS = ("simple", "identity_fp32", "identity_bytes")
INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)
FP32 = np.array([0.5, -1.25, 3.0, 1e-3, np.finfo(np.float32).max], dtype=np.float32)
BYTES = np.array([b"hello", "wörld".encode(), b"", b"x" * 300], dtype=np.object_)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    missing = [m for m in MODELS if not (EXAMPLES / m).is_dir()]
    assert not missing, f"examples/models lacks {missing}"
    work = tmp_path_factory.mktemp("interop")
    repository = work / "models"
    for name in MODELS:  # a copy, so that importing the models writes nothing into the source tree
        shutil.copytree(EXAMPLES / name, repository / name, ignore=shutil.ignore_patterns("__pycache__"))
    with running(repository, work, ready=MODELS) as server:
        yield server


def _simple_inputs(module: Any, binary_data: bool | None = None) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor, data in zip(inputs, (INPUT0, INPUT1), strict=True):
        if binary_data is None:
            tensor.set_data_from_numpy(data)
        else:
            tensor.set_data_from_numpy(data, binary_data=binary_data)
    return inputs


def _check_simple(result: Any) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - INPUT1)
    assert result.as_numpy("OUTPUT0").dtype == np.int32 and result.as_numpy("OUTPUT0").shape == (1, 16)


def _server_rest_error(server: Server, path: str, body: Any = None) -> tuple[int, str]:
    """What the server answers to a request, read without tritonclient: status and `error` message."""
    with server.http_client(timeout=10) as client:
        answer = client.request("POST" if body is not None else "GET", path, json=body)
    return answer.status_code, answer.json()["error"]


def _server_grpc_error(server: Server, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    with server.channel() as channel:
        try:
            getattr(GRPCInferenceServiceStub(channel), method)(request, timeout=10)
        except grpc.RpcError as exc:
            call: Any = exc
            return call.code(), call.details()
    raise AssertionError(f"{method} succeeded")


# ---------------------------------------------------------------------------------------------------------------
# tritonclient.http


def test_http_health(triton_http: httpclient.InferenceServerClient) -> None:
    assert triton_http.is_server_live()
    assert triton_http.is_server_ready()
    for name in MODELS:
        assert triton_http.is_model_ready(name)
    assert triton_http.is_model_ready("simple", "1")
    assert not triton_http.is_model_ready("no_such_model")
    assert not triton_http.is_model_ready("simple", "7")


def test_http_server_metadata(triton_http: httpclient.InferenceServerClient) -> None:
    metadata = triton_http.get_server_metadata()
    assert set(metadata) == {"name", "version", "extensions"}
    assert isinstance(metadata["name"], str) and isinstance(metadata["version"], str)
    # tritonclient's HTTP default is the binary tensor data extension; the server must say it has it
    assert "binary_tensor_data" in metadata["extensions"]


def test_http_model_metadata(triton_http: httpclient.InferenceServerClient) -> None:
    metadata = triton_http.get_model_metadata("simple")
    assert metadata["name"] == "simple" and metadata["versions"] == ["1"] and isinstance(metadata["platform"], str)
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]
    assert metadata["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]
    assert triton_http.get_model_metadata("simple", "1") == metadata
    expected = [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]
    assert triton_http.get_model_metadata("identity_fp32")["inputs"] == expected


def test_http_simple_example_flow(triton_http: httpclient.InferenceServerClient) -> None:
    """simple_http_infer_client.py: binary inputs; OUTPUT0 binary, OUTPUT1 as JSON."""
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = triton_http.infer("simple", _simple_inputs(httpclient), outputs=outputs, request_id="7")
    _check_simple(result)
    response = result.get_response()
    assert response["id"] == "7" and response["model_name"] == "simple" and response["model_version"] == "1"
    first, second = response["outputs"]
    assert first["parameters"]["binary_data_size"] == 64 and "data" not in first
    assert second["data"] == (INPUT0 - INPUT1).ravel().tolist()


def test_http_json_everywhere(triton_http: httpclient.InferenceServerClient) -> None:
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
    result = triton_http.infer("simple", _simple_inputs(httpclient, binary_data=False), outputs=outputs)
    _check_simple(result)
    assert all("data" in o and "parameters" not in o for o in result.get_response()["outputs"])


def test_http_no_outputs_listed_means_every_output_binary(triton_http: httpclient.InferenceServerClient) -> None:
    # tritonclient adds `binary_data_output: true` when no outputs are listed
    result = triton_http.infer("simple", _simple_inputs(httpclient))
    _check_simple(result)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert all(o["parameters"]["binary_data_size"] == 64 for o in result.get_response()["outputs"])


def test_http_versioned_and_filtered(triton_http: httpclient.InferenceServerClient) -> None:
    result = triton_http.infer(
        "simple", _simple_inputs(httpclient), model_version="1",
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - INPUT1)


@pytest.mark.parametrize("binary_data", [True, False])
def test_http_fp32_identity(triton_http: httpclient.InferenceServerClient, binary_data: bool) -> None:
    tensor = httpclient.InferInput("INPUT0", [len(FP32)], "FP32")
    tensor.set_data_from_numpy(FP32, binary_data=binary_data)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_data)
    result = triton_http.infer("identity_fp32", [tensor], outputs=[output])
    assert result.as_numpy("OUTPUT0").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), FP32)


@pytest.mark.parametrize("binary_data", [True, False])
def test_http_bytes_identity(triton_http: httpclient.InferenceServerClient, binary_data: bool) -> None:
    tensor = httpclient.InferInput("INPUT0", [len(BYTES)], "BYTES")
    tensor.set_data_from_numpy(BYTES, binary_data=binary_data)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_data)
    result = triton_http.infer("identity_bytes", [tensor], outputs=[output])
    got = result.as_numpy("OUTPUT0")
    # JSON carries BYTES as UTF-8 strings, which tritonclient hands back as str; binary gives bytes
    assert [x if isinstance(x, bytes) else x.encode() for x in got.tolist()] == BYTES.tolist()
    assert got.shape == (len(BYTES),)


def test_http_mixed_json_and_binary_inputs(triton_http: httpclient.InferenceServerClient) -> None:
    first, second = _simple_inputs(httpclient, binary_data=False)
    second.set_data_from_numpy(INPUT1, binary_data=True)
    _check_simple(triton_http.infer("simple", [first, second]))


def test_http_unknown_model_raises_the_server_message(
    server: Server, triton_http: httpclient.InferenceServerClient
) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    status, message = _server_rest_error(server, "/v2/models/no_such_model/infer", body)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32), binary_data=False)
    with pytest.raises(InferenceServerException) as info:
        triton_http.infer("no_such_model", [tensor])
    assert (info.value.status(), info.value.message()) == (str(status), message) and status == 404
    with pytest.raises(InferenceServerException) as info:
        triton_http.get_model_metadata("no_such_model")
    assert info.value.status() == "404" and info.value.message() == _server_rest_error(
        server, "/v2/models/no_such_model"
    )[1]


def test_http_invalid_input_raises_the_server_message(triton_http: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")  # simple takes INT32
    tensor.set_data_from_numpy(INPUT0.astype(np.float32))
    other = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    other.set_data_from_numpy(INPUT1)
    with pytest.raises(InferenceServerException) as info:
        triton_http.infer("simple", [tensor, other])
    assert info.value.status() == "400" and info.value.message()
    assert "an exception occurred in the client" not in info.value.message()


def test_http_repository_index(triton_http: httpclient.InferenceServerClient) -> None:
    # tritonclient POSTs /v2/repository/index with an empty body
    index = triton_http.get_model_repository_index()
    assert [(m["name"], m.get("version"), m["state"]) for m in index] == [
        (name, "1", "READY") for name in sorted(MODELS)
    ]


def test_http_compressed_responses(triton_http: httpclient.InferenceServerClient) -> None:
    for algorithm in ("gzip", "deflate"):  # tritonclient sends Accept-Encoding and inflates what comes back
        _check_simple(triton_http.infer("simple", _simple_inputs(httpclient), response_compression_algorithm=algorithm))


# Known gaps: what tritonclient (and Triton's example clients, perf_analyzer) expect that the server does not do
# yet. Strict: when the server gains the feature, these start passing and must lose their mark.


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_compressed_requests(triton_http: httpclient.InferenceServerClient, algorithm: str) -> None:
    _check_simple(triton_http.infer("simple", _simple_inputs(httpclient), request_compression_algorithm=algorithm))


# tritonclient's simple_*_infer_client examples call get_inference_statistics; perf_analyzer needs both.
@pytest.mark.parametrize("call", ["http_statistics", "http_config", "grpc_statistics", "grpc_config"])
def test_statistics_and_model_config(
    triton_http: httpclient.InferenceServerClient, triton_grpc: grpcclient.InferenceServerClient, call: str
) -> None:
    if call == "http_statistics":
        assert len(triton_http.get_inference_statistics("simple")["model_stats"]) == 1
    elif call == "http_config":
        assert triton_http.get_model_config("simple")["name"] == "simple"
    elif call == "grpc_statistics":
        assert len(triton_grpc.get_inference_statistics("simple").model_stats) == 1
    else:
        assert triton_grpc.get_model_config("simple").config.name == "simple"


# ---------------------------------------------------------------------------------------------------------------
# tritonclient.http.aio


def test_http_aio(server: Server) -> None:
    async def main() -> None:
        client = httpclient_aio.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple")
            assert (await client.get_server_metadata())["extensions"]
            assert (await client.get_model_metadata("simple"))["name"] == "simple"
            _check_simple(await client.infer("simple", _simple_inputs(httpclient_aio)))
            outputs = [httpclient_aio.InferRequestedOutput("OUTPUT0", binary_data=False)]
            result = await client.infer("simple", _simple_inputs(httpclient_aio, binary_data=False), outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)
            tensor = httpclient_aio.InferInput("INPUT0", [len(BYTES)], "BYTES")
            tensor.set_data_from_numpy(BYTES)
            assert (await client.infer("identity_bytes", [tensor])).as_numpy("OUTPUT0").tolist() == BYTES.tolist()
            with pytest.raises(InferenceServerException) as info:
                await client.infer("no_such_model", [tensor])
            assert info.value.status() == "404" and info.value.message()
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------------------------------------------------------
# tritonclient.grpc


def test_grpc_health(triton_grpc: grpcclient.InferenceServerClient) -> None:
    assert triton_grpc.is_server_live()
    assert triton_grpc.is_server_ready()
    for name in MODELS:
        assert triton_grpc.is_model_ready(name)
    assert triton_grpc.is_model_ready("simple", "1")
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.is_model_ready("no_such_model")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_grpc_server_metadata(triton_grpc: grpcclient.InferenceServerClient) -> None:
    metadata = triton_grpc.get_server_metadata()
    assert metadata.name and metadata.version and "binary_tensor_data" in metadata.extensions
    as_json = triton_grpc.get_server_metadata(as_json=True)
    assert as_json["name"] == metadata.name


def test_grpc_model_metadata(triton_grpc: grpcclient.InferenceServerClient) -> None:
    metadata = triton_grpc.get_model_metadata("simple")
    assert metadata.name == "simple" and list(metadata.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]), ("OUTPUT1", "INT32", [1, 16])
    ]
    as_json = triton_grpc.get_model_metadata("identity_fp32", as_json=True)
    assert as_json["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1"]}]


def test_grpc_simple_example_flow(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """simple_grpc_infer_client.py: raw_input_contents in, raw_output_contents out."""
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = triton_grpc.infer("simple", _simple_inputs(grpcclient), outputs=outputs, request_id="7",
                               headers={"test": "1"}, client_timeout=30)
    _check_simple(result)
    response = result.get_response()
    assert response.id == "7" and response.model_name == "simple" and response.model_version == "1"
    assert len(response.raw_output_contents) == 2
    _check_simple(triton_grpc.infer("simple", _simple_inputs(grpcclient)))  # no outputs listed: every output


def test_grpc_fp32_and_bytes_identity(triton_grpc: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [len(FP32)], "FP32")
    tensor.set_data_from_numpy(FP32)
    got = triton_grpc.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, FP32)
    tensor = grpcclient.InferInput("INPUT0", [len(BYTES)], "BYTES")
    tensor.set_data_from_numpy(BYTES)
    assert triton_grpc.infer("identity_bytes", [tensor]).as_numpy("OUTPUT0").tolist() == BYTES.tolist()


def test_grpc_unknown_model_raises_the_server_message(
    server: Server, triton_grpc: grpcclient.InferenceServerClient
) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    request = pb.ModelInferRequest(model_name="no_such_model")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([1.0], dtype="<f4").tobytes())
    code, details = _server_grpc_error(server, "ModelInfer", request)
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.infer("no_such_model", [tensor])
    assert (info.value.status(), info.value.message()) == (str(code), details)
    assert code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.get_model_metadata("no_such_model")
    assert info.value.status() == "StatusCode.NOT_FOUND" and info.value.message()


def test_grpc_repository_index(triton_grpc: grpcclient.InferenceServerClient) -> None:
    index = triton_grpc.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [(name, "1", "READY") for name in sorted(MODELS)]


# ---------------------------------------------------------------------------------------------------------------
# tritonclient.grpc.aio


def test_grpc_aio(server: Server) -> None:
    async def main() -> None:
        client = grpcclient_aio.InferenceServerClient(url=server.target)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple")
            assert (await client.get_server_metadata()).name
            assert (await client.get_model_metadata("simple")).name == "simple"
            outputs = [grpcclient_aio.InferRequestedOutput("OUTPUT0"), grpcclient_aio.InferRequestedOutput("OUTPUT1")]
            _check_simple(await client.infer("simple", _simple_inputs(grpcclient_aio), outputs=outputs))
            tensor = grpcclient_aio.InferInput("INPUT0", [len(FP32)], "FP32")
            tensor.set_data_from_numpy(FP32)
            np.testing.assert_array_equal((await client.infer("identity_fp32", [tensor])).as_numpy("OUTPUT0"), FP32)
            with pytest.raises(InferenceServerException) as info:
                await client.infer("no_such_model", [tensor])
            assert info.value.status() == "StatusCode.NOT_FOUND" and info.value.message()
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------------------------------------------------------
# KServe's clients, in a subprocess (see the module docstring)

KSERVE_SCRIPT = textwrap.dedent('''
    """KServe 0.21 clients against an OIP server: one JSON line per check {"check", "ok", "detail"}."""
    import asyncio, json, sys, traceback

    import grpc
    import httpx
    import numpy as np
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
    from kserve.protocol.infer_type import RequestedOutput

    URL, GRPC = sys.argv[1], sys.argv[2]
    INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    INPUT1 = np.ones((1, 16), dtype=np.int32)
    FP32 = np.array([0.5, -1.25, 3.0, 1e-3], dtype=np.float32)


    def report(check, ok, detail=""):
        print(json.dumps({"check": check, "ok": bool(ok), "detail": str(detail)[:2000]}), flush=True)


    def simple_request(binary, outputs=None):
        inputs = [InferInput("INPUT0", [1, 16], "INT32"), InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(INPUT0, binary_data=binary)
        inputs[1].set_data_from_numpy(INPUT1, binary_data=binary)
        return InferRequest(model_name="simple", infer_inputs=inputs, request_outputs=outputs)


    def fp32_request(binary):
        tensor = InferInput("INPUT0", [len(FP32)], "FP32")
        tensor.set_data_from_numpy(FP32, binary_data=binary)
        return InferRequest(model_name="identity_fp32", infer_inputs=[tensor])


    def check_simple(response):
        by_name = {o.name: o.as_numpy() for o in response.outputs}
        assert sorted(by_name) == ["OUTPUT0", "OUTPUT1"], sorted(by_name)
        np.testing.assert_array_equal(by_name["OUTPUT0"], INPUT0 + INPUT1)
        np.testing.assert_array_equal(by_name["OUTPUT1"], INPUT0 - INPUT1)
        assert response.model_name == "simple", response.model_name


    def check_fp32(response):
        (out,) = response.outputs
        got = out.as_numpy()
        assert got.dtype == np.float32, got.dtype
        np.testing.assert_array_equal(got, FP32)


    async def run(check, coro_fn):
        try:
            detail = await asyncio.wait_for(coro_fn(), 30)
            report(check, True, detail or "")
        except BaseException as exc:  # report everything, including AssertionError
            report(check, False, "".join(traceback.format_exception_only(type(exc), exc)).strip())


    async def main():
        rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30, retries=0))
        try:
            async def live():
                assert await rest.is_server_live(URL) is True
            async def ready():
                assert await rest.is_server_ready(URL) is True
            async def model_ready():
                assert await rest.is_model_ready(URL, "simple") is True
                assert await rest.is_model_ready(URL, "identity_fp32") is True
                assert await rest.is_model_ready(URL, "no_such_model") is False
            async def infer_binary():
                check_simple(await rest.infer(URL, simple_request(True), model_name="simple"))
            async def infer_json():
                check_simple(await rest.infer(URL, simple_request(False), model_name="simple"))
            async def infer_binary_outputs():
                outputs = [RequestedOutput("OUTPUT0", {"binary_data": True}),
                           RequestedOutput("OUTPUT1", {"binary_data": True})]
                check_simple(await rest.infer(URL, simple_request(True, outputs), model_name="simple"))
            async def infer_fp32():
                check_fp32(await rest.infer(URL, fp32_request(True), model_name="identity_fp32"))
                check_fp32(await rest.infer(URL, fp32_request(False), model_name="identity_fp32"))
            async def unknown_model():
                try:
                    await rest.infer(URL, fp32_request(False), model_name="no_such_model")
                except httpx.HTTPStatusError as exc:
                    error = exc.response.json()["error"]
                    assert exc.response.status_code == 404, exc.response.status_code
                    assert str(exc).startswith(error + ", '404 Not Found'"), (str(exc), error)
                    return str(exc)
                raise AssertionError("no error")
            for name, fn in [("rest_live", live), ("rest_ready", ready), ("rest_model_ready", model_ready),
                             ("rest_infer_binary", infer_binary), ("rest_infer_json", infer_json),
                             ("rest_infer_binary_outputs", infer_binary_outputs), ("rest_infer_fp32", infer_fp32),
                             ("rest_unknown_model", unknown_model)]:
                await run(name, fn)
        finally:
            await rest.close()

        client = InferenceGRPCClient(GRPC, timeout=30, retries=0)
        try:
            async def glive():
                assert await client.is_server_live() is True
            async def gready():
                assert await client.is_server_ready() is True
            async def gmodel_ready():
                assert await client.is_model_ready("simple") is True
                assert await client.is_model_ready("identity_fp32") is True
                try:
                    await client.is_model_ready("no_such_model")
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND, exc.code()
                else:
                    raise AssertionError("no error for an unknown model")
            async def ginfer_raw():
                check_simple(await client.infer(simple_request(True)))
            async def ginfer_typed():
                check_simple(await client.infer(simple_request(False)))
            async def ginfer_fp32():
                check_fp32(await client.infer(fp32_request(True)))
                check_fp32(await client.infer(fp32_request(False)))
            async def gunknown_model():
                try:
                    await client.infer(InferRequest(model_name="no_such_model", infer_inputs=fp32_request(True).inputs))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND, exc.code()
                    return exc.details()
                raise AssertionError("no error")
            for name, fn in [("grpc_live", glive), ("grpc_ready", gready), ("grpc_model_ready", gmodel_ready),
                             ("grpc_infer_raw", ginfer_raw), ("grpc_infer_typed", ginfer_typed),
                             ("grpc_infer_fp32", ginfer_fp32), ("grpc_unknown_model", gunknown_model)]:
                await run(name, fn)
        finally:
            await client.close()


    asyncio.run(main())
''')

KSERVE_CHECKS = (
    "rest_live", "rest_ready", "rest_model_ready", "rest_infer_binary", "rest_infer_json",
    "rest_infer_binary_outputs", "rest_infer_fp32", "rest_unknown_model",
    "grpc_live", "grpc_ready", "grpc_model_ready", "grpc_infer_raw", "grpc_infer_typed", "grpc_infer_fp32",
    "grpc_unknown_model",
)


@pytest.fixture(scope="module")
def kserve_results(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    script = tmp_path_factory.mktemp("kserve") / "kserve_checks.py"
    script.write_text(KSERVE_SCRIPT)
    env = {k: v for k, v in server_env().items() if k != "PYTHONPATH"}  # kserve's own protos only: no `oip` needed
    result = subprocess.run(
        [sys.executable, str(script), server.url, server.target], capture_output=True, text=True, timeout=300,
        env=env, cwd=script.parent,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the KServe script reported nothing (exit {result.returncode}):\n{result.stderr[-3000:]}"
    return {line["check"]: line for line in lines}


@pytest.mark.parametrize("check", KSERVE_CHECKS)
def test_kserve(kserve_results: dict[str, dict[str, Any]], check: str) -> None:
    assert check in kserve_results, f"{check} did not run; ran: {sorted(kserve_results)}"
    assert kserve_results[check]["ok"], kserve_results[check]["detail"]


def test_kserve_runs_every_check(kserve_results: dict[str, dict[str, Any]]) -> None:
    assert sorted(kserve_results) == sorted(KSERVE_CHECKS)


def test_tritonclient_and_this_package_share_one_process() -> None:
    # tritonclient registered `package inference` in protobuf's default pool; ours lives in a private pool.
    assert "tritonclient.grpc.service_pb2" in sys.modules
    assert pb.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert Path(pb.__file__).is_relative_to(ROOT / "generated")


# ---------------------------------------------------------------------------------------------------------------
# open-inference-openapi: the client generated from the public OpenAPI document


def _oio_simple() -> oio.InferenceRequest:
    return oio.InferenceRequest(id="oio", inputs=[
        oio.RequestInput(name=name, shape=[1, 16], datatype="INT32", data=data.reshape(-1).tolist())
        for name, data in (("INPUT0", INPUT0), ("INPUT1", INPUT1))
    ])


def _oio_check_simple(response: oio.InferenceResponse) -> None:
    outputs = {o.name: o for o in response.outputs}
    assert response.model_name == "simple" and response.id == "oio"
    assert outputs["OUTPUT0"].datatype == "INT32" and outputs["OUTPUT0"].shape == [1, 16]
    assert outputs["OUTPUT0"].data.__root__ == (INPUT0 + INPUT1).reshape(-1).tolist()
    assert outputs["OUTPUT1"].data.__root__ == (INPUT0 - INPUT1).reshape(-1).tolist()


def _oio_fp32_and_bytes() -> tuple[oio.InferenceRequest, oio.InferenceRequest]:
    fp32 = oio.InferenceRequest(inputs=[oio.RequestInput(name="INPUT0", shape=[len(FP32)], datatype="FP32",
                                                         data=FP32.tolist())])
    text = ["hello", "wörld", ""]
    strings = oio.InferenceRequest(inputs=[oio.RequestInput(name="INPUT0", shape=[len(text)], datatype="BYTES",
                                                            data=text)])
    return fp32, strings


def test_open_inference_client_sync(server: Server) -> None:
    sent: list[bytes] = []
    http = httpx.Client(timeout=30, trust_env=False, event_hooks={"request": [lambda r: sent.append(r.read())]})
    client = OpenInferenceClient(base_url=server.url, httpx_client=http)
    try:
        client.check_server_liveness()
        client.check_server_readiness()
        client.check_model_readiness("simple")
        client.check_model_version_readiness("simple", "1")
        metadata = client.read_server_metadata()
        assert "binary_tensor_data" in metadata.extensions
        model = client.read_model_metadata("simple")
        assert [(t.name, t.datatype, t.shape) for t in model.inputs] == [("INPUT0", "INT32", [1, 16]),
                                                                          ("INPUT1", "INT32", [1, 16])]
        assert client.read_model_version_metadata("simple", "1").name == "simple"
        _oio_check_simple(client.model_infer("simple", request=_oio_simple()))
        # what the server accepted: INT32 elements written as JSON numbers with a fraction
        data = json.loads(sent[-1])["inputs"][0]["data"]
        assert data == list(range(16)) and all(type(v) is float for v in data) and b"1.0" in sent[-1]
        _oio_check_simple(client.model_version_infer("simple", "1", request=_oio_simple()))
        fp32, strings = _oio_fp32_and_bytes()
        assert client.model_infer("identity_fp32", request=fp32).outputs[0].data.__root__ == FP32.tolist()
        assert client.model_infer("identity_bytes", request=strings).outputs[0].data.__root__ == ["hello", "wörld", ""]
        bad = _oio_simple()
        bad.inputs[0].data.__root__[3] = 0.5
        with pytest.raises(oio.BadRequestError) as refused:
            client.model_infer("simple", request=bad)
        assert refused.value.body == {"error": "tensor 'INPUT0': INT32 element 3 must be an integer, got number 0.5"}
        with pytest.raises(ApiError) as missing:
            client.model_infer("no_such_model", request=_oio_simple())
        assert missing.value.status_code == 404 and list(missing.value.body) == ["error"]
    finally:
        http.close()


def test_open_inference_client_async(server: Server) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            client = AsyncOpenInferenceClient(base_url=server.url, httpx_client=http)
            await client.check_server_liveness()
            await client.check_server_readiness()
            await client.check_model_readiness("simple")
            assert (await client.read_model_metadata("identity_fp32")).inputs[0].datatype == "FP32"
            results = await asyncio.gather(*(client.model_infer("simple", request=_oio_simple()) for _ in range(8)))
            for result in results:
                _oio_check_simple(result)
            _oio_check_simple(await client.model_version_infer("simple", "1", request=_oio_simple()))
            fp32, strings = _oio_fp32_and_bytes()
            assert (await client.model_infer("identity_fp32", request=fp32)).outputs[0].data.__root__ == FP32.tolist()
            answer = await client.model_infer("identity_bytes", request=strings)
            assert answer.outputs[0].data.__root__ == ["hello", "wörld", ""]
            with pytest.raises(ApiError) as missing:
                await client.model_infer("no_such_model", request=_oio_simple())
            assert missing.value.status_code == 404

    asyncio.run(asyncio.wait_for(main(), 60))
