"""The standard gRPC health service (`oip.server.grpc.health`) on the protocol's port, asked by gRPC's own health
client (grpcio-health-checking, as probes and load balancers ask it): `Check` says what `ServerReady` says, knows
the whole server and the services by name, refuses the others and `Watch` with a clear status, is counted and
logged, and leaves the server serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from oip.grpc import grpc_service_pb2 as pb
from serving import TIMEOUT, Server, build_repository, requests_answered, running, scrape

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
PROTOCOL = "inference.GRPCInferenceService"
HEALTH = "grpc.health.v1.Health"


def check(channel: grpc.Channel, service: str = "") -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                       timeout=TIMEOUT)
    return int(reply.status)


def refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        if isinstance(call, Iterator):
            list(call)
        else:
            assert callable(call)
            call()
    return caught.value


@pytest.mark.parametrize("strict", [True, False])
def test_check_says_what_server_ready_says(tmp_path: Path, strict: bool) -> None:
    """With a model whose load failed, strict readiness makes the server not ready: Check is NOT_SERVING for the
    whole server and the protocol's service alike; unloading that model makes both ready again. Without strict
    readiness the server is ready throughout."""
    root = build_repository(tmp_path / "models", ("broken",), only=("simple",))
    options = () if strict else ("--strict-readiness=false",)
    with running(root, tmp_path, *options, ready=("simple",)) as server, server.clients() as (http, stub), \
            server.channel() as channel:
        ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
        assert ready is not strict
        expected = SERVING if ready else NOT_SERVING
        assert [check(channel, name) for name in ("", PROTOCOL, HEALTH)] == [expected] * 3
        assert http.post("/v2/repository/models/broken/unload").status_code == 200
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
        assert [check(channel, name) for name in ("", PROTOCOL, HEALTH)] == [SERVING] * 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("health")
    repository = build_repository(root / "models", only=("simple",))
    with running(repository, root, "--access-log", ready=("simple",)) as served:
        yield served


def test_unknown_services_are_not_found_with_the_name_clipped(server: Server) -> None:
    long = "x" * 10_000
    with server.channel() as channel:
        for name in ("nope", "inference.GRPCInferenceService2", long):
            error = refused(lambda name=name: check(channel, name))  # type: ignore[misc]
            assert error.code() is grpc.StatusCode.NOT_FOUND, error
            details = error.details() or ""
            assert f"unknown service {name[:200]!r}"[:-1] in details and PROTOCOL in details, details
            assert len(details) < 600, len(details)
        assert check(channel) == SERVING


def test_watch_is_refused_unimplemented_and_saying_why(server: Server) -> None:
    with server.channel() as channel:
        error = refused(health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT))
        assert error.code() is grpc.StatusCode.UNIMPLEMENTED, error
        assert "Watch is not served" in (error.details() or "") and "Check" in (error.details() or "")
        assert check(channel) == SERVING


def test_a_malformed_request_is_invalid_argument(server: Server) -> None:
    with server.channel() as channel:
        raw = channel.unary_unary(f"/{HEALTH}/Check")
        error = refused(lambda: raw(b"\x0a\xff\xff", timeout=TIMEOUT))  # a string field longer than the message
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
        assert check(channel) == SERVING


def test_checks_are_counted_and_logged(server: Server) -> None:
    before = scrape(server.url)
    with server.channel() as channel:
        assert check(channel) == SERVING
        refused(lambda: check(channel, "nope"))
    after = scrape(server.url)
    assert requests_answered(before, after, transport="grpc", operation="Check", code="OK") == 1
    assert requests_answered(before, after, transport="grpc", operation="Check", code="NOT_FOUND") == 1
    assert '"grpc.health.v1.Health/Check" OK' in server.log_text()
