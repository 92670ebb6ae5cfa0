"""Triton's streaming extension (ModelStreamInfer) against the generated server.

tritonclient's `start_stream` + `async_stream_infer` with models that are not decoupled (one response per request,
in order, flagged final), decoupled models (sync and async generators: any number of responses, the empty final
response on request), an error in the middle of a stream (reported, the stream goes on), and decoupled models
refused over unary inference, as Triton refuses them; a stream through the generated client.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, Server, assert_error_body, check_simple
from stream_batch_models import SIMPLE_A, SIMPLE_B, serve_models, triton_grpc_client
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


@pytest.fixture
def triton_grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    with triton_grpc_client(server) as client:
        yield client


def simple_inputs(module: Any, a: npt.NDArray[Any] = SIMPLE_A, b: npt.NDArray[Any] = SIMPLE_B) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def repeat_input(values: list[int]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return [tensor]


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


@pytest.mark.parametrize("model", ["repeat", "repeat_async"])
def test_stream_decoupled_error_midway(triton_grpc: grpcclient.InferenceServerClient, model: str) -> None:
    """The responses before the failure arrive, then the error, the model's own message (a plain generator's
    or an async generator's); the stream still answers."""
    with stream(triton_grpc) as got:
        triton_grpc.async_stream_infer(model, repeat_input([1, 2, -3, 4]), request_id="fails")
        answers = got.take(3)
        triton_grpc.async_stream_infer(model, repeat_input([10]), request_id="after")
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
