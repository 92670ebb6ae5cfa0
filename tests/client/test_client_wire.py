"""The clients' wire forms without a server: what `infer` sends is what the generated server's decoders read,
what the server's encoders write is what the clients read back, over REST JSON, REST binary, gRPC raw and gRPC
typed contents; and the small pieces around them (inputs, results, health answers, error mapping)."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import ml_dtypes
import numpy as np
import orjson
import pytest
from oip import codec, datatypes, models
from oip.client import errors, tensors
from oip.client import grpc as client_grpc
from oip.client.rest import RestClient
from oip.grpc import grpc_service_pb2 as pb
from oip.server import grpc as server_grpc
from oip.server import rest as server_rest
from oip.server.settings import Settings
from oip.server.types import InferResponse, Tensor

SETTINGS = Settings()


def sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"a", b"\x00\xff"], [b"", "é".encode()]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    if datatype == "BF16":
        return np.array([[1.0, -2.5], [0.0, 3.140625]], dtype=ml_dtypes.bfloat16)
    dtype = codec.dtype_of(datatype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max], [0, 1]], dtype=dtype)
    return np.array([[0.5, -1.25], [np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal]], dtype=dtype)


DATATYPES = list(datatypes.NAMES)


def same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype == object:
        assert got.tolist() == expected.tolist()
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_rest_requests_decode_on_the_server(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    prepared = tensors.prepare_inputs({"X": array})
    assert prepared[0].datatype == datatype
    outputs = [tensors.RequestedOutput("Y", parameters={"classification": 2}),
               tensors.RequestedOutput("Z", binary=True)]
    body, headers = tensors.encode_rest_request(prepared, outputs, request_id="r1", parameters={"p": 1.5},
                                                binary=binary)
    request, listed, default_binary = server_rest.decode_infer_request(
        body, headers.get(tensors.HEADER_LENGTH), SETTINGS)
    [tensor] = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, [2, 2])
    assert tensor.data is not None
    same(tensor.data, array if datatype != "BYTES" else np.array(array.tolist(), dtype=object))
    assert request.id == "r1" and request.parameters == {"p": 1.5}
    assert [(o.name, o.parameters) for o in request.outputs] == [("Y", {"classification": 2}), ("Z", {})]
    assert listed == {"Y": binary, "Z": True} and default_binary is False
    json_only = not binary and datatypes.BY_NAME[datatype].json and datatype != "BYTES"
    assert (tensors.HEADER_LENGTH in headers) is not json_only or datatype == "BYTES"


def test_rest_binary_without_outputs_asks_for_binary_outputs() -> None:
    body, headers = tensors.encode_rest_request(tensors.prepare_inputs({"X": np.ones(2, np.float32)}), binary=True)
    _, listed, default_binary = server_rest.decode_infer_request(body, headers[tensors.HEADER_LENGTH], SETTINGS)
    assert listed == {} and default_binary is True
    body, headers = tensors.encode_rest_request(tensors.prepare_inputs({"X": np.ones(2, np.float32)}))
    assert headers == {"Content-Type": "application/json"}
    assert orjson.loads(body) == {"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1.0, 1.0]}]}


def test_json_mode_sends_what_json_cannot_carry_as_binary() -> None:
    prepared = tensors.prepare_inputs({"A": np.ones(2, np.float16), "B": np.array([b"\xff"], dtype=object),
                                       "C": np.array(["ok"]), "D": np.arange(3, dtype=np.int64)})
    body, headers = tensors.encode_rest_request(prepared)
    header = orjson.loads(body[: int(headers[tensors.HEADER_LENGTH])])
    assert [("data" in t, t.get("parameters", {}).get("binary_data_size")) for t in header["inputs"]] == [
        (False, 4), (False, 5), (True, None), (True, None)]
    request, _, _ = server_rest.decode_infer_request(body, headers[tensors.HEADER_LENGTH], SETTINGS)
    assert [t.data.tolist() for t in request.inputs if t.data is not None] == [
        [1.0, 1.0], [b"\xff"], [b"ok"], [0, 1, 2]]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_rest_answers_decode_on_the_client(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    if not binary and not datatypes.BY_NAME[datatype].json:
        pytest.skip("no JSON form")
    if not binary and datatype == "BYTES":
        array = np.array([[b"a", b"\x00"], [b"", "é".encode()]], dtype=object)  # JSON carries UTF-8 only
    response = InferResponse("m", "2", id="i", parameters={"q": "s"},
                             outputs=[Tensor("Y", datatype, [2, 2], array, {"extra": 1})])
    answer = server_rest.encode_infer_response(response, {}, binary)
    result = tensors.decode_rest_response(bytes(answer.body), answer.headers.get(tensors.HEADER_LENGTH))
    assert (result.model_name, result.model_version, result.id, result.parameters) == ("m", "2", "i", {"q": "s"})
    assert result.outputs == (tensors.OutputMetadata("Y", datatype, (2, 2), {"extra": 1}),)
    same(result.as_numpy("Y"), array)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_requests_decode_on_the_server(datatype: str) -> None:
    array = sample(datatype)
    message = client_grpc.encode_infer_request(
        "m", "3", tensors.prepare_inputs([tensors.Tensor("X", array, parameters={"s": "t", "big": 2**64 - 1})]),
        [tensors.RequestedOutput("Y", {"n": 1})], request_id="r", parameters={"f": 0.5, "b": True},
    )
    wire = pb.ModelInferRequest.FromString(message.SerializeToString())
    request = server_grpc.decode_infer_request(wire, SETTINGS)
    [tensor] = request.inputs
    assert tensor.data is not None
    same(tensor.data, array if datatype != "BYTES" else np.array(array.tolist(), dtype=object))
    assert tensor.parameters == {"s": "t", "big": 2**64 - 1}
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "r")
    assert request.parameters == {"f": 0.5, "b": True}
    assert [(o.name, o.parameters) for o in request.outputs] == [("Y", {"n": 1})]


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_answers_decode_raw_and_typed(datatype: str) -> None:
    array = sample(datatype)
    response = InferResponse("m", "1", outputs=[Tensor("Y", datatype, [2, 2], array, {"k": 7}),
                                                Tensor("Z", "INT32", [1], np.array([5], np.int32))])
    raw = pb.ModelInferResponse.FromString(server_grpc.encode_infer_response(response).SerializeToString())
    result = client_grpc.decode_infer_response(raw)
    same(result["Y"], array)
    assert result.output("Y").parameters == {"k": 7} and result["Z"].tolist() == [5]
    if datatypes.BY_NAME[datatype].contents is None:
        return
    typed = pb.ModelInferResponse(model_name="m", model_version="1")  # as MLServer answers a typed request
    for name, values, dt in (("Y", array, datatype), ("Z", np.array([5], np.int32), "INT32")):
        out = typed.outputs.add(name=name, datatype=dt, shape=list(values.shape))
        field, items = codec.to_contents(values, dt)
        getattr(out.contents, field).extend(items)
    result = client_grpc.decode_infer_response(typed)
    same(result["Y"], array)
    assert result["Z"].tolist() == [5]


def test_grpc_mixed_raw_and_typed_outputs() -> None:
    message = pb.ModelInferResponse(model_name="m")
    message.outputs.add(name="A", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    message.outputs.add(name="B", datatype="FP32", shape=[1])
    message.raw_output_contents.append(np.array([0.5], np.float32).tobytes())
    result = client_grpc.decode_infer_response(message)
    assert result["A"].tolist() == [1, 2] and result["B"].tolist() == [0.5]


def test_bad_answers_are_response_errors() -> None:
    with pytest.raises(errors.ResponseError, match="not valid JSON"):
        tensors.decode_rest_response(b"{", None)
    with pytest.raises(errors.ResponseError, match="binary_data_size"):
        tensors.decode_rest_response(
            b'{"outputs":[{"name":"Y","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}}]}', None)
    result = tensors.decode_rest_response(b'{"outputs":[{"name":"Y","datatype":"FP32","shape":[3],"data":[1,2]}]}',
                                          None)
    with pytest.raises(errors.ResponseError, match="3 elements"):
        result.as_numpy("Y")
    message = pb.ModelInferResponse()
    message.outputs.add(name="Y", datatype="FP32", shape=[2])
    with pytest.raises(errors.ResponseError, match="no data"):
        client_grpc.decode_infer_response(message).as_numpy("Y")


def test_json_answers_are_checked() -> None:
    def decoded(data: Any, datatype: str) -> np.ndarray:
        body = orjson.dumps({"outputs": [{"name": "Y", "datatype": datatype, "shape": [len(data)], "data": data}]})
        return tensors.decode_rest_response(body, None).as_numpy("Y")

    assert decoded([1, 2], "INT8").dtype == np.int8
    assert decoded([1.5, 2], "FP32").tolist() == [1.5, 2.0]
    assert decoded([True, False], "BOOL").tolist() == [True, False]
    for bad, datatype in (([300], "INT8"), ([1.5], "INT32"), ([True], "INT32"), (["x"], "FP32"), ([1], "BOOL")):
        with pytest.raises(errors.ResponseError):
            decoded(bad, datatype)


def test_inputs() -> None:
    [a, b, c, d, e] = tensors.prepare_inputs({
        "a": np.array(["x", "yz"]), "b": [b"nul\x00", b"x"], "c": [[1, 2], [3, 4]], "d": 2.5,
        "e": np.array([1, 2], dtype=ml_dtypes.bfloat16),
    })
    assert (a.datatype, a.shape) == ("BYTES", [2])
    assert (b.datatype, b.array.tolist()) == ("BYTES", [b"nul\x00", b"x"])  # trailing NUL kept
    assert (c.datatype, c.shape) == ("INT64", [2, 2])
    assert (d.datatype, d.shape) == ("FP64", [])
    assert e.datatype == "BF16"
    with pytest.raises(errors.InvalidArgument, match="mapping of name to array"):
        tensors.prepare_inputs([np.ones(2)])  # type: ignore[list-item]
    with pytest.raises(errors.InvalidArgument, match="complex"):
        tensors.prepare_inputs({"x": np.ones(2, np.complex64)})


def test_result_api() -> None:
    result = tensors.InferResult(model_name="m", model_version="1", id="", parameters={}, entries=[
        ("A", "INT32", (2,), {}, tensors.RAW, np.array([1, 2], np.int32).tobytes()),
        ("B", "BYTES", (1,), {"p": 1}, tensors.JSON, ["x"]),
        ("C", "FP32", (0,), {}, tensors.NONE, None),
    ])
    assert result.names == ["A", "B", "C"] and len(result) == 3 and list(result) == ["A", "B", "C"]
    assert "A" in result and "Z" not in result
    assert result.output("B") == tensors.OutputMetadata("B", "BYTES", (1,), {"p": 1})
    assert {k: v.tolist() for k, v in result.as_dict().items()} == {"A": [1, 2], "B": [b"x"], "C": []}
    assert result.as_numpy("A") is result["A"]  # decoded once
    with pytest.raises(KeyError, match="outputs: A, B, C"):
        result.as_numpy("Z")
    assert "A: INT32[2]" in repr(result)


def test_health_answers_of_other_servers() -> None:
    answers = {
        "/v2/health/live": httpx.Response(200),  # MLServer: 200, no body
        "/v2/health/ready": httpx.Response(503, json={"ready": False}),  # this package's server
        "/v2/models/m/ready": httpx.Response(400),  # Triton: not ready, no body
        "/v2/models/n/ready": httpx.Response(404, json={"error": "unknown model n"}),
    }
    with RestClient("http://x", transport=httpx.MockTransport(lambda r: answers[r.url.path])) as client:
        assert client.server_live().live is True
        assert client.server_ready().ready is False
        assert client.model_ready("m") == models.ModelReadyResponse(name="m", ready=False)
        with pytest.raises(errors.NotFound, match="unknown model n"):
            client.model_ready("n")


def test_rest_answers_are_completed_with_defaults() -> None:
    stats = {"model_stats": [{"name": "m", "version": "1", "inference_stats": {"success": {"count": 2}}}]}
    with RestClient("http://x", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=stats))) as client:
        [entry] = client.model_statistics("m").model_stats
    assert entry.inference_count == 0 and entry.inference_stats.success.ns == 0
    assert entry.inference_stats.fail is None  # a message the answer does not have stays absent
    with RestClient("http://x", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=[1]))) as client,\
            pytest.raises(errors.ResponseError):
        client.server_metadata()


@pytest.mark.parametrize(("status", "kind"), [
    (400, errors.InvalidArgument), (401, errors.Unauthenticated), (403, errors.PermissionDenied),
    (404, errors.NotFound), (405, errors.Unimplemented), (409, errors.AlreadyExists), (413, errors.TooLarge),
    (422, errors.InvalidArgument), (500, errors.ServerError), (501, errors.Unimplemented),
    (503, errors.Unavailable), (504, errors.DeadlineExceeded), (418, errors.OipClientError),
    (599, errors.ServerError),
])
def test_http_statuses(status: int, kind: type[errors.OipClientError]) -> None:
    error = errors.from_http(status, b'{"error": "why"}')
    assert type(error) is kind and error.status == status and error.message == "why" and error.code is None
    assert str(error) == f"[HTTP {status}] why"


def test_http_messages() -> None:
    assert errors.from_http(422, b'{"detail": [{"msg": "x"}]}').message == '[{"msg":"x"}]'
    assert errors.from_http(500, b"plain text").message == "plain text"
    assert errors.from_http(500, b"").message == "HTTP 500 with no message"


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(("code", "kind"), [
    ("INVALID_ARGUMENT", errors.InvalidArgument), ("NOT_FOUND", errors.NotFound),
    ("UNAVAILABLE", errors.Unavailable), ("UNIMPLEMENTED", errors.Unimplemented), ("INTERNAL", errors.ServerError),
    ("UNKNOWN", errors.ServerError), ("RESOURCE_EXHAUSTED", errors.TooLarge),
    ("DEADLINE_EXCEEDED", errors.DeadlineExceeded), ("ALREADY_EXISTS", errors.AlreadyExists),
    ("FAILED_PRECONDITION", errors.InvalidArgument), ("UNAUTHENTICATED", errors.Unauthenticated),
    ("PERMISSION_DENIED", errors.PermissionDenied), ("CANCELLED", errors.OipClientError),
])
def test_grpc_codes(code: str, kind: type[errors.OipClientError]) -> None:
    status = grpc.StatusCode[code]
    error = errors.from_grpc(FakeRpcError(status, "why"))
    assert type(error) is kind and error.code is status and error.status is None and error.message == "why"
    assert str(error) == f"[{code}] why"


# --- gRPC inference messages written and read around protobuf (large tensors) ----------------------------------

BIG = client_grpc.ZERO_COPY_BYTES


@pytest.mark.parametrize("elements", [3, BIG // 4 + 1, BIG])
def test_grpc_request_bytes_are_the_protobuf_message(elements: int) -> None:
    inputs = tensors.prepare_inputs([
        tensors.Tensor("A", np.arange(elements, dtype=np.float32), parameters={"p": 1}),
        tensors.Tensor("B", np.array(["x", "yz"])),
        tensors.Tensor("C", np.arange(6, dtype=">i8").reshape(2, 3)[:, ::2]),  # big-endian, not contiguous
    ])
    outputs = [tensors.RequestedOutput("Y", {"classification": 1})]
    wire = client_grpc.encode_infer_request_bytes("m", "2", inputs, outputs, request_id="i", parameters={"q": "r"})
    expected = client_grpc.encode_infer_request("m", "2", inputs, outputs, request_id="i", parameters={"q": "r"})
    assert pb.ModelInferRequest.FromString(wire) == expected
    request = server_grpc.decode_infer_request(pb.ModelInferRequest.FromString(wire), SETTINGS)
    assert [t.data.tolist() for t in request.inputs if t.data is not None] == [
        np.arange(elements, dtype=np.float32).tolist(), [b"x", b"yz"], [[0, 2], [3, 5]]]


@pytest.mark.parametrize("elements", [3, BIG])
def test_grpc_response_bytes_decode_as_views(elements: int) -> None:
    big = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    response = InferResponse("m", "1", id="i", parameters={"n": 2, "s": "t"}, outputs=[
        Tensor("Y", "FP32", [elements], big, {"k": True}),
        Tensor("Z", "BYTES", [2], np.array([b"a", b""], dtype=object)),
        Tensor("E", "INT8", [0], np.zeros(0, np.int8)),
    ])
    data = server_grpc.encode_infer_response(response).SerializeToString()
    result = client_grpc.decode_infer_response_bytes(data)
    assert (result.model_name, result.model_version, result.id) == ("m", "1", "i")
    assert result.parameters == {"n": 2, "s": "t"}
    np.testing.assert_array_equal(result["Y"], big)
    assert result["Z"].tolist() == [b"a", b""] and result["E"].shape == (0,)
    assert result.output("Y").parameters == {"k": True}
    if elements >= BIG:
        assert not result["Y"].flags.owndata and not result["Y"].flags.writeable  # a view of the answer's bytes


def test_grpc_response_bytes_with_unknown_fields_of_every_wire_type() -> None:
    message = pb.ModelInferResponse(model_name="m")
    message.outputs.add(name="Y", datatype="UINT8", shape=[BIG])
    message.raw_output_contents.append(bytes(range(256)) * (BIG // 256))
    def tag(number: int, wire: int) -> bytes:  # a varint: field numbers above 15 take two bytes
        key = number << 3 | wire
        return bytes([key]) if key < 0x80 else bytes([key & 0x7F | 0x80, key >> 7])

    extra = (tag(99, 0) + bytes([0x96, 0x01]) + tag(14, 1) + bytes(range(8)) + tag(98, 5) + bytes(range(4))
             + tag(15, 2) + bytes([2, 7, 7]))
    assert pb.ModelInferResponse.FromString(message.SerializeToString() + extra).model_name == "m"
    result = client_grpc.decode_infer_response_bytes(message.SerializeToString() + extra)
    assert result.model_name == "m" and result["Y"][:3].tolist() == [0, 1, 2] and result["Y"].size == BIG


@pytest.mark.parametrize("cut", [1, 7, 100])
def test_grpc_truncated_response_bytes_are_response_errors(cut: int) -> None:
    message = pb.ModelInferResponse(model_name="m")
    message.outputs.add(name="Y", datatype="UINT8", shape=[BIG])
    message.raw_output_contents.append(bytes(BIG))
    with pytest.raises(errors.ResponseError, match="not a valid"):
        client_grpc.decode_infer_response_bytes(message.SerializeToString()[:-cut])
    with pytest.raises(errors.ResponseError, match="not a valid"):
        client_grpc.decode_infer_response_bytes(b"\xff" * 10)


# --- where each operation's arguments go ------------------------------------------------------------------------

# method, args, kwargs, REST request, REST body, gRPC method, gRPC request (proto3 JSON)
ROUTES: list[tuple[str, tuple[Any, ...], dict[str, Any], str, Any, str, dict[str, Any]]] = [
    ("server_live", (), {}, "GET /v2/health/live", None, "ServerLive", {}),
    ("model_ready", ("m",), {}, "GET /v2/models/m/ready", None, "ModelReady", {"name": "m"}),
    ("model_ready", ("m", "2"), {}, "GET /v2/models/m/versions/2/ready", None, "ModelReady",
     {"name": "m", "version": "2"}),
    ("model_metadata", ("m", "2"), {}, "GET /v2/models/m/versions/2", None, "ModelMetadata",
     {"name": "m", "version": "2"}),
    ("model_config", ("m",), {}, "GET /v2/models/m/config", None, "ModelConfig", {"name": "m"}),
    ("model_statistics", (), {}, "GET /v2/models/stats", None, "ModelStatistics", {}),
    ("model_statistics", ("m",), {}, "GET /v2/models/m/stats", None, "ModelStatistics", {"name": "m"}),
    ("model_statistics", ("m", "3"), {}, "GET /v2/models/m/versions/3/stats", None, "ModelStatistics",
     {"name": "m", "version": "3"}),
    ("repository_index", (), {}, "POST /v2/repository/index", {}, "RepositoryIndex", {}),
    ("repository_index", (), {"ready": True}, "POST /v2/repository/index", {"ready": True}, "RepositoryIndex",
     {"ready": True}),
    ("repository_model_load", ("m",), {"parameters": {"config": "{}", "n": 2}}, "POST /v2/repository/models/m/load",
     {"parameters": {"config": "{}", "n": 2}}, "RepositoryModelLoad",
     {"model_name": "m", "parameters": {"config": {"string_param": "{}"}, "n": {"int64_param": "2"}}}),
    ("repository_model_unload", ("m",), {}, "POST /v2/repository/models/m/unload", {}, "RepositoryModelUnload",
     {"model_name": "m"}),
    ("system_shared_memory_status", ("r",), {}, "GET /v2/systemsharedmemory/region/r/status", None,
     "SystemSharedMemoryStatus", {"name": "r"}),
    ("system_shared_memory_register", ("r",), {"key": "/k", "byte_size": 8, "offset": 2},
     "POST /v2/systemsharedmemory/region/r/register", {"key": "/k", "offset": 2, "byte_size": 8},
     "SystemSharedMemoryRegister", {"name": "r", "key": "/k", "offset": "2", "byte_size": "8"}),
    ("system_shared_memory_unregister", (), {}, "POST /v2/systemsharedmemory/unregister", None,
     "SystemSharedMemoryUnregister", {}),
    ("system_shared_memory_unregister", ("r",), {}, "POST /v2/systemsharedmemory/region/r/unregister", None,
     "SystemSharedMemoryUnregister", {"name": "r"}),
    ("cuda_shared_memory_status", (), {}, "GET /v2/cudasharedmemory/status", None, "CudaSharedMemoryStatus", {}),
    ("cuda_shared_memory_register", ("g",), {"raw_handle": b"\x01\x02", "device_id": 1, "byte_size": 4},
     "POST /v2/cudasharedmemory/region/g/register", {"raw_handle": {"b64": "AQI="}, "device_id": 1, "byte_size": 4},
     "CudaSharedMemoryRegister", {"name": "g", "raw_handle": "AQI=", "device_id": "1", "byte_size": "4"}),
    ("cuda_shared_memory_unregister", ("g",), {}, "POST /v2/cudasharedmemory/region/g/unregister", None,
     "CudaSharedMemoryUnregister", {"name": "g"}),
]
ANSWERS = {  # a valid REST answer per response schema (the empty message's form)
    "/v2/health/live": {"live": True}, "/ready": {"ready": True}, "/stats": {"model_stats": []},
    "/config": {"name": "m"}, "/index": [], "/status": [], "/v2/models/m/versions/2": {"name": "m", "platform": ""},
}


@pytest.mark.parametrize(("method", "args", "kwargs", "rest", "body", "rpc", "message"), ROUTES)
def test_rest_routes(method: str, args: tuple[Any, ...], kwargs: dict[str, Any], rest: str, body: Any, rpc: str,
                     message: dict[str, Any]) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        path = request.url.path
        found = next((v for k, v in ANSWERS.items() if path.endswith(k)), None)
        return httpx.Response(200) if found is None else httpx.Response(200, json=found)

    with RestClient("http://x", transport=httpx.MockTransport(answer)) as client:
        getattr(client, method)(*args, **kwargs)
    [request] = sent
    assert f"{request.method} {request.url.path}" == rest
    assert (orjson.loads(request.content) if request.content else None) == body
    if body is not None:
        assert request.headers["content-type"] == "application/json"


@pytest.fixture(scope="module")
def recording_grpc() -> Any:
    from concurrent import futures

    from google.protobuf import json_format
    from oip.grpc import grpc_service_pb2_grpc as pb_grpc

    received: list[tuple[str, dict[str, Any]]] = []

    def method(name: str, reply: Any) -> Any:
        def call(self: Any, request: Any, context: Any) -> Any:
            received.append((name, json_format.MessageToDict(request, preserving_proto_field_name=True)))
            return reply()
        return call

    replies = {rpc: getattr(pb, rpc + "Response") for *_, rpc, _ in ROUTES}
    servicer = type("Recorder", (pb_grpc.GRPCInferenceServiceServicer,),
                    {name: method(name, reply) for name, reply in replies.items()})()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with client_grpc.GrpcClient(f"127.0.0.1:{port}", timeout=10) as client:
            yield client, received
    finally:
        server.stop(None)


@pytest.mark.parametrize(("method", "args", "kwargs", "rest", "body", "rpc", "message"), ROUTES)
def test_grpc_requests(recording_grpc: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], rest: str,
                       body: Any, rpc: str, message: dict[str, Any]) -> None:
    client, received = recording_grpc
    received.clear()
    getattr(client, method)(*args, **kwargs)
    assert received == [(rpc, message)]
