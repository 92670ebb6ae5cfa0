"""Triton's streaming, system shared memory and dynamic batching, against the generated server.

- Streaming: tritonclient's `start_stream` + `async_stream_infer` with models that are not decoupled (one response
  per request, in order, flagged final), decoupled models (sync and async generators: any number of responses,
  the empty final response on request), an error in the middle of a stream (reported, the stream goes on), and
  decoupled models refused over unary inference, as Triton refuses them.
- System shared memory: regions created with `tritonclient.utils.shared_memory`, registered, used for inputs and
  outputs over REST and gRPC, listed, unregistered; every bound and conflict Triton checks. CUDA shared memory
  answers 501 / UNIMPLEMENTED and is not listed in the server metadata.
- Dynamic batching: concurrent callers each get their own rows back, a model that costs per call runs fewer
  times than it is asked (statistics), requests whose shapes or parameters differ never share a call, requested
  outputs stay per request. The batching rules are also driven in-process through the data plane, where timing
  is under the test's control.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import textwrap
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server import (
    DataPlane,
    InferRequest,
    InferResponse,
    Model,
    ModelRepository,
    OipError,
    RequestedOutput,
    Settings,
    Tensor,
    TensorSpec,
)
from oip.server.errors import ErrorKind
from oip.server.model import DynamicBatching
from serving import TIMEOUT, Server, assert_error_body, build_repository, check_simple, grpc_call, running
from tritonclient.utils import InferenceServerException

HAS_SHM = Path("/dev/shm").is_dir()
needs_shm = pytest.mark.skipif(not HAS_SHM, reason="no POSIX shared memory (/dev/shm) on this host")

# --- the models ------------------------------------------------------------------------------------------------

MODELS: dict[str, tuple[str, str]] = {
    # Decoupled, a plain generator: one response per element of IN (none for an empty IN); a negative element
    # fails the request after the responses before it.
    "repeat": ('class = "model:Repeat"\n', '''
        import numpy as np

        from oip.server.model import Model, TensorSpec


        class Repeat(Model):
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1]), TensorSpec("IDX", "UINT32", [1])]
            decoupled = True

            def infer(self, inputs, parameters):
                for i, value in enumerate(inputs["IN"].tolist()):
                    if value < 0:
                        raise ValueError(f"negative value {value}")
                    yield {"OUT": np.array([value], np.int32), "IDX": np.array([i], np.uint32)}
    '''),
    # The same as an async generator, declared decoupled by its model.toml.
    "repeat_async": ('class = "model:RepeatAsync"\ndecoupled = true\n', '''
        import asyncio

        import numpy as np

        from oip.server.model import Model, TensorSpec


        class RepeatAsync(Model):
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1]), TensorSpec("IDX", "UINT32", [1])]

            async def infer(self, inputs, parameters):
                for i, value in enumerate(inputs["IN"].tolist()):
                    await asyncio.sleep(0.001)
                    if value < 0:
                        raise ValueError(f"negative value {value}")
                    yield {"OUT": np.array([value], np.int32), "IDX": np.array([i], np.uint32)}
    '''),
    # Batches dynamically and costs 10 ms per call: DOUBLE = INPUT0 * scale (a request parameter, default 2),
    # ROWSUM = the sum of each row.
    "counter": ('class = "model:Counter"\n', '''
        import time

        import numpy as np

        from oip.server.model import DynamicBatching, Model, TensorSpec


        class Counter(Model):
            max_batch_size = 8
            dynamic_batching = DynamicBatching(max_queue_delay_microseconds=20000)
            inputs = [TensorSpec("INPUT0", "INT32", [4])]
            outputs = [TensorSpec("DOUBLE", "INT32", [4]), TensorSpec("ROWSUM", "INT64", [1])]

            def infer(self, inputs, parameters):
                time.sleep(0.01)
                x = inputs["INPUT0"]
                return {"DOUBLE": x * int(parameters.get("scale", 2)), "ROWSUM": x.sum(axis=1, keepdims=True)}
    '''),
    # Batches dynamically with a variable dimension: requests of different lengths cannot share a call.
    "ragged": ('class = "model:Ragged"\nmax_batch_size = 8\n[dynamic_batching]\nmax_queue_delay_microseconds = 50000\n',
               '''
        import time

        from oip.server.model import Model, TensorSpec


        class Ragged(Model):
            inputs = [TensorSpec("INPUT0", "FP32", [-1])]
            outputs = [TensorSpec("OUTPUT0", "FP32", [-1])]

            def infer(self, inputs, parameters):
                time.sleep(0.005)
                return {"OUTPUT0": inputs["INPUT0"] + 1}
    '''),
}


def write_models(root: Path) -> None:
    for name, (toml, code) in MODELS.items():
        folder = root / name
        folder.mkdir()
        (folder / "model.toml").write_text(toml)
        (folder / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("stream_shm_batch")
    repository = build_repository(root / "models", only=("simple", "identity_fp32", "identity_bytes"))
    write_models(repository)
    with running(repository, root / "run", ready=["simple", *MODELS]) as server:
        yield server


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with server.http_client() as client:
        yield client


@pytest.fixture
def stub(server: Server) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with server.channel() as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def triton_grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.target)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def triton_http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=16)
    try:
        yield client
    finally:
        client.close()


SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)


def simple_inputs(module: Any, a: npt.NDArray[Any] = SIMPLE_A, b: npt.NDArray[Any] = SIMPLE_B) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def repeat_input(values: list[int]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return [tensor]


# --- server metadata -------------------------------------------------------------------------------------------


def test_extensions_listed(http: httpx.Client, triton_grpc: grpcclient.InferenceServerClient) -> None:
    """system_shared_memory is listed where /dev/shm exists; cuda_shared_memory never (it answers 501)."""
    rest = http.get("/v2").json()["extensions"]
    grpc_list = list(triton_grpc.get_server_metadata().extensions)
    assert rest == grpc_list
    assert ("system_shared_memory" in rest) is HAS_SHM
    assert "cuda_shared_memory" not in rest


# --- streaming -------------------------------------------------------------------------------------------------


class Collector:
    """A start_stream callback: every (result, error) in arrival order."""

    def __init__(self) -> None:
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.items.put((result, error))

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.items.get(timeout=TIMEOUT) for _ in range(count)]

    def nothing_more(self, wait: float = 0.3) -> bool:
        try:
            self.items.get(timeout=wait)
        except queue.Empty:
            return True
        return False


@contextlib.contextmanager
def stream(client: grpcclient.InferenceServerClient) -> Iterator[Collector]:
    collector = Collector()
    client.start_stream(callback=collector)
    try:
        yield collector
    finally:
        client.stop_stream()


def final_flag(result: Any) -> bool | None:
    params = result.get_response().parameters
    return params["triton_final_response"].bool_param if "triton_final_response" in params else None


def test_stream_not_decoupled(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """One response per request, in request order, each flagged final."""
    with stream(triton_grpc) as got:
        for i in range(5):
            a = np.full((1, 16), i, dtype=np.int32)
            triton_grpc.async_stream_infer("simple", simple_inputs(grpcclient, a), request_id=str(i))
        answers = got.take(5)
        assert got.nothing_more()
    for i, (result, error) in enumerate(answers):
        assert error is None, error
        assert result.get_response().id == str(i)
        assert result.as_numpy("OUTPUT0").tolist() == [[i + 1] * 16]
        assert final_flag(result) is True


def test_stream_error_keeps_the_stream(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """A failed request (unknown model, bad input, decode error) comes back as an error; the next ones answer."""
    bad_shape = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
    bad_shape.set_data_from_numpy(np.zeros((1, 3), np.int32))
    with stream(triton_grpc) as got:
        triton_grpc.async_stream_infer("simple", simple_inputs(grpcclient), request_id="ok1")
        triton_grpc.async_stream_infer("nope", simple_inputs(grpcclient), request_id="unknown")
        triton_grpc.async_stream_infer("simple", [bad_shape, simple_inputs(grpcclient)[1]], request_id="bad")
        triton_grpc.async_stream_infer("simple", simple_inputs(grpcclient), request_id="ok2")
        answers = got.take(4)
    (first, e1), (r2, e2), (r3, e3), (last, e4) = answers
    assert e1 is None and first.get_response().id == "ok1"
    assert r2 is None and "unknown model" in str(e2) and "nope" in str(e2)
    assert r3 is None and "INPUT0" in str(e3)
    assert e4 is None and last.get_response().id == "ok2"


def test_stream_error_names_the_request(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """The raw wire form of an error: error_message, and the request's id and model in infer_response."""
    bad = pb.ModelInferRequest(model_name="nope", id="x1")
    undecodable = pb.ModelInferRequest(model_name="simple", id="x2")
    undecodable.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    undecodable.raw_input_contents.append(b"\x00" * 3)  # not 64 bytes
    replies = list(stub.ModelStreamInfer(iter([bad, undecodable]), timeout=TIMEOUT))
    assert [r.error_message != "" for r in replies] == [True, True]
    assert [(r.infer_response.id, r.infer_response.model_name) for r in replies] == [("x1", "nope"), ("x2", "simple")]
    assert all(r.infer_response.parameters["triton_final_response"].bool_param for r in replies)
    assert not any(r.infer_response.outputs for r in replies)


@pytest.mark.parametrize("model", ["repeat", "repeat_async"])
def test_stream_decoupled(triton_grpc: grpcclient.InferenceServerClient, model: str) -> None:
    """A decoupled model: one response per yield, flagged not final; the empty final response on request."""
    with stream(triton_grpc) as got:
        triton_grpc.async_stream_infer(model, repeat_input([7, 8, 9]), request_id="three")
        answers = got.take(3)
        assert got.nothing_more()  # no final response unless asked for
        triton_grpc.async_stream_infer(model, repeat_input([5, 6]), request_id="two",
                                       enable_empty_final_response=True)
        flagged = got.take(3)
        triton_grpc.async_stream_infer(model, repeat_input([]), request_id="none",
                                       enable_empty_final_response=True)
        empty = got.take(1)
        triton_grpc.async_stream_infer(model, repeat_input([]), request_id="silent")
        assert got.nothing_more()
    assert [e for _, e in answers + flagged + empty] == [None] * 7
    assert [r.as_numpy("OUT").tolist() for r, _ in answers] == [[7], [8], [9]]
    assert [r.as_numpy("IDX").tolist() for r, _ in answers] == [[0], [1], [2]]
    assert [final_flag(r) for r, _ in answers] == [False, False, False]
    assert [r.get_response().id for r, _ in flagged] == ["two"] * 3
    assert [final_flag(r) for r, _ in flagged] == [False, False, True]
    final = flagged[2][0].get_response()
    assert (final.model_name, final.model_version, len(final.outputs)) == (model, "1", 0)
    assert [(r.get_response().id, final_flag(r), len(r.get_response().outputs)) for r, _ in empty] == [
        ("none", True, 0)]


def test_stream_decoupled_error_midway(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """The responses before the failure arrive, then the error; the stream still answers."""
    with stream(triton_grpc) as got:
        triton_grpc.async_stream_infer("repeat", repeat_input([1, 2, -3, 4]), request_id="fails")
        answers = got.take(3)
        triton_grpc.async_stream_infer("repeat", repeat_input([10]), request_id="after")
        after = got.take(1)
    assert [r.as_numpy("OUT").tolist() for r, _ in answers[:2]] == [[1], [2]]
    assert answers[2][0] is None and "negative value -3" in str(answers[2][1])
    assert after[0][1] is None and after[0][0].as_numpy("OUT").tolist() == [10]


def test_stream_concurrent_requests_keep_order(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """Requests of one stream run concurrently (a batching model batches them) and answer in request order."""
    with stream(triton_grpc) as got:
        for i in range(24):
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
            tensor.set_data_from_numpy(np.full((1, 4), i, dtype=np.int32))
            triton_grpc.async_stream_infer("counter", [tensor], request_id=str(i))
        answers = got.take(24)
    assert [r.get_response().id for r, _ in answers] == [str(i) for i in range(24)]
    assert [r.as_numpy("DOUBLE").tolist() for r, _ in answers] == [[[2 * i] * 4] for i in range(24)]


def test_stream_bad_empty_final_flag(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """triton_enable_empty_final_response must be a bool_param, as in Triton."""
    message = pb.ModelInferRequest(model_name="repeat", id="flag")
    message.inputs.add(name="IN", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    message.parameters["triton_enable_empty_final_response"].int64_param = 1
    replies = list(stub.ModelStreamInfer(iter([message]), timeout=TIMEOUT))
    assert len(replies) == 1 and "triton_enable_empty_final_response" in replies[0].error_message


def test_decoupled_over_unary_is_unimplemented(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub,
                                               triton_grpc: grpcclient.InferenceServerClient) -> None:
    """As Triton: a decoupled model needs the stream (UNIMPLEMENTED / 501), over gRPC and REST."""
    with pytest.raises(InferenceServerException) as caught:
        triton_grpc.infer("repeat", repeat_input([1]))
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED" and "decoupled" in caught.value.message()
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    assert "decoupled" in assert_error_body(http.post("/v2/models/repeat_async/infer", json=body), 501)
    check_simple(http, stub)


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


# --- dynamic batching over the wire ----------------------------------------------------------------------------


def counter_stats(http: httpx.Client, model: str = "counter") -> dict[str, Any]:
    stats: dict[str, Any] = http.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return stats


def test_batching_under_concurrent_load(http: httpx.Client, triton_http: httpclient.InferenceServerClient) -> None:
    """64 requests in flight at once (tritonclient's async_infer, 16 connections), 1 or 2 rows each: everyone
    gets their own rows back; the model ran fewer times than it was asked."""
    before = counter_stats(http)
    pending = []
    for i in range(64):
        rows = 1 + i % 2
        x = (np.arange(rows * 4, dtype=np.int32).reshape(rows, 4) + 1000 * i).astype(np.int32)
        tensor = httpclient.InferInput("INPUT0", [rows, 4], "INT32")
        tensor.set_data_from_numpy(x, binary_data=i % 3 == 0)
        pending.append((i, x, triton_http.async_infer("counter", [tensor], request_id=f"r{i}")))
    for i, x, call in pending:
        result = call.get_result(timeout=TIMEOUT)
        assert result.get_response()["id"] == f"r{i}"
        assert result.as_numpy("DOUBLE").tolist() == (x * 2).tolist()
        assert result.as_numpy("ROWSUM").tolist() == x.sum(axis=1, keepdims=True).tolist()
    after = counter_stats(http)
    requests = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 64 and inferences == 96
    assert executions < requests, (executions, requests)
    assert any(b["batch_size"] > 2 for b in after["batch_stats"]), after["batch_stats"]
    assert all(b["batch_size"] <= 8 for b in after["batch_stats"])


def test_batching_keeps_parameters_and_outputs_per_request(triton_grpc: grpcclient.InferenceServerClient) -> None:
    """Different parameters never share a call; each request gets the outputs it asked for, no others."""

    def call(i: int) -> None:
        x = np.full((1, 4), i, dtype=np.int32)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
        tensor.set_data_from_numpy(x)
        scale = 2 + i % 3
        wanted = [["DOUBLE"], ["ROWSUM"], ["ROWSUM", "DOUBLE"], []][i % 4]
        outputs = [grpcclient.InferRequestedOutput(name) for name in wanted] or None
        result = triton_grpc.infer("counter", [tensor], outputs=outputs, parameters={"scale": scale})
        names = [o.name for o in result.get_response().outputs]
        assert names == (wanted or ["DOUBLE", "ROWSUM"])
        if "DOUBLE" in names:
            assert result.as_numpy("DOUBLE").tolist() == (x * scale).tolist()
        if "ROWSUM" in names:
            assert result.as_numpy("ROWSUM").tolist() == [[4 * i]]

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(call, range(48)))


def test_batching_shapes_that_cannot_batch_run_alone(http: httpx.Client) -> None:
    """Requests of different lengths arrive together: each runs in a call of its own, and is answered right."""
    before = counter_stats(http, "ragged")
    barrier = threading.Barrier(6)

    def call(length: int) -> None:
        data = [float(length)] * length
        barrier.wait(timeout=TIMEOUT)
        with httpx.Client(base_url=str(http.base_url), timeout=TIMEOUT, trust_env=False) as client:
            body = {"inputs": [{"name": "INPUT0", "shape": [1, length], "datatype": "FP32", "data": data}]}
            response = client.post("/v2/models/ragged/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [length + 1.0] * length

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(call, range(1, 7)))
    after = counter_stats(http, "ragged")
    assert after["execution_count"] - before["execution_count"] == 6
    assert after["inference_count"] - before["inference_count"] == 6


def test_batching_rejects_too_many_rows(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [9, 4], "datatype": "INT32", "data": list(range(36))}]}
    assert_error_body(http.post("/v2/models/counter/infer", json=body), 400)


# --- dynamic batching in-process: the queue's rules ------------------------------------------------------------


class Recorder(Model):
    """Batches; records the row count of every call; OUT = IN + 1 (`delay` seconds per call)."""

    name = "recorder"
    inputs = (TensorSpec("IN", "INT64", [-1]),)
    outputs = (TensorSpec("OUT", "INT64", [-1]),)
    max_batch_size = 8

    def __init__(self, delay_us: int = 0, preferred: tuple[int, ...] = (), gated: bool = False) -> None:
        super().__init__(dynamic_batching=DynamicBatching(delay_us, preferred))
        self.calls: list[int] = []
        self.entered = asyncio.Event()  # set when a call starts
        self.gate = asyncio.Event()  # a gated model's calls wait for it
        if not gated:
            self.gate.set()

    async def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(int(inputs["IN"].shape[0]))
        self.entered.set()
        await self.gate.wait()
        if parameters.get("fail"):
            raise RuntimeError("asked to fail")
        return {"OUT": inputs["IN"] + 1}


async def dataplane(model: Model) -> DataPlane:
    repository = ModelRepository()
    repository.add(model)
    await repository.load_all()
    return DataPlane(repository, Settings())


def rows_request(start: int, rows: int = 1, width: int = 2, **parameters: Any) -> InferRequest:
    data = np.arange(start, start + rows * width, dtype=np.int64).reshape(rows, width)
    return InferRequest("recorder", inputs=[Tensor("IN", "INT64", [rows, width], data)], parameters=parameters,
                        outputs=[RequestedOutput("OUT")])


def check(response: InferResponse | BaseException, request: InferRequest) -> None:
    assert isinstance(response, InferResponse), response
    data = response.outputs[0].data
    assert data is not None and request.inputs[0].data is not None
    assert data.tolist() == (request.inputs[0].data + 1).tolist()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_queue_fills_a_batch_within_the_delay() -> None:
    model = Recorder(delay_us=200_000)
    dp = await dataplane(model)
    requests = [rows_request(10 * i, rows=1 + i % 2) for i in range(5)]  # 1+2+1+2+1 = 7 rows
    responses = await asyncio.gather(*(dp.model_infer(r) for r in requests))
    for response, request in zip(responses, requests, strict=True):
        check(response, request)
    assert model.calls == [7]
    stats = dp.statistics.for_model("recorder", "1")
    assert (stats.execution_count, stats.inference_count, stats.success.count) == (1, 7, 5)


@pytest.mark.anyio
async def test_queue_closes_a_full_batch_and_a_preferred_one_early() -> None:
    model = Recorder(delay_us=3_600_000_000, preferred=(4,))  # an hour: a batch that waited for it never returns
    dp = await dataplane(model)
    full = [rows_request(i) for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*(dp.model_infer(r) for r in full)), 60)
    assert model.calls == [8]
    preferred = [rows_request(i, rows=2) for i in range(3)]  # 6 rows: the first 4 go at once
    waiting = [asyncio.ensure_future(dp.model_infer(r)) for r in preferred]
    responses = await asyncio.wait_for(asyncio.gather(*waiting[:2]), 60)
    for response, request in zip(responses, preferred, strict=False):
        check(response, request)
    assert model.calls == [8, 4] and not waiting[2].done()
    waiting[2].cancel()


@pytest.mark.anyio
async def test_queue_separates_shapes_parameters_and_failures() -> None:
    model = Recorder(delay_us=100_000)
    dp = await dataplane(model)
    requests = [rows_request(0, width=2), rows_request(5, width=3), rows_request(9, width=2),
                rows_request(20, width=2, mode="a"), rows_request(30, width=2, mode="a"),
                rows_request(40, width=2, fail=True)]
    results = await asyncio.gather(*(dp.model_infer(r) for r in requests), return_exceptions=True)
    for result, request in zip(results[:5], requests, strict=False):
        check(result, request)
    failure = results[5]
    assert isinstance(failure, OipError) and failure.kind is ErrorKind.MODEL_FAILURE
    assert "asked to fail" in failure.message
    assert sorted(model.calls) == [1, 1, 2, 2]  # width 3 alone, fail=True alone, two pairs


@pytest.mark.anyio
async def test_queue_forms_batches_under_load_without_delay() -> None:
    """With no delay, the first request runs at once and the ones arriving meanwhile go together next."""
    model = Recorder(delay_us=0, gated=True)
    dp = await dataplane(model)
    first = asyncio.ensure_future(dp.model_infer(rows_request(0)))
    await asyncio.wait_for(model.entered.wait(), 30)  # the first request runs, alone
    rest = [rows_request(i) for i in range(1, 6)]
    waiting = [asyncio.ensure_future(dp.model_infer(r)) for r in rest]
    for _ in range(20):  # let them all reach the queue (no clock: the loop runs each ready task once per turn)
        await asyncio.sleep(0)
    model.gate.set()
    responses = await asyncio.gather(*waiting)
    check(await first, rows_request(0))
    for response, request in zip(responses, rest, strict=True):
        check(response, request)
    assert model.calls == [1, 5]


@pytest.mark.anyio
async def test_queue_survives_a_cancelled_caller() -> None:
    model = Recorder(delay_us=100_000)
    dp = await dataplane(model)
    doomed = asyncio.ensure_future(dp.model_infer(rows_request(0)))
    for _ in range(20):  # it reaches the queue, where it waits for the delay
        await asyncio.sleep(0)
    doomed.cancel()
    kept = rows_request(7)
    check(await dp.model_infer(kept), kept)
    assert model.calls == [1]


# --- the generated clients -------------------------------------------------------------------------------------


def test_generated_client_streams(server: Server) -> None:
    """The generated gRPC client's stream_infer: one result per request, several for a decoupled model."""
    from oip.client.grpc import GrpcClient
    from oip.client.tensors import InferRequest as ClientRequest

    with GrpcClient(server.target) as client:
        results = list(client.stream_infer("simple", [
            ClientRequest({"INPUT0": SIMPLE_A + i, "INPUT1": SIMPLE_B}, id=str(i)) for i in range(3)]))
        assert [r.id for r in results] == ["0", "1", "2"]
        assert [r.as_numpy("OUTPUT0").tolist() for r in results] == [(SIMPLE_A + i + 1).tolist() for i in range(3)]
        flag = {"triton_enable_empty_final_response": True}
        decoupled = list(client.stream_infer("repeat", [ClientRequest({"IN": np.array([4, 5, 6], np.int32)},
                                                                      parameters=flag)]))
        assert [r.as_numpy("OUT").tolist() for r in decoupled[:3]] == [[4], [5], [6]]
        assert [r.parameters["triton_final_response"] for r in decoupled] == [False, False, False, True]
        assert decoupled[3].names == []


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
