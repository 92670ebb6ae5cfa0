"""Triton's system shared memory extension against the generated server.

Regions created with `tritonclient.utils.shared_memory`, registered, used for inputs and outputs over REST and gRPC,
listed, unregistered; every bound and conflict Triton checks; the same through the generated clients. CUDA shared
memory answers 501 / UNIMPLEMENTED and is not listed in the server metadata. (What keeps shared memory from being
turned against the host: test_shared_memory_safety.)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import Server, assert_error_body, check_simple, grpc_call
from stream_batch_models import SIMPLE_A, SIMPLE_B, serve_models, triton_grpc_client, triton_http_client
from tritonclient.utils import InferenceServerException

HAS_SHM = Path("/dev/shm").is_dir()
needs_shm = pytest.mark.skipif(not HAS_SHM, reason="no POSIX shared memory (/dev/shm) on this host")

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


@pytest.fixture
def triton_grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    with triton_grpc_client(server) as client:
        yield client


@pytest.fixture
def triton_http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    with triton_http_client(server) as client:
        yield client


# --- server metadata -------------------------------------------------------------------------------------------


def test_extensions_listed(http: httpx.Client, triton_grpc: grpcclient.InferenceServerClient) -> None:
    """system_shared_memory is listed where /dev/shm exists; cuda_shared_memory never (it answers 501)."""
    rest = http.get("/v2").json()["extensions"]
    grpc_list = list(triton_grpc.get_server_metadata().extensions)
    assert rest == grpc_list
    assert ("system_shared_memory" in rest) is HAS_SHM
    assert "cuda_shared_memory" not in rest


# --- system shared memory --------------------------------------------------------------------------------------


@contextlib.contextmanager
def region(size: int) -> Iterator[tuple[Any, str, str]]:
    """A fresh shared memory object of `size` bytes: (handle, region name, key); destroyed on the way out."""
    tag = uuid.uuid4().hex[:12]
    name, key = f"region_{tag}", f"/oipgen_test_{tag}"
    handle = shm.create_shared_memory_region(name, key, size)
    try:
        yield handle, name, key
    finally:
        shm.destroy_shared_memory_region(handle)


@needs_shm
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_shared_memory_inputs_and_outputs(transport: str, triton_http: httpclient.InferenceServerClient,
                                          triton_grpc: grpcclient.InferenceServerClient) -> None:
    """Triton's simple_*_shm_client: inputs and outputs in regions, status, unregister."""
    client: Any = triton_http if transport == "http" else triton_grpc
    module: Any = httpclient if transport == "http" else grpcclient
    size = SIMPLE_A.nbytes
    with region(2 * size) as (ins, in_name, in_key), region(2 * size + 8) as (outs, out_name, out_key):
        shm.set_shared_memory_region(ins, [SIMPLE_A, SIMPLE_B * 5])
        client.register_system_shared_memory(in_name, in_key, 2 * size)
        client.register_system_shared_memory(out_name, out_key, 2 * size, offset=8)
        try:
            inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory(in_name, size)
            inputs[1].set_shared_memory(in_name, size, offset=size)
            outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
            outputs[0].set_shared_memory(out_name, size)
            outputs[1].set_shared_memory(out_name, size, offset=size)
            result = client.infer("simple", inputs, outputs=outputs)
            got0 = shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=8)
            got1 = shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=8 + size)
            assert got0.tolist() == (SIMPLE_A + 5).tolist() and got1.tolist() == (SIMPLE_A - 5).tolist()
            answer = result.get_output("OUTPUT0")
            # As Triton answers: name, datatype and shape; no data, no parameters (an empty raw entry over gRPC).
            if transport == "http":
                assert answer == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
            else:
                assert (list(answer.shape), len(answer.parameters)) == ([1, 16], 0)
                assert [len(raw) for raw in result.get_response().raw_output_contents] == [0, 0]
            # Only OUTPUT1 in shared memory; OUTPUT0 comes back in the response as usual.
            mixed = client.infer("simple", inputs, outputs=[module.InferRequestedOutput("OUTPUT0"), outputs[1]])
            assert mixed.as_numpy("OUTPUT0").tolist() == (SIMPLE_A + 5).tolist()
            status = client.get_system_shared_memory_status()
            listed = status if transport == "http" else [
                {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for r in status.regions.values()]
            mine = sorted((r["name"], r["key"], int(r["offset"]), int(r["byte_size"])) for r in listed
                          if r["name"] in (in_name, out_name))
            assert mine == sorted([(in_name, in_key, 0, 2 * size), (out_name, out_key, 8, 2 * size)])
        finally:
            client.unregister_system_shared_memory(in_name)
            client.unregister_system_shared_memory(out_name)
        remaining = client.get_system_shared_memory_status()
        names = [r["name"] for r in remaining] if transport == "http" else list(remaining.regions)
        assert in_name not in names and out_name not in names


@needs_shm
def test_shared_memory_bytes(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """BYTES in shared memory: the raw form (4-byte length + bytes per element), both ways."""
    values = np.array([b"alpha", b"", b"\xff\x00z"], dtype=object)
    raw = b"".join(len(v).to_bytes(4, "little") + v for v in values)
    with region(64) as (handle, name, key):
        shm.set_shared_memory_region(handle, [np.frombuffer(raw, dtype=np.uint8)])
        triton_grpc.register_system_shared_memory(name, key, 64)
        try:
            tensor = grpcclient.InferInput("INPUT0", [3], "BYTES")
            tensor.set_shared_memory(name, len(raw))
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(name, 64 - len(raw), offset=len(raw))
            result = triton_grpc.infer("identity_bytes", [tensor], outputs=[out])
            assert list(result.get_output("OUTPUT0").shape) == [3]
            written = shm.get_contents_as_numpy(handle, np.uint8, [len(raw)], offset=len(raw)).tobytes()
            assert written == raw
        finally:
            triton_grpc.unregister_system_shared_memory(name)


@needs_shm
def test_shared_memory_errors(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Registration and use are checked as Triton checks them."""
    with region(128) as (handle, name, key):
        register = f"/v2/systemsharedmemory/region/{name}/register"
        # the object's real size bounds the region
        assert "invalid args" in assert_error_body(http.post(register, json={"key": key, "byte_size": 129}), 400)
        assert_error_body(http.post(register, json={"key": key, "offset": 100, "byte_size": 29}), 400)
        assert "no 'key'" in assert_error_body(http.post(register, json={"byte_size": 8}), 400)
        assert_error_body(http.post(register, json={"key": "/oipgen_no_such_key", "byte_size": 8}), 404)
        for bad_key in ("/../../etc/passwd", "a/b", "/", ".."):
            assert_error_body(http.post(register, json={"key": bad_key, "byte_size": 8}), 400)
        assert http.post(register, json={"key": key, "byte_size": 64}).status_code == 200
        try:
            # twice: Triton's ALREADY_EXISTS (400 over REST)
            assert "already" in assert_error_body(http.post(register, json={"key": key, "byte_size": 64}), 400)
            code, _ = grpc_call(stub, "SystemSharedMemoryRegister",
                                pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=64))
            assert code is grpc.StatusCode.ALREADY_EXISTS

            def shm_input(**params: Any) -> dict[str, Any]:
                return {"name": "INPUT0", "shape": [4], "datatype": "FP32", "parameters": params}

            def infer(*inputs: dict[str, Any], outputs: list[dict[str, Any]] | None = None) -> httpx.Response:
                body: dict[str, Any] = {"inputs": list(inputs)}
                if outputs is not None:
                    body["outputs"] = outputs
                return http.post("/v2/models/identity_fp32/infer", json=body)

            place = {"shared_memory_region": name, "shared_memory_byte_size": 16}
            assert infer(shm_input(**place)).status_code == 200
            assert_error_body(infer(shm_input(shared_memory_region="nope", shared_memory_byte_size=16)), 404)
            assert_error_body(infer(shm_input(**place, shared_memory_offset=64)), 400)  # offset past the region
            assert_error_body(infer(shm_input(**place, shared_memory_offset=56)), 400)  # runs past its end
            assert_error_body(infer(shm_input(shared_memory_region=name, shared_memory_byte_size=12)), 400)  # size
            assert_error_body(infer(shm_input(shared_memory_region=name)), 400)  # no byte size
            assert_error_body(infer(shm_input(shared_memory_region=name, shared_memory_byte_size="16")), 400)
            both = {**shm_input(**place), "data": [1, 2, 3, 4]}
            assert "only one" in assert_error_body(infer(both), 400)
            data_input = {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
            out = {"name": "OUTPUT0", "parameters": dict(place)}
            assert infer(data_input, outputs=[out]).status_code == 200
            assert shm.get_contents_as_numpy(handle, np.float32, [4]).tolist() == [1, 2, 3, 4]
            too_small = {"name": "OUTPUT0", "parameters": {**place, "shared_memory_byte_size": 8}}
            assert "at least 16 bytes" in assert_error_body(infer(data_input, outputs=[too_small]), 400)
            binary = {"name": "OUTPUT0", "parameters": {**place, "binary_data": True}}
            assert "binary_data" in assert_error_body(infer(data_input, outputs=[binary]), 400)
            classes = {"name": "OUTPUT0", "parameters": {**place, "classification": 2}}
            assert "classification" in assert_error_body(infer(data_input, outputs=[classes]), 400)
            not_binary = {"name": "OUTPUT0", "parameters": {**place, "binary_data": False}}  # what tritonclient sends
            assert infer(data_input, outputs=[not_binary]).status_code == 200
            # gRPC: contents and shared memory for one input
            message = pb.ModelInferRequest(model_name="identity_fp32")
            tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
            tensor.contents.fp32_contents.extend([1, 2, 3, 4])
            tensor.parameters["shared_memory_region"].string_param = name
            tensor.parameters["shared_memory_byte_size"].int64_param = 16
            code, error = grpc_call(stub, "ModelInfer", message)
            assert code is grpc.StatusCode.INVALID_ARGUMENT, error
            # status of an unknown region; unregistering one is no error (as Triton)
            assert_error_body(http.get("/v2/systemsharedmemory/region/nope/status"), 404)
            assert http.post("/v2/systemsharedmemory/region/nope/unregister").status_code == 200
        finally:
            assert http.post(f"/v2/systemsharedmemory/region/{name}/unregister").status_code == 200
    check_simple(http, stub)


@needs_shm
def test_unregister_all(http: httpx.Client) -> None:
    with region(16) as (_, first, key1), region(16) as (_, second, key2):
        for name, key in ((first, key1), (second, key2)):
            assert http.post(f"/v2/systemsharedmemory/region/{name}/register",
                             json={"key": key, "byte_size": 16}).status_code == 200
        assert http.get(f"/v2/systemsharedmemory/region/{first}/status").json() == [
            {"name": first, "key": key1, "offset": 0, "byte_size": 16}]
        assert http.post("/v2/systemsharedmemory/unregister").status_code == 200
        assert http.get("/v2/systemsharedmemory/status").json() == []


def test_cuda_shared_memory_is_unimplemented(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub,
                                             triton_http: httpclient.InferenceServerClient) -> None:
    """No GPU stack: every CUDA shared memory operation answers 501 / UNIMPLEMENTED, with a clear message."""
    for method, path in (("GET", "/v2/cudasharedmemory/status"), ("GET", "/v2/cudasharedmemory/region/r/status"),
                         ("POST", "/v2/cudasharedmemory/unregister"),
                         ("POST", "/v2/cudasharedmemory/region/r/unregister")):
        assert "GPU" in assert_error_body(http.request(method, path), 501)
    body = {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}
    assert "GPU" in assert_error_body(http.post("/v2/cudasharedmemory/region/r/register", json=body), 501)
    for rpc, message in (("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
                         ("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(name="r", byte_size=8)),
                         ("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest())):
        code, error = grpc_call(stub, rpc, message)
        assert code is grpc.StatusCode.UNIMPLEMENTED, error
    with pytest.raises(InferenceServerException):
        triton_http.get_cuda_shared_memory_status()


@needs_shm
def test_generated_clients_shared_memory(server: Server) -> None:
    """The generated clients register, list and unregister regions, and ask for outputs in shared memory."""
    from oip.client.errors import Unimplemented
    from oip.client.grpc import GrpcClient
    from oip.client.rest import RestClient
    from oip.client.tensors import RequestedOutput as ClientOutput

    size = SIMPLE_A.nbytes
    with region(2 * size) as (handle, name, key), RestClient(server.url) as rest, \
            GrpcClient(server.target) as grpc_client:
        rest.system_shared_memory_register(name, key=key, byte_size=2 * size)
        try:
            assert [(r.name, r.key, r.byte_size) for r in rest.system_shared_memory_status(name)] == [
                (name, key, 2 * size)]
            assert [r.name for r in grpc_client.system_shared_memory_status(name)] == [name]
            inputs = {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}
            for offset, client in ((0, rest), (size, grpc_client)):
                place = {"shared_memory_region": name, "shared_memory_byte_size": size, "shared_memory_offset": offset}
                # The client asks no binary data for an output in a region (the server would refuse it).
                out = ClientOutput("OUTPUT0", parameters=place)
                result = client.infer("simple", inputs, [out, "OUTPUT1"])
                assert result.output("OUTPUT0").shape == (1, 16)
                assert result.as_numpy("OUTPUT1").tolist() == (SIMPLE_A - 1).tolist()
                written = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=offset)
                assert written.tolist() == (SIMPLE_A + 1).tolist()
        finally:
            grpc_client.system_shared_memory_unregister(name)
        assert all(r.name != name for r in rest.system_shared_memory_status())
        with pytest.raises(Unimplemented):
            rest.cuda_shared_memory_status()
        with pytest.raises(Unimplemented):
            grpc_client.cuda_shared_memory_status()
