"""`--shutdown-delay-seconds`: after SIGTERM the server goes on serving for that long while its readiness says not
ready (REST, gRPC `ServerReady`, the standard gRPC health service), so that a load balancer (Kubernetes' endpoints)
stops sending before connections are refused; then it drains and exits as without it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, build_repository, simple_body, simple_grpc_request, start_server

DELAY = 3.0


def test_after_sigterm_the_server_serves_for_the_delay_while_not_ready(tmp_path: Path) -> None:
    repository = build_repository(tmp_path / "models", only=("simple",))
    server = start_server(repository, tmp_path, "--shutdown-delay-seconds", str(DELAY),
                          "--graceful-shutdown-seconds", "2", ready=("simple",))
    try:
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # New connections, during the delay: not ready, still live, and every request answered.
        with httpx.Client(base_url=server.url, timeout=TIMEOUT, trust_env=False) as http:
            assert http.get("/v2/health/ready").status_code == 503
            assert http.get("/v2/health/live").status_code == 200
            assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
            assert list(stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT).raw_output_contents)
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert time.monotonic() - signalled < DELAY  # all of it within the delay
        assert server.process.wait(timeout=DELAY + 2 + 10) == 0
        took = time.monotonic() - signalled
    finally:
        server.kill()
    assert DELAY <= took < DELAY + 2 + 5, took
    assert "not ready for 3 s (--shutdown-delay-seconds)" in server.log_text()
