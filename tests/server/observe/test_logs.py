"""The logs of the generated server: the JSON access log, one line per answered request, and a client's request
id cut to its first 256 characters wherever a line carries it. (The ids of a traced request in its lines:
test_tracing.)
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from observe_models import access_lines
from serving import Server, build_repository, simple_body, start_server


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """JSON log lines and the access log."""
    repository = build_repository(tmp_path_factory.mktemp("logs") / "models", only=("simple",))
    server = start_server(repository, tmp_path_factory.mktemp("logged"), "--access-log", "--log-format", "json",
                          ready=("simple",))
    yield server
    assert server.stop() == 0, server.log_text()


def test_a_long_request_id_is_cut_in_the_log(logged: Server) -> None:
    """A client's 1 MB request id is written to the JSON log as its first 256 characters (the access log writes a
    line per request with it), never whole."""
    request_id = "L" + secrets.token_hex(500_000)
    with logged.http_client() as http:
        answer = http.post("/v2/models/simple/infer", json=simple_body(id=request_id))
        assert answer.status_code == 200 and answer.json()["id"] == request_id
    (line,) = access_lines(logged, request_id[:256])
    assert line["request_id"] == request_id[:256]
    assert request_id[:300] not in logged.log_text()
