"""The clients over TLS: server verification with a CA file, refusal of an unknown certificate, client
certificates (mutual TLS) over REST, and TLS credentials over gRPC. The servers are small stand-ins on loopback
(the generated server speaks plain TCP; TLS belongs to whatever fronts it), with a self-signed certificate made
by the `openssl` command."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from oip.client import GrpcClient, RestClient, Unavailable
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


class Live(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"live": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def https_server(cert: Path, key: Path, client_ca: Path | None) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def https(certificate: tuple[Path, Path]) -> Iterator[str]:
    yield from https_server(*certificate, client_ca=None)


@pytest.fixture
def https_mutual(certificate: tuple[Path, Path]) -> Iterator[str]:
    yield from https_server(*certificate, client_ca=certificate[0])


def test_rest_verifies_the_server(https: str, certificate: tuple[Path, Path]) -> None:
    with RestClient(https, verify=str(certificate[0]), trust_env=False) as client:
        assert client.server_live().live
    with RestClient(https, trust_env=False) as client, pytest.raises(Unavailable, match="CERTIFICATE"):
        client.server_live()  # system roots do not know this certificate
    with RestClient(https, verify=False, trust_env=False) as client:
        assert client.server_live().live
    context = ssl.create_default_context(cafile=str(certificate[0]))
    with RestClient(https, verify=context, trust_env=False) as client:
        assert client.server_live().live


def test_rest_client_certificate(https_mutual: str, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    with RestClient(https_mutual, verify=str(cert), cert=(str(cert), str(key)), trust_env=False) as client:
        assert client.server_live().live
    with RestClient(https_mutual, verify=str(cert), trust_env=False) as client, pytest.raises(Unavailable):
        client.server_live()


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)


@pytest.fixture
def grpcs(certificate: tuple[Path, Path]) -> Iterator[str]:
    cert, key = certificate
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    server.start()
    try:
        yield f"localhost:{port}"
    finally:
        server.stop(None)


def test_grpc_tls(grpcs: str, certificate: tuple[Path, Path]) -> None:
    with GrpcClient(grpcs, root_certificates=certificate[0].read_bytes()) as client:
        assert client.server_live().live
    credentials = grpc.ssl_channel_credentials(certificate[0].read_bytes())
    with GrpcClient(grpcs, credentials=credentials) as client:
        assert client.server_live().live
    with GrpcClient(grpcs, ssl=True, timeout=5) as client, pytest.raises(Unavailable):
        client.server_live()  # system roots do not know this certificate
