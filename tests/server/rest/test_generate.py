"""Triton's generate extension on the generated server, over real sockets.

The cases of Triton's own generate endpoint tests (qa/L0_http/generate_endpoint_test.py) run against a model that
behaves as their `mock_llm` does (decoupled; PROMPT and STREAM inputs; REPETITION, DELAY, FAIL_LAST and
OUTPUT_0_DIM request parameters), read with a real server-sent events client (httpx-sse); then the example models
`text_echo` and `text_stream` through the generated clients. One server for the module; about 20 s.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import ROOT
from httpx_sse import connect_sse
from serving import Server, assert_error_body, count_before, requests_answered, running, scrape

# Triton's mock_llm: decoupled; for STREAM true, REPETITION copies of PROMPT (each after DELAY seconds), then an
# error if FAIL_LAST; for STREAM false, one copy. Each response first leaves a `sent-*` file in the model's folder.
MOCK_LLM = '''
import time
import uuid
from pathlib import Path

import numpy as np

from oip.server.model import Model, TensorSpec


class MockLlm(Model):
    inputs = [TensorSpec("PROMPT", "BYTES", [1, 1]), TensorSpec("STREAM", "BOOL", [1, 1])]
    outputs = [TensorSpec("TEXT", "BYTES", [1, -1])]
    decoupled = True

    def infer(self, inputs, parameters):
        prompt = inputs["PROMPT"]
        text = np.empty((1, 0), dtype=object) if parameters.get("OUTPUT_0_DIM") else prompt
        if not bool(inputs["STREAM"].reshape(-1)[0]):
            yield {"TEXT": text}
            return
        for _ in range(int(parameters.get("REPETITION", 1))):
            if "DELAY" in parameters:
                time.sleep(float(parameters["DELAY"]))
            (Path(self.path) / f"sent-{uuid.uuid4().hex}").write_text("1")
            yield {"TEXT": text}
        if parameters.get("FAIL_LAST"):
            raise RuntimeError("An Error Occurred")
'''
TEXT = "hello world"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("generate")
    repository = root / "models"
    for name in ("text_echo", "text_stream"):
        shutil.copytree(ROOT / "examples" / "models" / name, repository / name)
    (repository / "mock_llm").mkdir()
    (repository / "mock_llm" / "model.toml").write_text('class = "model:MockLlm"\ndecoupled = true\n')
    (repository / "mock_llm" / "model.py").write_text(textwrap.dedent(MOCK_LLM))
    with running(repository, root, "--max-tensor-elements", "1000") as server:
        yield server


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.http_client() as client:
        yield client


def _sent(server: Server) -> int:
    return len(list((server.repository / "mock_llm").glob("sent-*")))


def generate(http: httpx.Client, body: Any, model: str = "mock_llm") -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return http.post(f"/v2/models/{model}/generate", content=content)


def generate_stream(http: httpx.Client, body: Any, model: str = "mock_llm") -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return http.post(f"/v2/models/{model}/generate_stream", content=content, headers={"Accept": "text/event-stream"})


def events(http: httpx.Client, body: dict[str, Any], model: str = "mock_llm") -> list[dict[str, Any]]:
    """The events of a generate_stream answer, read by httpx-sse; every one must be a `data:` JSON object."""
    with connect_sse(http, "POST", f"/v2/models/{model}/generate_stream", json=body) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"] == "text/event-stream; charset=utf-8"
        out = []
        for event in source.iter_sse():
            assert event.event == "message" and event.data
            out.append(json.loads(event.data))
        return out


def expect_failure(http: httpx.Client, body: Any, message: str, status: int = 400) -> None:
    """Both endpoints refuse `body` before anything streams: a JSON error answer naming `message`."""
    for answer in (generate(http, body), generate_stream(http, body)):
        assert message in assert_error_body(answer, status)


# -- Triton's generate endpoint tests -------------------------------------------------------------------------------
def test_generate(http: httpx.Client) -> None:
    answer = generate(http, {"PROMPT": TEXT, "STREAM": False})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"model_name": "mock_llm", "model_version": "1", "TEXT": TEXT}


def test_request_id(http: httpx.Client) -> None:
    assert generate(http, {"PROMPT": TEXT, "id": "42", "STREAM": False}).json()["id"] == "42"
    assert "id" not in generate(http, {"PROMPT": TEXT, "STREAM": False}).json()
    empty = generate(http, {"PROMPT": TEXT, "id": "", "STREAM": False}).json()
    assert "id" not in empty and empty["TEXT"] == TEXT
    assert "'id' must be a string" in assert_error_body(generate(http, {"PROMPT": TEXT, "id": 42, "STREAM": 0}), 400)


def test_a_large_body(http: httpx.Client) -> None:
    """A body of 200 KB (beyond what the HTTP layer answers without ASGI, and received there into one buffer) is
    answered as a small one, its repeated keys refused as theirs are."""
    prompt = "x" * 200_000
    answer = generate(http, {"PROMPT": prompt, "STREAM": False})
    assert answer.status_code == 200 and answer.json()["TEXT"] == prompt
    assert [e["TEXT"] for e in events(http, {"PROMPT": prompt, "STREAM": True, "REPETITION": 2})] == [prompt] * 2
    twice = '{"PROMPT": "' + prompt + '", "STREAM": false, "STREAM": true}'
    expect_failure(http, twice, "'STREAM' appears more than once")


def test_generate_stream(http: httpx.Client) -> None:
    got = events(http, {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 3})
    assert [e["TEXT"] for e in got] == [TEXT] * 3
    assert all(e["model_name"] == "mock_llm" and e["model_version"] == "1" for e in got)


def test_streaming_sends_each_response_as_it_comes(server: Server, http: httpx.Client) -> None:
    """The first event arrives while the model is still producing the others (it waits 1 s between them)."""
    before = _sent(server)
    body = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 3, "DELAY": 1}
    seen_at_events = []
    with connect_sse(http, "POST", "/v2/models/mock_llm/generate_stream", json=body) as source:
        for _ in source.iter_sse():
            seen_at_events.append(_sent(server) - before)
    assert len(seen_at_events) == 3 and seen_at_events[0] < 3, seen_at_events


def test_missing_inputs(http: httpx.Client) -> None:
    for body in ({}, {"abc": 123}, {"STREAM": False}, {"STREAM": False, "other": "param"}):
        expect_failure(http, body, "missing input 'PROMPT'")
    expect_failure(http, {"PROMPT": "hello"}, "missing input 'STREAM'")


def test_invalid_input_types(http: httpx.Client) -> None:
    expect_failure(http, {"PROMPT": 123, "STREAM": False}, "'PROMPT'")
    expect_failure(http, {"PROMPT": "hello", "STREAM": "false"}, "'STREAM'")
    expect_failure(http, {"PROMPT": True, "STREAM": 123}, "'PROMPT'")
    expect_failure(http, {"STREAM": 123, "PROMPT": True}, "'STREAM'")  # read in order


def test_duplicate_inputs(http: httpx.Client) -> None:
    expect_failure(http, '{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate"}', "key 'PROMPT' appears more")
    expect_failure(http, '{"PROMPT": "hello", "STREAM": false, "STREAM": false}', "key 'STREAM' appears more")
    expect_failure(http, '{"PROMPT": "hello", "STREAM": false, "STREAM": true, "PROMPT": "d"}', "key 'STREAM'")
    expect_failure(http, '{"PROMPT": "hello", "parameters": {"PROMPT": "again"}, "STREAM": false}',
                   "input 'PROMPT' already exists in request")


def test_stream_response_error(http: httpx.Client) -> None:
    body = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 0, "FAIL_LAST": True}
    # The error is the first response: nothing streamed yet, so an ordinary error answer.
    assert "An Error Occurred" in assert_error_body(generate_stream(http, body), 500)
    body["REPETITION"] = 1
    assert events(http, body) == [
        {"model_name": "mock_llm", "model_version": "1", "TEXT": TEXT}, {"error": "An Error Occurred"}]


def test_race_condition(http: httpx.Client) -> None:
    single = {"PROMPT": "hello", "STREAM": False, "param": "segfault"}
    several = {"PROMPT": "hello", "STREAM": True, "REPETITION": 3, "param": "segfault"}

    def call(body: dict[str, Any]) -> tuple[int, str]:
        answer = generate_stream(http, body)
        return answer.status_code, answer.text

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, [single, several] * 25))
    assert all(status == 200 for status, _ in answers)
    assert {text.count("data: ") for _, text in answers} == {1, 3}


def test_one_response(http: httpx.Client) -> None:
    for stream in (True, False):
        body = {"PROMPT": TEXT, "STREAM": stream}
        assert generate(http, body).json()["TEXT"] == TEXT
        assert generate_stream(http, body).status_code == 200


def test_zero_and_many_responses(http: httpx.Client) -> None:
    for count in (0, 2):
        body = {"PROMPT": TEXT, "STREAM": True, "REPETITION": count}
        assert len(events(http, body)) == count
        message = assert_error_body(generate(http, body), 400)
        assert f"generate expects model to produce exactly 1 response, got {count}" in message


def test_complex_schema(http: httpx.Client) -> None:
    body = {"PROMPT": TEXT, "STREAM": True, "PARAMS": {"PARAM_0": 0, "PARAM_1": True}}
    assert "parameter 'PARAMS' has invalid type" in assert_error_body(generate(http, body), 400)
    body = {"PROMPT": {"USER": "hello world", "BOT": "world hello"}, "STREAM": True}
    assert "input 'PROMPT' must be a scalar, a string or a flat array" in assert_error_body(generate(http, body), 400)
    body = {"PROMPT": [[TEXT]], "STREAM": False}
    assert "flat array" in assert_error_body(generate(http, body), 400)


def test_close_connection_during_streaming(server: Server, http: httpx.Client) -> None:
    """A client that goes away stops the model: it produces no more responses, and the server stays healthy."""
    before = _sent(server)
    body = {"PROMPT": [TEXT], "STREAM": True, "REPETITION": 20, "DELAY": 0.2}
    with connect_sse(http, "POST", "/v2/models/mock_llm/generate_stream", json=body) as source:
        next(source.iter_sse())
    deadline = time.monotonic() + 10
    settled = -1
    while time.monotonic() < deadline:  # wait until the count stops moving
        time.sleep(0.5)
        now = _sent(server)
        if now == settled:
            break
        settled = now
    assert 1 <= settled - before < 20
    assert http.get("/v2/health/live").json() == {"live": True}


def test_parameters(http: httpx.Client) -> None:
    got = events(http, {"PROMPT": [TEXT], "STREAM": True, "parameters": {"REPETITION": 3}})
    assert [e["TEXT"] for e in got] == [TEXT] * 3
    message = assert_error_body(generate(http, {"PROMPT": [TEXT], "STREAM": True, "parameters": 1}), 400)
    assert "Expected JSON object for keyword: 'parameters'" in message
    message = assert_error_body(
        generate(http, {"PROMPT": [TEXT], "STREAM": True, "parameters": {"nested": {"twice": 1}}}), 400)
    assert "Converting keyword: 'parameters': parameter 'nested' has invalid type" in message
    # Inputs may come inside `parameters` too.
    assert generate(http, {"parameters": {"PROMPT": TEXT, "STREAM": False}}).json()["TEXT"] == TEXT


def test_0_dimension_output(http: httpx.Client) -> None:
    answer = generate(http, {"PROMPT": TEXT, "STREAM": False, "REPETITION": 0, "OUTPUT_0_DIM": True})
    assert answer.status_code == 200 and answer.json()["TEXT"] == []


def test_size_limit(http: httpx.Client) -> None:
    """An input with more elements than the server allows (--max-tensor-elements 1000) is refused."""
    message = assert_error_body(generate(http, {"text_input": ["x"] * 1001}, "text_echo"), 413)
    assert "1001 elements" in message


# -- the example models through the generated clients ----------------------------------------------------------------
def test_clients_generate(server: Server) -> None:
    from oip.client import AsyncRestClient, GrpcClient, RestClient, ServerError, Unimplemented

    with RestClient(server.url) as client:
        assert client.generate("text_echo", text_input="one two", id="a") == {
            "model_name": "text_echo", "model_version": "1", "id": "a", "text_output": "one two"}
        assert client.generate("text_echo", "1", request={"text_input": ["x", "y"]})["text_output"] == ["x", "y"]
        words = [e["text_output"] for e in client.generate_stream("text_stream", text_input="the quick  brown fox")]
        assert words == ["the", "quick", "brown", "fox"]
        assert list(client.generate_stream("text_stream", "1", text_input=" ")) == []
        stream = client.generate_stream("mock_llm", PROMPT=TEXT, STREAM=True, REPETITION=1, FAIL_LAST=True)
        assert next(stream)["TEXT"] == TEXT
        with pytest.raises(ServerError, match="An Error Occurred"):
            next(stream)

    async def aio() -> list[str]:
        async with AsyncRestClient(server.url) as client:
            assert (await client.generate("text_echo", text_input="hi"))["text_output"] == "hi"
            return [e["text_output"] async for e in client.generate_stream("text_stream", text_input="a b")]

    assert asyncio.run(aio()) == ["a", "b"]
    with GrpcClient(server.target) as grpc_client, pytest.raises(Unimplemented, match="REST only"):
        grpc_client.generate("text_echo", text_input="hi")


def test_shape_from_metadata() -> None:
    from oip.server.core.generate import shape_for

    assert shape_for([1, 1], 1) == [1, 1]
    assert shape_for([-1], 3) == [3]
    assert shape_for([1, -1], 4) == [1, 4]
    assert shape_for([-1, 2, -1], 6) == [1, 2, 3]  # the innermost variable dimension takes the rest
    assert shape_for([2, -1], 3) is None
    assert shape_for([1, 1], 2) is None
    assert shape_for([1, -1], 0) == [1, 0]


def test_generate_and_its_event_stream_are_counted_under_their_operations(server: Server, http: httpx.Client) -> None:
    """Both routes answer outside FastAPI's router (`OipApp.fast_routes`); each answer is counted once, under its
    own operation and status, a refusal too."""
    before = scrape(server.url)
    assert generate(http, {"PROMPT": TEXT, "STREAM": False}).json()["TEXT"] == TEXT
    body = {"PROMPT": TEXT, "STREAM": True, "REPETITION": 3}
    assert [event["TEXT"] for event in events(http, body)] == [TEXT] * 3
    assert generate(http, {"PROMPT": TEXT}, model="nope").status_code == 404
    after = scrape(server.url)

    assert requests_answered(before, after, transport="rest", operation="generate", code="200") == 1
    assert requests_answered(before, after, transport="rest", operation="generate_stream", code="200") == 1
    assert requests_answered(before, after, transport="rest", operation="generate", code="404") == 1
    unknown = {"transport": "rest", "operation": "unknown", "code": "200"}
    assert count_before(after, "oip_requests_total", **unknown) == count_before(before, "oip_requests_total", **unknown)
