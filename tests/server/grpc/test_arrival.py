"""A unary gRPC call takes a thread of the server's pool only once its request has arrived
(`oip.server.grpc.arrival`): calls whose request is still on its way (a client that sent its headers and not yet
its message) hold no thread, so they cannot stop the port however many there are; a call that ends before its
request arrives is answered as grpcio answers it; and a server stopped with such calls open stops cleanly.

A call held before its request: the client opens ModelInfer as a request stream (the same method path and
message types) whose first message waits for the test, which grpcio's client sends as the call's headers alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import _observability
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server.grpc import arrival
from serving import (
    SIMPLE_A,
    SIMPLE_B,
    TIMEOUT,
    Server,
    build_repository,
    simple_grpc_request,
    start_server,
)

METHOD = "/inference.GRPCInferenceService/ModelInfer"
THREADS = 2  # the server's pool: fewer threads than the calls the tests hold open


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("arrival")
    repository = build_repository(workdir / "models", only=("simple",))
    server = start_server(repository, workdir, "--grpc-threads", str(THREADS), ready=["simple"])
    try:
        yield server
    finally:
        server.stop()


class Held:
    """A ModelInfer call whose request waits for `send` (None: the client ends the call with no request)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._go = threading.Event()
        self._request: pb.ModelInferRequest | None = None
        call = channel.stream_unary(METHOD, request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        self.future: Any = call.future(self._requests(), timeout=4 * TIMEOUT)

    def _requests(self) -> Iterator[pb.ModelInferRequest]:
        assert self._go.wait(4 * TIMEOUT)
        if self._request is not None:
            yield self._request

    def send(self, request: pb.ModelInferRequest | None) -> None:
        self._request = request
        self._go.set()


def _sums(reply: pb.ModelInferResponse) -> list[int]:
    return codec.from_raw(reply.raw_output_contents[0], "INT32", [16]).tolist()


EXPECTED = [a + b for a, b in zip(SIMPLE_A, SIMPLE_B, strict=True)]


def test_grpcio_has_the_shape_the_server_relies_on() -> None:
    assert arrival.SUPPORTED  # otherwise every call takes grpcio's own way, and the tests below fail


def test_calls_are_handed_to_grpcs_observability_plugin_only_when_one_is_registered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`answer` skips grpcio's look for an observability plugin (a generator context manager and a lock per call)
    while none is registered, asks as grpcio does when one is, and when grpcio keeps it elsewhere."""
    assert _observability._OBSERVABILITY_PLUGIN is None and not arrival._traced()
    monkeypatch.setattr(_observability, "_OBSERVABILITY_PLUGIN", object())
    assert arrival._traced()
    monkeypatch.delattr(_observability, "_OBSERVABILITY_PLUGIN")
    assert arrival._traced()


def test_calls_whose_request_has_not_arrived_hold_no_thread(server: Server) -> None:
    with server.channel() as channel:
        held = [Held(channel) for _ in range(THREADS + 2)]  # headers first, on the connection the next call takes
        try:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(3):  # answered while every held call is open, each on a thread of its own
                assert _sums(stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT)) == EXPECTED
            assert all(not call.future.done() for call in held)  # still open at the server, waiting
        finally:
            for call in held:
                call.send(simple_grpc_request())
        for call in held:  # and each is answered once its request arrives
            assert _sums(call.future.result(timeout=TIMEOUT)) == EXPECTED


def test_a_call_that_ends_without_its_request_is_refused_as_grpcio_refuses_it(server: Server) -> None:
    with server.channel() as channel:
        call = Held(channel)
        call.send(None)
        with pytest.raises(grpc.RpcError) as raised:
            call.future.result(timeout=TIMEOUT)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "requires exactly one request message" in raised.value.details()


def test_a_call_cancelled_before_its_request_arrives_leaves_the_server_serving(server: Server) -> None:
    with server.channel() as channel:
        calls = [Held(channel) for _ in range(THREADS + 2)]
        for call in calls:
            call.future.cancel()
        for call in calls:
            call.send(None)  # the request iterator ends
            assert call.future.cancelled()
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(2 * THREADS):
            assert _sums(stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT)) == EXPECTED
    assert "Traceback" not in server.log_text()


def test_a_server_stopped_with_calls_waiting_for_their_request_stops_cleanly(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path, "--grpc-threads", str(THREADS), "--graceful-shutdown-seconds", "2",
                          ready=["simple"])
    channel = server.channel()
    calls = [Held(channel) for _ in range(THREADS + 1)]
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert _sums(stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT)) == EXPECTED  # the held ones are in
        assert server.stop() == 0  # within the grace, in which the held calls' requests never came
        for call in calls:  # ended by the server: an error, not an answer and not a hang
            with pytest.raises(grpc.RpcError):
                call.future.result(timeout=TIMEOUT)
    finally:
        for call in calls:
            call.send(None)
        channel.close()
        server.kill()
    assert "Traceback" not in server.log_text(), server.log_tail()
