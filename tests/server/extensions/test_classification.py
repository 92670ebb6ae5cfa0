"""Triton's classification extension against the generated server, and the reserved parameter keys.

tritonclient (http and grpc) asks for the top classes as its users do (class_count), binary and JSON; the answers
agree over REST and gRPC; errors and the value formatting (in process). Parameters the extensions reserve (those
of the binary tensor data extension, `triton_*`) are refused when of the wrong type, and allowed where Triton
allows them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from extension_models import SCORES, counted_body, serve_models, texts
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server import InvalidRequest, Model, Tensor, TensorSpec
from oip.server.core.classification import classify
from serving import Server, assert_error_body, check_simple, grpc_call


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


# --- classification -----------------------------------------------------------------------------------------------


def _scores_http(outputs: list[httpclient.InferRequestedOutput], data: Any = SCORES) -> Any:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.asarray(data, dtype=np.float32))
    return tensor, outputs


@pytest.mark.parametrize("binary", [True, False])
def test_classification_over_http(triton_http: httpclient.InferenceServerClient, binary: bool) -> None:
    tensor, outputs = _scores_http([
        httpclient.InferRequestedOutput("SCORES", binary_data=binary, class_count=2),
        httpclient.InferRequestedOutput("WIDE", binary_data=binary, class_count=3),
        httpclient.InferRequestedOutput("COUNTS", binary_data=binary, class_count=10),  # more than there are
        httpclient.InferRequestedOutput("SMALL", binary_data=binary, class_count=1),
        httpclient.InferRequestedOutput("FLAGS", binary_data=binary),  # no classification: the tensor itself
    ])
    result = triton_http.infer("scores", [tensor], outputs=outputs)
    # Triton's formatting (C++ std::to_string): floats with six decimals, integers as integers; labels by index
    assert texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird"]
    assert texts(result.as_numpy("WIDE")) == ["3.300000:1", "2.400000:2", "0.500000:0"]
    assert texts(result.as_numpy("COUNTS")) == ["33:1", "24:2", "5:0", "-10:3"]
    assert texts(result.as_numpy("SMALL")) == ["33:1"]
    response = result.get_response()
    shapes = {o["name"]: (o["datatype"], o["shape"]) for o in response["outputs"]}
    assert shapes == {"SCORES": ("BYTES", [2]), "WIDE": ("BYTES", [3]), "COUNTS": ("BYTES", [4]),
                      "SMALL": ("BYTES", [1]), "FLAGS": ("BOOL", [4])}
    assert result.as_numpy("FLAGS").tolist() == [True, True, True, False]


def test_classification_over_grpc(triton_grpc: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(SCORES)
    outputs = [grpcclient.InferRequestedOutput("SCORES", class_count=3), grpcclient.InferRequestedOutput("COUNTS")]
    result = triton_grpc.infer("scores", [tensor], outputs=outputs)
    assert texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird", "0.500000:0:cat"]
    assert result.as_numpy("COUNTS").tolist() == [5, 33, 24, -10]
    output = result.get_output("SCORES")
    assert (output.datatype, list(output.shape)) == ("BYTES", [3])


def test_classification_rest_equals_grpc(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 3.0, 3.0, 2.0]}],
            "outputs": [{"name": "SCORES", "parameters": {"classification": 4}}]}
    rest = http.post("/v2/models/scores/infer", json=body).json()["outputs"][0]
    # ties keep the lower index first; the fourth label is missing, so that entry has none
    assert rest == {"name": "SCORES", "datatype": "BYTES", "shape": [4],
                    "data": ["3.000000:1:dog", "3.000000:2:bird", "2.000000:3", "1.000000:0:cat"]}
    request = pb.ModelInferRequest(model_name="scores")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.raw_input_contents.append(np.array([1.0, 3.0, 3.0, 2.0], dtype="<f4").tobytes())
    request.outputs.add(name="SCORES").parameters["classification"].int64_param = 4
    reply = stub.ModelInfer(request, timeout=30)
    assert (reply.outputs[0].datatype, list(reply.outputs[0].shape)) == ("BYTES", [4])
    raw = reply.raw_output_contents[0]
    items, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset:offset + 4], "little")
        items.append(raw[offset + 4:offset + 4 + size].decode())
        offset += 4 + size
    assert items == rest["data"]


def test_classification_of_a_batching_model(triton_http: httpclient.InferenceServerClient) -> None:
    inputs = [httpclient.InferInput(name, [2, 3], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.array([[1, 3, 2], [5, 4, 6]], dtype=np.float32))
    inputs[1].set_data_from_numpy(np.zeros((2, 3), dtype=np.float32))
    result = triton_http.infer("batched", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 2)  # [batch, k]
    assert [texts(row) for row in classes] == [["3.000000:1:b", "2.000000:2:c"], ["6.000000:2:c", "5.000000:0:a"]]


@pytest.mark.parametrize(("output", "value", "message"), [
    ("FLAGS", 2, "unsupported type 'BOOL'"),
    ("HALF", 2, "unsupported type 'FP16'"),
    ("TEXT", 2, "unsupported type 'BYTES'"),
    ("SCORES", "2", "expected an integer"),
    ("SCORES", 2.5, "expected an integer"),
    ("SCORES", True, "expected an integer"),
    ("SCORES", -1, "expected >= 0"),
])
def test_classification_errors(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, output: str, value: Any,
                               message: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
            "outputs": [{"name": output, "parameters": {"classification": value}}]}
    assert message in assert_error_body(http.post("/v2/models/scores/infer", json=body), 400)
    request = pb.ModelInferRequest(model_name="scores")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.raw_input_contents.append(SCORES.astype("<f4").tobytes())
    param = request.outputs.add(name=output).parameters["classification"]
    case = {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
    setattr(param, case, value)
    code, error = grpc_call(stub, "ModelInfer", request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
    check_simple(http, stub)


def test_classification_zero_means_none(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
            "outputs": [{"name": "COUNTS", "parameters": {"classification": 0}}]}
    output = http.post("/v2/models/scores/infer", json=body).json()["outputs"][0]
    assert (output["datatype"], output["data"]) == ("INT64", [5, 33, 24, -10])


# --- the formatting, in process -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("datatype", "values", "expected"), [
    ("FP32", [0.1, -2.5, 1e-7], ["0.100000:0", "0.000000:2", "-2.500000:1"]),
    ("FP64", [1e20, 3.0], ["100000000000000000000.000000:0", "3.000000:1"]),
    ("UINT64", [2**64 - 1, 0], ["18446744073709551615:0", "0:1"]),
    ("INT8", [-128, -5], ["-5:1", "-128:0"]),
    ("INT32", [7, 7, 7], ["7:0", "7:1", "7:2"]),
])
def test_classification_formatting(datatype: str, values: list[Any], expected: list[str]) -> None:
    spec = TensorSpec("OUT", datatype, [-1])
    model = Model("m", outputs=[spec])
    array = np.array(values, dtype=codec.dtype_of(datatype))
    tensor = classify(model, spec, Tensor("OUT", datatype, [len(values)], array), 5)
    assert (tensor.datatype, tensor.shape) == ("BYTES", [len(values)])
    assert [v.decode() for v in tensor.data.tolist()] == expected  # type: ignore[union-attr]


def test_classification_limit() -> None:
    spec = TensorSpec("OUT", "UINT8", [-1])
    with pytest.raises(InvalidRequest, match="too large"):
        big = Tensor("OUT", "UINT8", [1_000_001], np.zeros(1_000_001, np.uint8))
        classify(Model("m", outputs=[spec]), spec, big, 1)


# --- reserved parameters ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "parameters", "message"), [
    ("request", {"triton_secret": 1}, "reserved"),
    ("request", {"binary_data_output": "yes"}, "binary_data_output"),
    ("request", {"triton_enable_empty_final_response": "yes"}, "triton_enable_empty_final_response"),
    ("output", {"binary_data": 1}, "binary_data"),
    ("input", {"binary_data_size": "8"}, "binary_data_size"),
])
def test_reserved_parameters_of_the_wrong_type(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, where: str,
                                               parameters: dict[str, Any], message: str) -> None:
    body: dict[str, Any] = counted_body([1, 2])
    if where == "request":
        body["parameters"] = parameters
    elif where == "output":
        body["outputs"] = [{"name": "OUTPUT0", "parameters": parameters}]
    else:
        body["inputs"][0]["parameters"] = parameters
    assert message in assert_error_body(http.post("/v2/models/counted/infer", json=body), 400)
    check_simple(http, stub)


def test_reserved_parameters_over_grpc(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    def call(key: str, case: str, value: Any) -> grpc.StatusCode:
        request = pb.ModelInferRequest(model_name="counted")
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([1], dtype="<i4").tobytes())
        setattr(request.parameters[key], case, value)
        return grpc_call(stub, "ModelInfer", request)[0]

    assert call("triton_anything", "string_param", "x") is grpc.StatusCode.INVALID_ARGUMENT
    assert call("triton_enable_empty_final_response", "bool_param", True) is grpc.StatusCode.OK  # allow-listed
    assert call("binary_data_output", "string_param", "x") is grpc.StatusCode.INVALID_ARGUMENT
    assert call("custom", "string_param", "x") is grpc.StatusCode.OK


def test_allowed_reserved_parameter_over_rest(http: httpx.Client) -> None:
    parameters = {"triton_enable_empty_final_response": True, "binary_data_output": False}
    body = {**counted_body([3]), "parameters": parameters}
    response = http.post("/v2/models/counted/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [3]
