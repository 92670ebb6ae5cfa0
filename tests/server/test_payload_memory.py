"""Large tensors are not copied more than the protocol needs: over REST binary and gRPC raw, the input the model
sees is a read-only view of the request's bytes, and the Python memory one 4 MB request holds at its peak stays
under a bound a copy of the payload more would break.

A server runs with tracemalloc on (`PYTHONTRACEMALLOC`) and two models besides: `probe` answers its FP32 input as
OUTPUT0 and, as OUTPUT1, whether that input owns its data, whether it is writable, and the size of the buffer it is
a view of (the request's whole body or message: more than the tensor's bytes); `traced` answers the growth of
tracemalloc's peak over the memory traced when it was last called, and starts a new measurement. What the bounds
allow (payload P; `make bench` measures the process's RSS, this counts what Python allocates):
- REST binary: the body is received into one buffer of its declared size (P) and the answer is written from the
  model's array: about 1x P. Holding the body's pieces and their concatenation (2x), or joining the answer into one
  body (2x), breaks the bound of 1.5x.
- gRPC raw: grpcio hands the message over as one bytes object built from its pieces (2x, grpcio's own), the inputs
  are views of it and the reply is the one bytes object grpcio sends (request + reply: 2x). One copy more (3x)
  breaks the bound of 2.5x.
And in process: large binary outputs go out as views of the model's arrays only where the HTTP server says it
writes such bodies as they are (`http.BUFFER_BODIES`), as one body of bytes elsewhere. About 10 s.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.server.rest import BinaryParts, encode_infer_response
from oip.server.types import InferResponse, Tensor
from serving import Server, running
from starlette.responses import Response

MIB = 1 << 20
ELEMENTS = 1 << 20  # 4 MiB of FP32
LIMIT = 64 * MIB

PROBE = '''
import numpy as np

from oip.server.model import Model, TensorSpec


class Probe(Model):
    inputs = [TensorSpec("INPUT0", "FP32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "FP32", [-1]), TensorSpec("OUTPUT1", "INT64", [3])]
    inline = True

    def infer(self, inputs, parameters):
        array = inputs["INPUT0"]
        base = array
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        size = -1 if isinstance(base, np.ndarray) else len(memoryview(base).cast("B"))
        facts = [int(array.flags.owndata), int(array.flags.writeable), size]
        return {"OUTPUT0": array, "OUTPUT1": np.array(facts, dtype=np.int64)}
'''

TRACED = '''
import tracemalloc

import numpy as np

from oip.server.model import Model, TensorSpec

_since = [0]


class Traced(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [1])]
    outputs = [TensorSpec("OUTPUT0", "INT64", [1])]

    def infer(self, inputs, parameters):
        current, peak = tracemalloc.get_traced_memory()
        growth = peak - _since[0]
        tracemalloc.reset_peak()
        _since[0] = tracemalloc.get_traced_memory()[0]
        return {"OUTPUT0": np.array([growth], dtype=np.int64)}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("payload_memory")
    repository = root / "models"
    for name, cls, source in (("probe", "Probe", PROBE), ("traced", "Traced", TRACED)):
        (repository / name).mkdir(parents=True)
        (repository / name / "model.toml").write_text(f'class = "model:{cls}"\n')
        (repository / name / "model.py").write_text(textwrap.dedent(source))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONTRACEMALLOC", "1")
        with running(repository, root / "work", "--max-request-bytes", str(LIMIT), ready=("probe", "traced")) as s:
            yield s


def _data(elements: int) -> np.ndarray:
    return np.random.default_rng(elements).random(elements, dtype=np.float32)


def rest_binary(http: httpx.Client, data: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Infer `probe` over REST with binary input and outputs: OUTPUT0 and the facts (OUTPUT1)."""
    header = orjson.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [data.size],
                    "parameters": {"binary_data_size": data.nbytes}}],
        "parameters": {"binary_data_output": True},
    })
    response = http.post("/v2/models/probe/infer", content=header + data.tobytes(), headers={
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-length"] == str(len(response.content))
    length = int(response.headers["inference-header-content-length"])
    head = orjson.loads(response.content[:length])
    out, offset = {}, length
    for output in head["outputs"]:
        size = output["parameters"]["binary_data_size"]
        dtype = np.float32 if output["datatype"] == "FP32" else np.int64
        out[output["name"]] = np.frombuffer(response.content[offset : offset + size], dtype=dtype)
        offset += size
    assert offset == len(response.content)
    return out["OUTPUT0"], out["OUTPUT1"].tolist()


def grpc_raw(channel: grpc.Channel, data: np.ndarray) -> tuple[np.ndarray, list[int]]:
    request = pb.ModelInferRequest(model_name="probe")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[data.size])
    request.raw_input_contents.append(data.tobytes())
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
    reply: Any = call(request, timeout=60)
    names = [o.name for o in reply.outputs]
    raw = dict(zip(names, reply.raw_output_contents, strict=True))
    return np.frombuffer(raw["OUTPUT0"], dtype=np.float32), np.frombuffer(raw["OUTPUT1"], dtype=np.int64).tolist()


def _channel(server: Server) -> grpc.Channel:
    return grpc.insecure_channel(server.target, options=[
        ("grpc.max_send_message_length", LIMIT), ("grpc.max_receive_message_length", LIMIT)])


@pytest.mark.parametrize("elements", [256, 64 * 1024, ELEMENTS])
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_the_model_sees_a_view_of_the_request(server: Server, transport: str, elements: int) -> None:
    data = _data(elements)
    if transport == "rest":
        with server.http_client() as http:
            out, (owndata, writeable, base) = rest_binary(http, data)
    else:
        with _channel(server) as channel:
            out, (owndata, writeable, base) = grpc_raw(channel, data)
    np.testing.assert_array_equal(out, data)
    assert (owndata, writeable) == (0, 0)  # a read-only view, not an array of its own
    if transport == "grpc" and data.nbytes < 1 << 16:
        # A small message is parsed by protobuf: the view is of its raw_input_contents entry, exactly the tensor.
        assert base == data.nbytes
    else:  # a view of the request's body or message (header and all), not of a copy of the tensor
        assert base > data.nbytes


def _traced(server: Server) -> int:
    """The growth of the server's traced Python memory peak since the last call."""
    with server.http_client() as http:
        response = http.post("/v2/models/traced/infer", json={
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [0]}]})
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize(("transport", "bound"), [("rest", 1.5), ("grpc", 2.5)])
def test_one_request_holds_at_most_what_the_protocol_needs(server: Server, transport: str, bound: float) -> None:
    data = _data(ELEMENTS)
    with server.http_client() as http, _channel(server) as channel:
        for _ in range(2):  # the first request of a kind may set up what the next ones reuse
            out = rest_binary(http, data)[0] if transport == "rest" else grpc_raw(channel, data)[0]
        np.testing.assert_array_equal(out, data)
        growths = []
        for _ in range(3):
            _traced(server)
            out = rest_binary(http, data)[0] if transport == "rest" else grpc_raw(channel, data)[0]
            growths.append(_traced(server))
            np.testing.assert_array_equal(out, data)
    payload = data.nbytes
    assert min(growths) > 0.9 * payload, growths  # the measurement sees the request at all
    assert max(growths) <= bound * payload, f"peak growth {[round(g / payload, 2) for g in growths]} x the payload"


def test_rest_answers_small_and_large_binary_outputs_alike(server: Server) -> None:
    """Below 64 KiB of binary output the answer is one body, from 64 KiB on it is written in parts: the same
    bytes either way, with a Content-Length."""
    with server.http_client() as http:
        for elements in (16 * 1024 - 1, 16 * 1024, 16 * 1024 + 1):
            data = _data(elements)
            out, facts = rest_binary(http, data)
            np.testing.assert_array_equal(out, data)
            assert facts[:2] == [0, 0]


def test_large_binary_outputs_are_sent_from_the_arrays_only_where_the_server_takes_buffers() -> None:
    """The standalone server's HTTP protocol advertises `http.BUFFER_BODIES`: then 64 KiB or more of binary outputs
    go out as views of the arrays. Elsewhere (Ray Serve's proxy, uvicorn's h11 protocol) the answer is one body of
    bytes, as ASGI asks: the same bytes."""
    first, second = np.arange(1 << 14, dtype=np.float32), np.arange(1 << 14, dtype=np.int32)
    response = InferResponse(model_name="m", model_version="1", outputs=[
        Tensor("A", "FP32", [first.size], first), Tensor("B", "INT32", [second.size], second)])
    parts = encode_infer_response(response, {}, True, parts=True)
    assert type(parts) is BinaryParts and len(parts.parts) == 3
    assert np.shares_memory(np.frombuffer(parts.parts[1], dtype=np.uint8), first)
    assert np.shares_memory(np.frombuffer(parts.parts[2], dtype=np.uint8), second)
    whole = encode_infer_response(response, {}, True)
    assert isinstance(whole, Response) and type(whole) is not BinaryParts and isinstance(whole.body, bytes)
    assert whole.body == b"".join(bytes(part) for part in parts.parts)
    assert dict(whole.raw_headers) == dict(parts.raw_headers)
    small = InferResponse(model_name="m", model_version="1", outputs=[Tensor("A", "FP32", [16], first[:16])])
    one = encode_infer_response(small, {}, True, parts=True)
    assert isinstance(one, Response) and type(one) is not BinaryParts  # below 64 KiB: one body
