"""`python -m oip serve --extensions LIST`: an extension left out is not advertised, every operation it owns answers
501 `{"error"}` over REST and UNIMPLEMENTED over gRPC, and requests that use it are refused the same way; the
model configuration reports the instance count the server really runs (`--model-threads`).

Two servers for the module (loopback, ephemeral ports, stopped by PID through serving.py): one serving only
`statistics`, one with `--model-threads 3`. About 10 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from oip import extensions
from oip.client import RestClient
from oip.grpc import grpc_service_pb2 as pb
from oip.server.rest import ENDPOINTS
from serving import (
    SIMPLE_A,
    SIMPLE_B,
    Server,
    assert_error_body,
    build_repository,
    grpc_call,
    running,
    server_env,
    simple_body,
)
from tritonclient.utils import InferenceServerException

ONLY = "statistics"
# Minimal valid bodies of the operations that take one, so a refusal cannot come from the body.
BODIES: dict[str, Any] = {
    "SystemSharedMemoryRegisterRequest": {"key": "/r", "offset": 0, "byte_size": 8},
    "CudaSharedMemoryRegisterRequest": {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8},
}
PATH_VALUES = {"model_name": "simple", "model_version": "1", "region_name": "r"}


@pytest.fixture(scope="module")
def only_statistics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("only_statistics")
    repository = build_repository(work / "models", extra=("rendezvous",), only=("simple",))
    with running(repository, work, "--extensions", ONLY, ready=("simple", "rendezvous")) as server:
        yield server


@pytest.fixture(scope="module")
def three_threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("three_threads")
    repository = build_repository(work / "models", extra=("rendezvous",), only=("simple",))
    with running(repository, work, "--model-threads", "3", ready=("simple", "rendezvous")) as server:
        yield server


def _disabled_operations() -> list[str]:
    return sorted(op for op, owner in extensions.OPERATIONS.items() if owner != ONLY)


def test_metadata_lists_only_the_enabled_extension(only_statistics: Server) -> None:
    with only_statistics.clients() as (http, stub):
        assert http.get("/v2").json()["extensions"] == [ONLY]
        code, reply = grpc_call(stub, "ServerMetadata", pb.ServerMetadataRequest())
        assert code is grpc.StatusCode.OK and list(reply.extensions) == [ONLY]
        assert http.get("/v2/models/simple/stats").status_code == 200  # the one left on works


@pytest.mark.parametrize("endpoint", [e for e in ENDPOINTS if e.operation in _disabled_operations()],
                         ids=lambda e: f"{e.method} {e.path}")
def test_every_rest_route_of_a_disabled_extension_is_501(only_statistics: Server, endpoint: Any) -> None:
    path = endpoint.path.format(**PATH_VALUES)
    body = BODIES.get(endpoint.body or "", {}) if endpoint.body else None
    response = httpx.request(endpoint.method, only_statistics.url + path,
                             content=None if body is None else json.dumps(body), timeout=30)
    owner = extensions.OPERATIONS[endpoint.operation]
    assert owner in assert_error_body(response, 501)


@pytest.mark.parametrize("operation", _disabled_operations())
def test_every_rpc_of_a_disabled_extension_is_unimplemented(only_statistics: Server, operation: str) -> None:
    rpc = next(e.request for e in ENDPOINTS if e.operation == operation)
    message = rpc()
    for field in ("name", "model_name"):
        if field in message.DESCRIPTOR.fields_by_name:
            setattr(message, field, "simple")
    method = "".join(part.title() for part in operation.split("_"))
    with only_statistics.clients() as (_, stub):
        code, error = grpc_call(stub, method, message)
    assert code is grpc.StatusCode.UNIMPLEMENTED, error
    assert extensions.OPERATIONS[operation] in error.details()


def test_binary_tensor_data_off_refuses_binary_requests(only_statistics: Server) -> None:
    with only_statistics.clients() as (http, _):
        header = json.dumps(simple_body()).encode()
        raw = http.post("/v2/models/simple/infer", content=header,
                        headers={"Inference-Header-Content-Length": str(len(header))})
        assert "binary_tensor_data" in assert_error_body(raw, 501)
        asks_binary = {**simple_body(), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
        assert_error_body(http.post("/v2/models/simple/infer", json=asks_binary), 501)
        default_binary = {**simple_body(), "parameters": {"binary_data_output": True}}
        assert_error_body(http.post("/v2/models/simple/infer", json=default_binary), 501)
        plain = http.post("/v2/models/simple/infer", json=simple_body())
        assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"


def test_parameters_and_classification_off(only_statistics: Server) -> None:
    with only_statistics.clients() as (http, stub):
        with_parameters = {**simple_body(), "parameters": {"tag": "x"}}
        assert "parameters" in assert_error_body(http.post("/v2/models/simple/infer", json=with_parameters), 501)
        request = pb.ModelInferRequest(model_name="simple")
        request.parameters["tag"].string_param = "x"
        for name, data in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(data)
        code, error = grpc_call(stub, "ModelInfer", request)
        assert code is grpc.StatusCode.UNIMPLEMENTED and "parameters" in error.details()
        classify = {**simple_body(), "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]}
        assert "classification" in assert_error_body(http.post("/v2/models/simple/infer", json=classify), 501)


def test_clients_adapt(only_statistics: Server) -> None:
    """The generated REST client reads the metadata and sends JSON; tritonclient works when asked for JSON and
    reports the server's refusal of what is off."""
    with RestClient(only_statistics.url, trust_env=False) as client:
        result = client.infer("simple", {"INPUT0": np.array([SIMPLE_A], np.int32),
                                         "INPUT1": np.array([SIMPLE_B], np.int32)})
        np.testing.assert_array_equal(result["OUTPUT0"], [np.add(SIMPLE_A, SIMPLE_B)])
    triton = httpclient.InferenceServerClient(only_statistics.url.removeprefix("http://"))
    try:
        assert triton.get_server_metadata()["extensions"] == [ONLY]
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor, data in zip(inputs, (SIMPLE_A, SIMPLE_B), strict=True):
            tensor.set_data_from_numpy(np.array([data], np.int32), binary_data=False)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        np.testing.assert_array_equal(triton.infer("simple", inputs, outputs=outputs).as_numpy("OUTPUT0"),
                                      [np.add(SIMPLE_A, SIMPLE_B)])
        with pytest.raises(InferenceServerException, match="model_repository"):
            triton.get_model_repository_index()
        with pytest.raises(InferenceServerException, match="model_configuration"):
            triton.get_model_config("simple")
    finally:
        triton.close()
    grpc_triton = grpcclient.InferenceServerClient(only_statistics.target)
    try:
        with pytest.raises(InferenceServerException, match="model_repository"):
            grpc_triton.get_model_repository_index()
        assert grpc_triton.get_inference_statistics("simple").model_stats
    finally:
        grpc_triton.close()


@pytest.mark.parametrize("value", ["no_such_extension", "cuda_shared_memory"])
def test_extensions_the_server_cannot_serve_are_refused(tmp_path: Path, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "oip", "serve", "--model-repository", str(build_repository(tmp_path / "m", only=())),
         "--http-port", "0", "--grpc-port", "0", "--extensions", value],
        env=server_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert value in result.stderr and "Traceback" not in result.stderr


def test_the_configuration_reports_the_threads_that_really_run(three_threads: Server) -> None:
    """`--model-threads 3`: the configuration says 3 CPU instances, and three requests of a plain infer() are
    inside the model at once (the rendezvous model returns only when all three are)."""
    with three_threads.clients() as (http, stub):
        group = http.get("/v2/models/simple/config").json()["instance_group"]
        assert [(g["kind"], g["count"]) for g in group] == [("KIND_CPU", 3)]
        code, reply = grpc_call(stub, "ModelConfig", pb.ModelConfigRequest(name="rendezvous"))
        assert code is grpc.StatusCode.OK and reply.config.instance_group[0].count == 3
    answers: list[int] = []

    def call(i: int) -> None:
        body = {"parameters": {"parties": 3, "group": "three"},
                "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [i]}]}
        answers.append(httpx.post(f"{three_threads.url}/v2/models/rendezvous/infer", json=body, timeout=60)
                       .status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [200, 200, 200]
