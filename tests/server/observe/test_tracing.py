"""OpenTelemetry traces of the generated server, sent to a real OTLP receiver on loopback (HTTP/protobuf and gRPC).

The trace id sent in `traceparent` (REST header, gRPC metadata) comes back in the exported spans, the request span's
parent is the caller's span, and its children are the timer's phases (every one, with its parent id; one
compute_infer / compute_output pair per response of a decoupled model), with the attributes and status of the
outcome; the JSON log lines of a traced request carry its request, trace and span ids; the configured sampler
decides (ratio 0 exports nothing, parent-based follows a sampled or unsampled traceparent), and spans a model makes
with the OpenTelemetry API are children of its request's span. The spans' OTLP encoding is byte for byte the SDK
encoder's, the exporters' transports are checked in process, and the generated clients propagate the caller's
current context. Tracing off imports and calls nothing of it.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from observe_models import (
    Receiver,
    access_lines,
    fp32_body,
    observed_repository,
    otlp_grpc_receiver,
    otlp_http_receiver,
)
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from serving import (
    TIMEOUT,
    Server,
    assert_error_body,
    running,
    simple_body,
    simple_grpc_request,
    start_server,
    write_doubled,
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return observed_repository(tmp_path_factory.mktemp("observability") / "models")


@pytest.fixture(scope="module")
def http_receiver() -> Iterator[tuple[Receiver, str]]:
    with otlp_http_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def grpc_receiver() -> Iterator[tuple[Receiver, str]]:
    with otlp_grpc_receiver() as receiver:
        yield receiver


# --- traces -----------------------------------------------------------------------------------------------------


def traced_server(repository: Path, workdir: Path, endpoint: str, protocol: str, sampler: str = "parentbased_always_on",
                  ratio: str = "", ready: tuple[str, ...] = ("simple",), options: tuple[str, ...] = (),
                  exporter: str | None = "otlp", extra: dict[str, str] | None = None) -> Server:
    """A server with the OpenTelemetry environment pointing at `endpoint` (and the `extra` variables); `exporter`
    None leaves OTEL_TRACES_EXPORTER unset (everything else set)."""
    env: dict[str, str | None] = {**(extra or {}),
        "OTEL_TRACES_EXPORTER": exporter, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_SERVICE_NAME": "oip-under-test",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{endpoint}/v1/traces" if protocol != "grpc" else endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": ratio,
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=ci,service.namespace=oip",
    }
    saved = {key: os.environ.get(key) for key in env}
    for key, setting in env.items():
        if setting is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = setting
    try:
        return start_server(repository, workdir, "--log-format", "json", "--access-log", *options, ready=ready)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


SERVER, INTERNAL, OK, ERROR = 2, 1, 1, 2  # OTLP's span kinds and status codes


def check_trace(spans: list[dict[str, Any]], parent: str, transport: str, request_id: str, model: str = "simple",
                status: str = "OK") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The request span of `spans` (one trace) and its children, checked: the caller's span as parent, the
    attributes, the outcome, one child per phase of the request's in its time, nothing else in the trace."""
    request = next(s for s in spans if s["name"] == f"ModelInfer {model}")
    assert request["service"] == "oip-under-test" and request["scope"] == "oip.server"
    assert request["parent"] == parent  # the caller's span
    assert request["kind"] == SERVER
    assert request["attributes"] == {"model_name": model, "model_version": "1", "request_id": request_id,
                                     "transport": transport, "status": status}
    assert request["status"][0] == (OK if status == "OK" else ERROR)
    children = [s for s in spans if s["parent"] == request["span_id"]]
    assert len(children) + 1 == len(spans), spans  # every other span of the trace is a child of the request's
    assert len({s["span_id"] for s in spans}) == len(spans)
    for child in children:
        assert child["kind"] == INTERNAL and child["attributes"] == {} and child["status"] == (0, ""), child
        assert child["scope"] == "oip.server"
        assert request["start"] <= child["start"] <= child["end"] <= request["end"]
    return request, sorted(children, key=lambda s: s["start"])


PHASES = {"queue", "compute_input", "compute_infer", "compute_output"}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_traces_join_the_callers_trace(protocol: str, repository: Path, tmp_path: Path,
                                       http_receiver: tuple[Receiver, str],
                                       grpc_receiver: tuple[Receiver, str]) -> None:
    receiver, endpoint = http_receiver if protocol == "http/protobuf" else grpc_receiver
    server = traced_server(repository, tmp_path, endpoint, protocol)
    try:
        rest_trace, rest_parent = secrets.token_hex(16), secrets.token_hex(8)
        grpc_trace, grpc_parent = secrets.token_hex(16), secrets.token_hex(8)
        with server.clients() as (http, stub):
            answer = http.post("/v2/models/simple/infer", json=simple_body(id="traced-rest"),
                               headers={"traceparent": f"00-{rest_trace}-{rest_parent}-01"})
            assert answer.status_code == 200
            request = simple_grpc_request()
            request.id = "traced-grpc"
            stub.ModelInfer(request, timeout=TIMEOUT, metadata=(("traceparent", f"00-{grpc_trace}-{grpc_parent}-01"),))
        rest_span, children = check_trace(receiver.trace(rest_trace, 5), rest_parent, "rest", "traced-rest")
        assert {c["name"] for c in children} == PHASES and len(children) == 4, children
        # The resource is the SDK's, from the standard variables
        assert rest_span["resource"]["deployment.environment.name"] == "ci", rest_span["resource"]
        assert rest_span["resource"]["service.namespace"] == "oip" and rest_span["service"] == "oip-under-test"
        grpc_span, children = check_trace(receiver.trace(grpc_trace, 5), grpc_parent, "grpc", "traced-grpc")
        assert [c["name"] for c in children] == ["compute_input", "queue", "compute_infer", "compute_output"]
        # The access-log lines of the traced requests carry their ids, over both transports.
        logged = access_lines(server, "traced-rest", "traced-grpc")
        for line, trace, span in zip(logged, (rest_trace, grpc_trace), (rest_span, grpc_span), strict=True):
            assert line["trace_id"] == trace and line["span_id"] == span["span_id"], line
    finally:
        assert server.stop() == 0, server.log_text()


def test_calls_batched_where_they_arrive_join_their_callers_traces(tmp_path: Path,
                                                                  http_receiver: tuple[Receiver, str]) -> None:
    """Two gRPC calls to an inline model under dynamic batching, batched by grpcio's polling thread as the second
    arrives: each request's span joins its own caller's trace, with its own id, and its access-log line names its
    trace (the trace context is read from the call's metadata as it arrives)."""
    receiver, endpoint = http_receiver
    write_doubled(tmp_path / "models", max_batch_size=2, delay_us=60000000)
    server = traced_server(tmp_path / "models", tmp_path, endpoint, "http/protobuf", ready=("doubled",))
    calls = [(f"batched-{i}", secrets.token_hex(16), secrets.token_hex(8)) for i in range(2)]
    try:
        def call(request_id: str, trace: str, parent: str) -> int:
            request = pb.ModelInferRequest(model_name="doubled", id=request_id)
            request.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
            request.raw_input_contents.append((21).to_bytes(4, "little"))
            with server.channel() as channel:
                reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                    request, timeout=TIMEOUT, metadata=(("traceparent", f"00-{trace}-{parent}-01"),))
            return int.from_bytes(reply.raw_output_contents[0], "little")

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda given: call(*given), calls)) == [42, 42]
        spans = {}
        for request_id, trace, parent in calls:
            spans[request_id], children = check_trace(receiver.trace(trace, 5), parent, "grpc", request_id,
                                                      model="doubled")
            assert {c["name"] for c in children} == PHASES, children
        for line, (request_id, trace, _) in zip(access_lines(server, *spans), calls, strict=True):
            assert line["trace_id"] == trace and line["span_id"] == spans[request_id]["span_id"], line
        with server.http_client() as http:
            stats = http.get("/v2/models/doubled/stats").json()["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (2, 1)  # one batch of both
    finally:
        assert server.stop() == 0, server.log_text()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("collector", ["refusing", "silent"])
def test_a_collector_that_is_down_holds_neither_the_requests_nor_the_stop(protocol: str, collector: str,
                                                                       repository: Path, tmp_path: Path) -> None:
    """A collector that refuses connections, or takes them and never answers: traced requests are answered as
    usual, and SIGTERM stops the server within its graceful shutdown (the exporter's retries and timeouts would
    take 15 s and more), the log telling how many traced requests it dropped."""
    grace = 2.0
    with socket.socket() as collector_socket:
        collector_socket.bind(("127.0.0.1", 0))
        if collector == "silent":
            collector_socket.listen(64)  # the kernel completes the connections; nobody reads or answers
        endpoint = f"http://127.0.0.1:{collector_socket.getsockname()[1]}"
        server = traced_server(repository, tmp_path, endpoint, protocol,
                               options=("--graceful-shutdown-seconds", str(grace)))
        try:
            with server.clients() as (http, stub):
                for _ in range(100):
                    assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
                    assert list(stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT).raw_output_contents)
            time.sleep(0.3)  # the export thread is on the collector by now
        finally:
            signalled = time.monotonic()
            code = server.stop()
            took = time.monotonic() - signalled
    log = server.log_text()
    assert code == 0, log
    assert took < grace + 3, (took, log)
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert any(x["logger"] == "oip.server.observe.tracing" and "traced request(s) dropped" in x["message"]
               for x in lines), log
    # counted, not traced back (the exporter may log its own failure, as it does)
    assert not [x for x in lines if "exception" in x or (x["level"] == "error" and x["logger"].startswith("oip"))], log



def test_an_exporter_that_keeps_failing_writes_a_line_a_minute(repository: Path, tmp_path: Path) -> None:
    """With the collector down, OpenTelemetry's exporter says so for every batch it fails to send (three
    warnings and an error each, about thirty lines a minute under load): the log keeps one line of each message
    a minute (`observe.logs.Repeats`), so ten seconds of traced requests leave one retry warning and at most one
    error."""
    with socket.socket() as collector_socket:
        collector_socket.bind(("127.0.0.1", 0))  # refuses connections: not listening
        endpoint = f"http://127.0.0.1:{collector_socket.getsockname()[1]}"
        server = traced_server(repository, tmp_path, endpoint, "http/protobuf",
                               options=("--graceful-shutdown-seconds", "2"))
        try:
            with server.http_client() as http:
                until = time.monotonic() + 10
                while time.monotonic() < until:
                    assert http.post("/v2/models/simple/infer", json=simple_body()).status_code == 200
                    time.sleep(0.02)
        finally:
            assert server.stop() == 0, server.log_text()
    lines = [json.loads(x) for x in server.log_text().splitlines() if x.startswith("{")]
    exporter = [x["message"] for x in lines if x["logger"].startswith("opentelemetry")]
    assert sum("Connection refused" in message for message in exporter) == 1, exporter  # a retry's warning
    assert sum("Failed to export" in message for message in exporter) <= 1, exporter  # a batch given up
    assert len(exporter) <= 3, exporter  # and the stop's: "Shutdown in progress, aborting retry."


# (extra environment, the characters of a request id kept as its span's attribute)
ATTRIBUTE_LIMITS = {
    "default": ({}, 256),
    "general": ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "40"}, 40),
    "span_first": ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "12", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "40"}, 12),
}


@pytest.mark.parametrize("case", list(ATTRIBUTE_LIMITS))
def test_span_attributes_honour_the_attribute_length_limits_and_a_long_id_is_cut(
        case: str, repository: Path, tmp_path: Path, http_receiver: tuple[Receiver, str]) -> None:
    """A client's 100 kB request id is cut to OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, else to
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, else to 256 characters in the exported span (the answer still echoes it
    whole)."""
    extra, kept = ATTRIBUTE_LIMITS[case]
    receiver, endpoint = http_receiver
    server = traced_server(repository, tmp_path, endpoint, "http/protobuf", extra=extra)
    try:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        request_id = "".join(secrets.choice("abcdef") for _ in range(100_000))
        with server.http_client() as http:
            answer = http.post("/v2/models/simple/infer", json=simple_body(id=request_id),
                               headers={"traceparent": f"00-{trace_id}-{parent}-01"})
            assert answer.status_code == 200 and answer.json()["id"] == request_id
        request = next(s for s in receiver.trace(trace_id, 5) if s["name"] == "ModelInfer simple")
        assert request["attributes"]["request_id"] == request_id[:kept]
        assert request["attributes"]["model_name"] == "simple"[:kept]
    finally:
        assert server.stop() == 0, server.log_text()


@pytest.mark.parametrize("case", ["default", "no_id_limit"])
def test_a_silent_collector_and_10_mb_request_ids_cost_bounded_memory(
        case: str, repository: Path, tmp_path: Path) -> None:
    """A collector that accepts and never answers, and 40 requests each with a 10 MB id: what waits for export
    is bounded (ids cut to 256 characters; with a limit that keeps them whole, the queue's 16 MiB), so the server's
    RSS grows by far less than the 400 MB the ids make (it kept them all before)."""
    extra = {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": str(20 * 1024 * 1024)} if case == "no_id_limit" else {}
    with socket.socket() as collector_socket:
        collector_socket.bind(("127.0.0.1", 0))
        collector_socket.listen(64)  # the kernel completes the connections; nobody reads or answers
        endpoint = f"http://127.0.0.1:{collector_socket.getsockname()[1]}"
        server = traced_server(repository, tmp_path, endpoint, "http/protobuf", extra=extra,
                               options=("--graceful-shutdown-seconds", "2"))
        try:
            body = json.dumps(simple_body(id="x" * 10_000_000)).encode()
            start = body.index(b'"xxxx')
            with server.http_client() as http:
                for i in range(43):  # the first three: the allocator's arenas and the exporter's connection warm up
                    if i == 3:
                        before = server.rss_kib()
                    one = body[:start + 1] + f"{i:02d}".encode() + body[start + 3:]  # a new id each time
                    assert http.post("/v2/models/simple/infer", content=one).status_code == 200
            grown = server.rss_kib() - before
        finally:
            assert server.stop() == 0, server.log_text()
    assert grown < 120 * 1024, f"RSS grew by {grown} KiB"


def test_invalid_trace_contexts_log_no_client_text(repository: Path, tmp_path: Path,
                                                    http_receiver: tuple[Receiver, str]) -> None:
    """A tracestate with invalid members, a traceparent too long, or one that is no traceparent at all, is ignored
    (W3C Trace Context); the OpenTelemetry API's warning about some (quoting the caller's text) never reaches the
    log: 300 such requests leave a line counting them (at most one a minute, and one at the stop), whatever the API
    version warns about, and a request with a valid traceparent is still traced in the caller's trace."""
    receiver, endpoint = http_receiver
    server = traced_server(repository, tmp_path, endpoint, "http/protobuf")
    marker = secrets.token_hex(8)
    try:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        with server.http_client() as http:
            for i in range(300):
                headers = {"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": f"ok=1,{marker}!{i}=bad value"}
                if i % 3 == 1:
                    headers = {"traceparent": f"{marker} is no traceparent"}
                if i % 3 == 2:
                    headers = {"traceparent": f"00-{trace_id}-{parent}-01-{marker}" + "x" * 600}
                assert http.post("/v2/models/simple/infer", json=simple_body(), headers=headers).status_code == 200
        assert len(receiver.trace(trace_id, 5 * 100)) >= 5 * 100  # the valid traceparents still joined the trace
    finally:
        assert server.stop() == 0, server.log_text()
    log = server.log_text()
    assert marker not in log, log[-3000:]
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert not [x for x in lines if x["logger"].startswith("opentelemetry")], log[-3000:]
    counted = [x for x in lines if "caller trace context(s)" in x["message"]]
    assert 1 <= len(counted) <= 2 and sum(int(x["message"].split()[0]) for x in counted) == 300, counted


def test_only_inference_requests_are_spans(repository: Path, tmp_path: Path,
                                          http_receiver: tuple[Receiver, str]) -> None:
    """With tracing on, REST requests other than inference (health, metadata) make no span, whatever the web
    framework would make of them once a tracer provider is set: the server's spans are the data plane's."""
    receiver, endpoint = http_receiver
    server = traced_server(repository, tmp_path, endpoint, "http/protobuf")
    try:
        other_trace, inference_trace = secrets.token_hex(16), secrets.token_hex(16)
        with server.clients() as (http, _):
            headers = {"traceparent": f"00-{other_trace}-{secrets.token_hex(8)}-01"}
            for path in ("/v2/health/ready", "/v2/models/simple", "/v2/models/simple/ready", "/v2"):
                assert http.get(path, headers=headers).status_code == 200, path
            answer = http.post("/v2/models/simple/infer", json=simple_body(),
                               headers={"traceparent": f"00-{inference_trace}-{secrets.token_hex(8)}-01"})
            assert answer.status_code == 200
        assert len(receiver.trace(inference_trace, 5)) == 5  # exported after the requests before it
        server_spans = [s for s in receiver.spans if s["trace_id"] == other_trace]
    finally:
        assert server.stop() == 0, server.log_text()
    assert server_spans == []


def test_the_generated_clients_propagate_the_callers_context(repository: Path, tmp_path: Path,
                                                             http_receiver: tuple[Receiver, str]) -> None:
    from oip.client import GrpcClient, RestClient
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    receiver, endpoint = http_receiver
    server = traced_server(repository, tmp_path, endpoint, "http/protobuf")
    tracer = TracerProvider().get_tracer("test")
    inputs = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)}
    try:
        for make in (lambda: RestClient(server.url), lambda: GrpcClient(server.target)):
            with tracer.start_as_current_span("caller") as span, make() as client:
                client.infer("simple", inputs)
                context = span.get_span_context()
            spans = receiver.trace(f"{context.trace_id:032x}", 5)
            request = next(s for s in spans if s["name"] == "ModelInfer simple")
            assert request["parent"] == f"{context.span_id:016x}"
        assert trace.get_current_span().get_span_context().is_valid is False  # nothing leaked
    finally:
        assert server.stop() == 0, server.log_text()


def test_the_generated_clients_work_without_opentelemetry(repository: Path, tmp_path: Path) -> None:
    """Where OpenTelemetry cannot be imported, the generated clients add nothing to a request and still answer,
    over REST and gRPC (the package is run in a process where importing `opentelemetry` fails)."""
    import subprocess
    import sys

    from conftest import GENERATED

    code = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # not installed: importing it fails
        import numpy as np
        from oip.client import GrpcClient, RestClient, propagation
        assert propagation._propagate is None
        assert propagation.with_trace_context({"x-a": "1"}) == {"x-a": "1"}
        assert propagation.with_trace_context(None) is None
        inputs = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)}
        sums = []
        for make in (lambda: RestClient(sys.argv[1]), lambda: GrpcClient(sys.argv[2])):
            with make() as client:
                sums.append(client.infer("simple", inputs)["OUTPUT0"].tolist())
        print(sums)
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry.")))
    """)
    with running(repository, tmp_path, ready=("simple",)) as server:
        done = subprocess.run([sys.executable, "-c", code, server.url, server.target], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(GENERATED)})
    assert done.returncode == 0, done.stderr
    sums, imported = done.stdout.strip().splitlines()[-2:]
    assert json.loads(sums) == [[[i + 1 for i in range(16)]]] * 2
    assert imported == "[]"


def test_the_spans_of_a_decoupled_model_a_failure_and_a_models_own_span(repository: Path, tmp_path: Path,
                                                                       grpc_receiver: tuple[Receiver, str]) -> None:
    """Over OTLP/gRPC: a decoupled model's request has one compute_infer / compute_output pair per response (and
    the model's last run, which answered nothing more); a failed request's span says so; a span the model makes
    itself with the OpenTelemetry API is a child of its request's span, over REST (a worker thread) and gRPC (the
    gRPC server's thread)."""
    import tritonclient.grpc as grpcclient

    receiver, endpoint = grpc_receiver
    server = traced_server(repository, tmp_path, endpoint, "grpc", ready=("simple", "words", "spanning"))
    words_trace, words_parent = secrets.token_hex(16), secrets.token_hex(8)
    results: list[Any] = []
    client = grpcclient.InferenceServerClient(server.target)
    try:
        client.start_stream(callback=lambda result, error: results.append(error or result),
                            headers={"traceparent": f"00-{words_trace}-{words_parent}-01"})
        tensor = grpcclient.InferInput("TEXT", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"one two three"], dtype=object))
        client.async_stream_infer("words", [tensor], request_id="words-1")
        deadline = time.monotonic() + TIMEOUT
        while len(results) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        client.stop_stream()
        assert [r.as_numpy("WORD")[0] for r in results] == [b"one", b"two", b"three"]
        _, children = check_trace(receiver.trace(words_trace, 9), words_parent, "grpc", "words-1", model="words")
        assert [c["name"] for c in children] == ["compute_input", *["compute_infer", "compute_output"] * 3,
                                                 "compute_infer"]

        failed_trace, failed_parent = secrets.token_hex(16), secrets.token_hex(8)
        with server.clients() as (http, stub):
            assert http.post("/v2/repository/models/broken_math/load").status_code == 200
            assert_error_body(http.post("/v2/models/broken_math/infer", json=fp32_body([1, 2]),
                                        headers={"traceparent": f"00-{failed_trace}-{failed_parent}-01"}), 500)
            spanning = {}
            for transport in ("rest", "grpc"):
                trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
                headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
                if transport == "rest":
                    answer = http.post("/v2/models/spanning/infer", json=fp32_body([1, 2]), headers=headers)
                    assert answer.status_code == 200, answer.text
                else:
                    request = pb.ModelInferRequest(model_name="spanning")
                    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2]).contents.fp32_contents[:] = [1, 2]
                    stub.ModelInfer(request, timeout=TIMEOUT, metadata=tuple(headers.items()))
                spanning[transport] = (trace_id, parent)
        request, children = check_trace(receiver.trace(failed_trace, 3), failed_parent, "rest", "",
                                        model="broken_math", status="MODEL_FAILURE")
        assert "divided by zero" in request["status"][1]
        assert [c["name"] for c in children] == ["compute_input", "queue", "compute_infer"]
        for transport, (trace_id, parent) in spanning.items():
            spans = receiver.trace(trace_id, 6)
            own = next(s for s in spans if s["name"] == "model work")
            request = next(s for s in spans if s["name"] == "ModelInfer spanning")
            assert own["parent"] == request["span_id"] and own["scope"] == "spanning", (transport, spans)
            assert request["parent"] == parent and request["attributes"]["transport"] == transport
            assert request["start"] <= own["start"] <= own["end"] <= request["end"]
    finally:
        client.close()
        assert server.stop() == 0, server.log_text()


def test_the_configured_sampler_decides(repository: Path, tmp_path: Path,
                                        http_receiver: tuple[Receiver, str]) -> None:
    """parentbased_traceidratio with ratio 0: a request without a traceparent is not sampled (ratio 0 exports
    nothing), one whose caller sampled is, one whose caller did not is not; the log lines of every request carry
    its trace and span ids, sampled or not."""
    receiver, endpoint = http_receiver
    server = traced_server(repository, tmp_path, endpoint, "http/protobuf", sampler="parentbased_traceidratio",
                           ratio="0")
    try:
        unsampled_trace, sampled_trace = secrets.token_hex(16), secrets.token_hex(16)
        with server.http_client() as http:
            for i in range(20):
                assert http.post("/v2/models/simple/infer", json=simple_body(id=f"root-{i}")).status_code == 200
            answer = http.post("/v2/models/simple/infer", json=simple_body(id="unsampled"),
                               headers={"traceparent": f"00-{unsampled_trace}-{secrets.token_hex(8)}-00"})
            assert answer.status_code == 200
            answer = http.post("/v2/models/simple/infer", json=simple_body(id="sampled"),
                               headers={"traceparent": f"00-{sampled_trace}-{secrets.token_hex(8)}-01"})
            assert answer.status_code == 200
        # Spans leave in the order their requests finished: once the last request's arrived, any earlier would have.
        spans = receiver.trace(sampled_trace, 5)
        assert {s["attributes"].get("request_id") for s in spans} == {"sampled", None}
        with receiver.lock:
            exported = {s["attributes"].get("request_id") for s in receiver.spans}
        assert not exported & {"unsampled", *(f"root-{i}" for i in range(20))}
        assert not [s for s in receiver.spans if s["trace_id"] == unsampled_trace]
        lines = [json.loads(x) for x in server.log_text().splitlines() if x.startswith("{")]
        access = {x["request_id"]: x for x in lines if x.get("logger") == "oip.access" and "request_id" in x}
        assert access["unsampled"]["trace_id"] == unsampled_trace and len(access["unsampled"]["span_id"]) == 16
        assert access["sampled"]["trace_id"] == sampled_trace
        assert len({access[f"root-{i}"]["trace_id"] for i in range(20)}) == 20  # a new trace each
    finally:
        assert server.stop() == 0, server.log_text()


def test_the_otlp_encoding_is_the_sdks() -> None:
    """What the server writes for its spans is byte for byte what the SDK's OTLP encoder writes for the same
    spans: caller's parent or none, trace state, error with a message, non-ASCII and long values, many spans."""
    from oip.server.observe import otlp, tracing
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource.create({"service.name": "oip-under-test", "deployment": "é" * 200})
    scope = InstrumentationScope("oip.server")
    rng = secrets.SystemRandom()
    spans = []
    for i in range(60):
        trace_id, request_id = rng.getrandbits(128) | 1, rng.getrandbits(64) | 1
        start = time.time_ns() + rng.getrandbits(30)
        spans.append(otlp.OtlpSpan(
            trace_id, request_id, rng.getrandbits(64) | 1 if i % 3 else 0, bool(i % 3), "vendor=a,other=b" if i % 2
            else "", f"ModelInfer model-{'x' * i}", True, start, start + 10**6,
            (("model_name", f"model-{'x' * i}"), ("model_version", "1"), ("request_id", "ré" * i),
             ("transport", "grpc"), ("status", "OK" if i % 4 else "MODEL_FAILURE")),
            1 if i % 4 else 2, "" if i % 4 else "the model failed: " + "ü" * i,
        ))
        for phase in ("compute_input", "queue", "compute_infer", "compute_output"):
            spans.append(otlp.OtlpSpan(trace_id, rng.getrandbits(64) | 1, request_id, False, "", phase, False,
                                          start + 1, start + 2 + i, (), 0, ""))
    envelope = otlp.envelope_of(resource, scope)
    for batch in (spans[:1], spans[:5], spans):
        expected = encode_spans(otlp.readable_spans(batch, resource, scope)).SerializeToString()
        assert otlp.encode(batch, envelope) == expected

    # The server's path: requests through the observer (a root, a caller's with a trace state and a failure, a
    # decoupled one's phases), then the export request it writes, against the SDK's for the same spans.
    from oip.server.errors import ModelFailure
    from oip.server.observe.events import COMPUTE_INFER, COMPUTE_OUTPUT, QUEUE, Timer
    from opentelemetry.sdk.trace import TracerProvider

    posted: list[tuple[bytes, int]] = []
    observer = tracing.Tracing(TracerProvider(resource=resource), None, scope,
                               lambda *sent: posted.append(sent) or True)
    try:
        callers = (None, {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01",
                          "tracestate": "vendor=a,other=b"})
        for i, caller in enumerate(callers):
            timer = Timer(f"request-{i}", caller, "grpc")
            observer.request_started(timer, "simple", "1")
            for phase in (QUEUE, COMPUTE_INFER, COMPUTE_OUTPUT, COMPUTE_INFER, COMPUTE_OUTPUT):
                timer.enter(phase)
            observer.request_finished(timer.record("simple", "1", 1, ModelFailure("it broke") if i else None))
        batch = list(observer.queue)
        assert len(batch) == 2 and observer.envelope is not None
        ids = [rng.getrandbits(64) | 1 for _ in range(12)]  # six phases each: compute_input and the five above
        spans = [span for i, finished in enumerate(batch) for span in otlp.spans_of(finished, iter(ids[6 * i:]))]
        assert [s.parent_id for s in spans[8:]] == [spans[7].span_id] * 6 and spans[7].trace_state == "vendor=a,other=b"
        encoded = b"".join(otlp.encode_finished(finished, iter(ids[6 * i:])) for i, finished in enumerate(batch))
        expected = encode_spans(otlp.readable_spans(spans, resource, scope)).SerializeToString()
        assert otlp.wrap(encoded, observer.envelope) == expected
    finally:
        observer.shutdown()
    assert sum(count for _, count in posted) == 14  # what was queued left at the stop


@pytest.mark.parametrize("generator", ["default", "counting"])
def test_the_phase_spans_take_their_ids_from_the_configured_generator(generator: str) -> None:
    """The phases' span ids come from the tracer provider's id generator: the SDK's default one's are drawn at
    once (64 random bits each, never zero, all different here), any other's are asked one by one."""
    from oip.server.observe import tracing
    from oip.server.observe.events import COMPUTE_INFER, COMPUTE_OUTPUT, QUEUE, Timer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    class Counting(IdGenerator):
        def __init__(self) -> None:
            self.given = 0

        def generate_span_id(self) -> int:
            self.given += 1
            return 0x1000 + self.given

        def generate_trace_id(self) -> int:
            return 0xABC

    ids: IdGenerator = RandomIdGenerator() if generator == "default" else Counting()
    posted: list[bytes] = []
    observer = tracing.Tracing(TracerProvider(id_generator=ids), None, InstrumentationScope("oip.server"),
                               lambda payload, count: posted.append(payload) or True)
    try:
        for i in range(30):
            timer = Timer(f"request-{i}", None, "rest")
            observer.request_started(timer, "simple", "1")
            for phase in (QUEUE, COMPUTE_INFER, COMPUTE_OUTPUT):
                timer.enter(phase)
            observer.request_finished(timer.record("simple", "1", 1))
        observer.flush()
    finally:
        observer.shutdown()
    spans = [span for payload in posted
             for span in trace_service_pb2.ExportTraceServiceRequest.FromString(payload).resource_spans[0]
             .scope_spans[0].spans]
    requests = [span for span in spans if span.name == "ModelInfer simple"]
    phases = [span for span in spans if span.name != "ModelInfer simple"]
    assert len(requests) == 30 and len(phases) == 120
    phase_ids = [int.from_bytes(span.span_id, "big") for span in phases]
    request_ids = [int.from_bytes(span.span_id, "big") for span in requests]
    if generator == "counting":  # each request's own id, then its phases' at the export: 0x1001..0x101e, then
        assert request_ids == [0x1001 + i for i in range(30)]
        assert phase_ids == [0x1001 + 30 + i for i in range(120)]
    else:
        assert 0 not in phase_ids and len(set(phase_ids + request_ids)) == 150
        assert all(len(span.span_id) == 8 for span in spans)
        assert max(phase_ids) >= 2**60  # 64-bit ids, not small numbers
    for request in requests:
        children = [span for span in phases if span.parent_span_id == request.span_id]
        assert [span.name for span in children] == ["compute_input", "queue", "compute_infer", "compute_output"]
        assert all(span.trace_id == request.trace_id for span in children)


@pytest.mark.parametrize("way", ["post refused", "post raises", "export fails", "export raises"])
def test_requests_the_collector_did_not_take_are_counted_not_traced_back(
        way: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An export the collector did not take, whether the exporter says so (newer OpenTelemetry) or raises (older
    ones raise a refused connection), drops its batch's requests: counted in one warning a minute (and one at the
    stop), with the reason cut short, never a traceback a batch."""
    from oip.server.observe import tracing
    from oip.server.observe.events import COMPUTE_INFER, Timer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    refused = ConnectionRefusedError("the collector refused the connection " + "x" * 1000)

    class Failing(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            if way == "export raises":
                raise refused
            return SpanExportResult.FAILURE

    def post(payload: bytes, count: int) -> bool:
        if way == "post raises":
            raise refused
        return False

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # flushed here, not by the export thread's schedule
    exporting = way.startswith("export")
    observer = tracing.Tracing(TracerProvider(), Failing(), InstrumentationScope("oip.server"),
                               None if exporting else post)

    def requests(count: int) -> None:
        for i in range(count):
            timer = Timer(f"request-{i}", None, "rest")
            observer.request_started(timer, "simple", "1")
            timer.enter(COMPUTE_INFER)
            observer.request_finished(timer.record("simple", "1", 1))

    def told() -> list[str]:
        lines = [r for r in caplog.records if r.name == "oip.server.observe.tracing"]
        assert not [r for r in lines if r.exc_info], lines
        return [r.getMessage() for r in lines]

    with caplog.at_level("INFO", logger="oip.server.observe.tracing"):
        try:
            requests(3)
            observer.flush()
            observer._report()
            [first] = told()
            assert first.startswith("3 traced request(s) dropped: the collector did not take them ("), first
            if way.endswith("raises"):
                assert "(ConnectionRefusedError: the collector refused the connection xxx" in first
                assert len(first) < 400, first
            else:
                assert first.endswith("(the exporter reported a failure)"), first
            requests(2)
            observer.flush()
            observer._report()
            assert told() == [first]  # once a minute
        finally:
            observer.shutdown()
    assert told()[1:] == ["2 traced request(s) dropped: " + first.split(": ", 1)[1]]  # the rest, at the stop


def test_a_requests_own_span_context_is_what_the_api_makes() -> None:
    """The request's own span context is built without the API's constructor only where that gives what the
    constructor gives (fields, validity, type); for a `SpanContext` built otherwise, the constructor is used."""
    import types

    from oip.server.observe import tracing
    from opentelemetry import trace

    make = tracing._own_span_context(trace)
    flags, state = trace.TraceFlags, trace.TraceState([("k", "v")])
    for trace_id, span_id in ((1, 1), (2**128 - 1, 2**64 - 1), (0, 7), (7, 0), (2**128, 7), (7, 2**64)):
        for trace_flags, trace_state in ((flags(1), None), (flags(0), state)):
            ours = make(trace_id, span_id, trace_flags, trace_state)
            theirs = trace.SpanContext(trace_id, span_id, False, trace_flags, trace_state)
            assert type(ours) is trace.SpanContext and ours == theirs
            assert (ours.is_valid, ours.is_remote, ours.trace_state) == (theirs.is_valid, False, theirs.trace_state)

    class Reordered(trace.SpanContext):  # a SpanContext whose fields are laid out otherwise
        def __new__(cls, trace_id: int, span_id: int, is_remote: bool, trace_flags: Any = None,
                    trace_state: Any = None) -> Reordered:
            return tuple.__new__(cls, (span_id, trace_id, is_remote, trace_flags, trace_state, True))

    other = types.SimpleNamespace(SpanContext=Reordered, DEFAULT_TRACE_STATE=trace.DEFAULT_TRACE_STATE,
                                  TraceFlags=trace.TraceFlags, TraceState=trace.TraceState)
    made = tracing._own_span_context(other)(3, 4, flags(1), None)
    assert made == Reordered(3, 4, False, flags(1), None) and made[0] == 4


def test_the_running_request_is_current_without_attaching(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a traced request runs, OpenTelemetry's current span is the request's although the request attached
    nothing: a span started then is its child, and is current while it is; after the request, neither is. Where the
    API's runtime context is another one, the request attaches its context instead, with the same result."""
    import contextvars

    from oip.server.observe import tracing
    from oip.server.observe.events import Observers, Timer
    from opentelemetry import context, trace
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    provider = TracerProvider()
    tracer = provider.get_tracer("model")

    def one_request(observer: tracing.Tracing) -> tuple[Any, ...]:
        variable = context._RUNTIME_CONTEXT._current_context  # what attaching sets
        before = variable.get()
        timer = Timer("id", None, "rest")
        Observers([observer]).request_started(timer, "simple", "1")
        traced = timer.state["otel"]
        during = trace.get_current_span().get_span_context()
        attached = variable.get() is not before
        with tracer.start_as_current_span("own") as own:
            inside = trace.get_current_span().get_span_context()
        after_own = trace.get_current_span().get_span_context()
        observer.request_finished(timer.record("simple", "1", 1))
        after = trace.get_current_span().get_span_context()
        return (during.span_id == traced.span_id and during.trace_id == traced.trace_id,
                own.parent.span_id == traced.span_id, inside.span_id == own.get_span_context().span_id,
                after_own.span_id == traced.span_id, after.is_valid, attached)

    lazy = tracing.Tracing(provider, None, InstrumentationScope("oip.server"), lambda *sent: True)
    try:
        assert lazy.runtime is not None and context._RUNTIME_CONTEXT is lazy.runtime
        assert contextvars.copy_context().run(one_request, lazy) == (True, True, True, True, False, False)
    finally:
        lazy.shutdown()

    class Another(ContextVarsRuntimeContext):  # as OTEL_PYTHON_CONTEXT would choose one
        pass

    monkeypatch.setattr(context, "_RUNTIME_CONTEXT", Another())
    attaching = tracing.Tracing(provider, None, InstrumentationScope("oip.server"), lambda *sent: True)
    try:
        assert attaching.runtime is None and type(context._RUNTIME_CONTEXT) is Another
        assert contextvars.copy_context().run(one_request, attaching) == (True, True, True, True, False, True)
    finally:
        attaching.shutdown()


def test_a_grpc_thread_forgets_the_request_it_served(repository: Path, tmp_path: Path) -> None:
    """A gRPC thread serves one call after another: what a request made current there (its timer, its trace
    context) must not be current in the next call. (grpcio runs each call of its thread pool server in a context
    of its own, and the server relies on it.) With one gRPC thread, a request that fails in decoding, before it is
    one of the data plane's, comes after a request answered there: its access log line names no request."""
    server = start_server(repository, tmp_path, "--grpc-threads", "1", "--access-log", "--log-format", "json",
                          ready=("simple",))
    try:
        with server.clients() as (_, stub):
            first = pb.ModelInferRequest(model_name="simple", id="first")  # typed contents: the general way
            for name in ("INPUT0", "INPUT1"):
                first.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents[:] = range(16)
            stub.ModelInfer(first, timeout=TIMEOUT)
            second = pb.ModelInferRequest(model_name="simple", id="second")
            for name in ("INPUT0", "INPUT1"):
                second.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents[:] = [1, 2, 3]
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(second, timeout=TIMEOUT)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        assert server.stop() == 0, server.log_text()
    lines = [json.loads(x) for x in server.log_text().splitlines() if x.startswith("{")]
    access = [x for x in lines if x.get("logger") == "oip.access" and x.get("operation") == "ModelInfer"]
    assert [(x["status"], x.get("request_id")) for x in access] == [("OK", "first"), ("INVALID_ARGUMENT", None)]


@pytest.mark.parametrize("name", ["always_on", "always_off", "parentbased_always_on", "parentbased_always_off",
                                  "parentbased_traceidratio"])
def test_a_sampler_that_follows_the_parent_decides_as_when_asked(name: str) -> None:
    """A sampler whose decision depends on the parent's flags only is not asked per request: what the request's
    span gets (sampled or not, trace state) is what the sampler answers, for a root, a remote parent sampled or
    not (with a trace state), and a local parent sampled or not; any other sampler is asked."""
    from oip.server.observe import tracing
    from oip.server.observe.events import Observers, Timer
    from opentelemetry import context, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import _KNOWN_SAMPLERS
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    sampler = _KNOWN_SAMPLERS[name] if name != "parentbased_traceidratio" else _KNOWN_SAMPLERS[name](0.0)
    observer = tracing.Tracing(TracerProvider(sampler=sampler), None, InstrumentationScope("oip.server"),
                               lambda *sent: True)
    try:
        assert (observer.fixed is None) == (name == "parentbased_traceidratio")
        state = "vendor=a,other=b"
        remote = [{"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{flags}", "tracestate": state}
                  for flags in ("01", "00")]
        local = [trace.SpanContext(int(secrets.token_hex(16), 16), int(secrets.token_hex(8), 16), False,
                                   trace.TraceFlags(flags)) for flags in (1, 0)]
        for caller, current in [(None, None), *((c, None) for c in remote), *((None, c) for c in local)]:
            token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(current))) if current else None
            try:
                parent = observer.propagator.extract(caller) if caller else context.get_current()
                expected = sampler.should_sample(parent, 1, "ModelInfer simple", trace.SpanKind.SERVER, {})
                timer = Timer("id", caller, "grpc")
                Observers([observer]).request_started(timer, "simple", "1")  # as the pipeline starts a request
                traced = timer.state["otel"]
                assert traced.sampled == expected.decision.is_sampled(), (caller, current)
                assert traced.trace_state == expected.trace_state, (caller, current)
                assert bool(traced.trace_state) == (caller is not None), caller  # the caller's tracestate
                span = trace.get_current_span().get_span_context()
                assert (span.span_id, span.trace_flags.sampled) == (traced.span_id, traced.sampled)
                observer.request_finished(timer.record("simple", "1", 1))
                assert trace.get_current_span().get_span_context() == (current or trace.INVALID_SPAN_CONTEXT)
            finally:
                if token is not None:
                    context.detach(token)
    finally:
        observer.shutdown()


@pytest.mark.parametrize(("endpoint", "environment", "lean"), [
    ("http://127.0.0.1:4318/v1/traces", {}, True),
    ("http://127.0.0.1:4318/v1/traces", {"HTTP_PROXY": "http://proxy.invalid:3128"}, False),
    ("http://127.0.0.1:4318/v1/traces", {"ALL_PROXY": "http://proxy.invalid:3128"}, False),
    ("http://127.0.0.1:4318/v1/traces", {"HTTP_PROXY": "http://proxy.invalid:3128", "NO_PROXY": "127.0.0.1"}, True),
    ("http://collector.invalid:4318/v1/traces", {"NETRC": "{netrc}"}, False),
    ("http://127.0.0.1:4318/v1/traces", {"NETRC": "{netrc}"}, True),
    ("https://127.0.0.1:4318/v1/traces", {}, False),
])
def test_the_http_exporter_keeps_its_default_transport_where_the_environment_applies(
        endpoint: str, environment: dict[str, str], lean: bool, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The OTLP/HTTP exporter sends over a plain connection of its own only where requests, its default, would
    send the same request: a plain-HTTP endpoint that no proxy variable and no .netrc entry covers."""
    from oip.server.observe import tracing_setup
    from oip.server.observe.otlp_http import PlainHTTPTransport
    from opentelemetry.exporter.http.transport._requests import RequestsHTTPTransport

    netrc = tmp_path / "netrc"
    netrc.write_text("machine collector.invalid login user password secret\n")
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    for name, setting in environment.items():
        monkeypatch.setenv(name, setting.format(netrc=netrc))
    exporter = tracing_setup._http_exporter()
    try:
        transport = exporter._client._transport
        assert type(transport) is (PlainHTTPTransport if lean else RequestsHTTPTransport)
    finally:
        exporter.shutdown()


def test_without_requests_the_http_exporter_keeps_its_own_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OTLP/HTTP exporter version that does not send with requests (1.45.0 did not install it): the server does
    not fail to start on its import, and the exporter keeps the transport it has."""
    import sys

    from oip.server.observe import tracing_setup

    monkeypatch.setitem(sys.modules, "requests", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "requests.utils", None)
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    assert tracing_setup._settings_cannot_apply("http://127.0.0.1:4318/v1/traces") is False


def test_the_plain_http_transport_keeps_its_connection_and_tells_errors_as_the_exporter_expects() -> None:
    """Through the OTLP exporter's own client (its headers, its retries): exports go over one kept-alive
    connection, with the exporter's body and headers; one the receiver dropped is made again and the export
    succeeds; an answer's headers are read whatever their case; a refused connection is a connection error, an answer
    that does not come in time is not; closing ends a request waiting for its answer."""
    from oip.server.observe.otlp_http import PlainHTTPTransport
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    seen: list[tuple[str, bytes, str, int]] = []
    drop, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # http.server's naming
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append((self.path, body, self.headers["content-type"], self.client_address[1]))
            if self.path == "/slow":
                time.sleep(1.0)
            if self.path == "/held":
                release.wait(10)
            self.send_response(200)
            self.send_header("X-Answer", "yes")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            self.close_connection = drop.is_set()  # closed without saying so: the client finds out next time

        def log_message(self, *args: Any) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    transport = PlainHTTPTransport()
    exporter = OTLPSpanExporter(endpoint=url, _transport=transport)  # type: ignore[call-arg,unused-ignore]
    try:
        assert exporter._client.export(b"first").success and exporter._client.export(b"second").success
        drop.set()
        assert exporter._client.export(b"third").success  # the receiver closes the connection after answering
        drop.clear()
        assert exporter._client.export(b"fourth").success  # a dropped connection: made again at once
        assert [(path, body, kind) for path, body, kind, _ in seen] == [
            ("/v1/traces", body, "application/x-protobuf") for body in (b"first", b"second", b"third", b"fourth")]
        ports = [port for *_, port in seen]
        assert ports[0] == ports[1] == ports[2] != ports[3]

        answer = transport.request("POST", url, data=b"x", timeout=5)
        assert (answer.status_code, answer.content(), answer.headers()["x-answer"]) == (200, b"ok", "yes")
        slow = transport.request("POST", url.replace("/v1/traces", "/slow"), data=b"x", timeout=0.2)
        assert isinstance(slow.error, TimeoutError) and not transport.is_connection_error(slow.error)
        again = transport.request("POST", url, data=b"x", timeout=5)
        assert again.status_code == 200  # a new connection after the one that timed out
        # Closing (the exporter's stop) ends a request waiting for its answer at once, and refuses later ones.
        waiting: list[Any] = []
        sender = threading.Thread(target=lambda: waiting.append(
            transport.request("POST", url.replace("/v1/traces", "/held"), data=b"x", timeout=30)))
        sender.start()
        while len(seen) < 8:  # the receiver has the request
            time.sleep(0.01)
        transport.close()
        sender.join(0.5)
        assert not sender.is_alive() and waiting[0].status_code is None and waiting[0].error is not None
        closed = transport.request("POST", url, data=b"x", timeout=5)
        assert closed.status_code is None and len(seen) == 8
    finally:
        release.set()
        exporter.shutdown()
        receiver.shutdown()
        receiver.server_close()
    refused = PlainHTTPTransport().request("POST", url, data=b"x", timeout=5)  # the receiver is gone
    assert refused.status_code is None and PlainHTTPTransport().is_connection_error(refused.error)


def test_a_plain_traceparent_is_read_as_the_propagator_reads_it() -> None:
    """The request path reads a plain traceparent itself: what it reads is exactly the SDK propagator's span
    context, and anything else (another version, uppercase, spaces, zero ids, a tracestate) is left to the
    propagator; either way the request's span joins the same trace under the same parent, sampled the same."""
    from oip.server.observe import tracing
    from oip.server.observe.events import Timer
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    observer = tracing.Tracing(TracerProvider(), None, InstrumentationScope("oip.server"), lambda *sent: True)
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    plain = [f"00-{trace_id}-{span_id}-{flags}" for flags in ("01", "00", "03", "ff")]
    other = [f"00-{trace_id.upper()}-{span_id}-01", f"01-{trace_id}-{span_id}-01", f"ff-{trace_id}-{span_id}-01",
             f" 00-{trace_id}-{span_id}-01", f"00-{trace_id}-{span_id}-01 ", f"00-{trace_id}-{span_id}-01-x",
             f"00-{'0' * 32}-{span_id}-01", f"00-{trace_id}-{'0' * 16}-01", f"00-{trace_id}-{span_id}-1", "",
             f"01-{trace_id}-{span_id}-01-later"]
    try:
        carriers = [{"traceparent": text} for text in plain + other]
        carriers.append({"traceparent": plain[0], "tracestate": "vendor=a"})
        for caller in carriers:
            expected = trace.get_current_span(observer.propagator.extract(caller)).get_span_context()
            read = observer.plain_caller(caller)
            assert (read is not None) == (caller in carriers[:len(plain)]), caller
            if read is not None:
                assert read == expected and read.is_remote and read.trace_state == expected.trace_state, caller
            timer = Timer("id", caller, "rest")
            observer.request_started(timer, "simple", "1")
            traced = timer.state["otel"]
            if expected.is_valid:
                assert (traced.trace_id, traced.parent_id, traced.remote) == (expected.trace_id, expected.span_id, True)
                assert traced.sampled == expected.trace_flags.sampled, caller
            else:
                assert traced.parent_id == 0 and traced.sampled, caller  # a new trace (parentbased_always_on)
            observer.request_finished(timer.record("simple", "1", 1))
    finally:
        observer.shutdown()


OFF_PATH = """
import asyncio, json, sys, threading
import httpx
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from oip.server import Assembly, ModelRepository, Settings
from oip.server.grpc.in_thread import NOT_HERE, in_thread
sys.path.insert(0, sys.argv[1])
from model import Simple

TRACING = tuple(".server.observe." + name for name in ("tracing", "tracing_setup", "otlp", "otlp_http"))

class Context:  # what the gRPC handler reads of its call
    def invocation_metadata(self):
        return (("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),)

async def main():
    repository = ModelRepository()
    repository.add(Simple("simple"))
    await repository.load_all()
    settings = Settings()
    server = Assembly.build(repository, settings)
    dataplane = server.dataplane
    app = server.rest_app()
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")]}
    calls = []  # the functions of tracing and OpenTelemetry the requests call, on their threads

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and (module.endswith(TRACING) or module.startswith("opentelemetry")):
            calls.append(module + "." + frame.f_code.co_name)

    sys.setprofile(profile)
    threading.setprofile(profile)  # the model's threads, started with the first request
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://oip") as client:
        answer = await client.post("/v2/models/simple/infer", json=body,
                                   headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        assert answer.status_code == 200, answer.text
    handler = in_thread(dataplane.pipeline, settings, server.servicer().infer, "ModelInfer", None, server.tracing)
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(bytes(64))
    assert handler(message, Context()) is not NOT_HERE
    sys.setprofile(None)
    threading.setprofile(None)
    served = dataplane.statistics.for_model("simple", "1").inference_count
    print(json.dumps([served, dataplane.tracing is not None,
                      sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))),
                      sorted(set(calls))]))
    if dataplane.tracing is not None:
        dataplane.tracing.shutdown()

asyncio.run(main())
"""


@pytest.mark.parametrize("environment", ["none", "exporter", "exporter, SDK disabled"])
def test_tracing_off_imports_no_opentelemetry_sdk(environment: str, http_receiver: tuple[Receiver, str]) -> None:
    """With tracing off, a REST and a gRPC inference carrying a traceparent import nothing of OpenTelemetry's SDK
    or exporters, and call nothing of the server's tracing or of OpenTelemetry: tracing off costs them nothing.
    (The same requests with tracing on do import and call them. The API alone may be imported: recent FastAPI
    versions import it, and leave it unused.) Tracing is off without an exporter named, and with one where the
    standard `OTEL_SDK_DISABLED=true` turns the SDK off."""
    import subprocess
    import sys

    from conftest import GENERATED, ROOT

    _, endpoint = http_receiver
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PYTHONPATH"] = str(GENERATED)
    if environment != "none":
        env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint)
    if environment.endswith("SDK disabled"):
        env["OTEL_SDK_DISABLED"] = "True"  # read as the SDK reads it: whatever the case
    on = environment == "exporter"
    done = subprocess.run([sys.executable, "-c", OFF_PATH, str(ROOT / "examples" / "models" / "simple")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    served, traced, imported, called = json.loads(done.stdout.strip().splitlines()[-1])
    assert (served, traced) == (2, on)
    assert bool(imported) == on, imported
    assert bool(called) == on, called  # off, the requests call nothing of tracing (bench/trace_cost.py counts it)


def test_no_trace_without_the_environment(repository: Path, tmp_path: Path,
                                          http_receiver: tuple[Receiver, str]) -> None:
    """Tracing is off unless OTEL_TRACES_EXPORTER names an exporter: with every other OpenTelemetry variable
    pointing at a working receiver, a sampled traceparent sends it nothing, while the same server with the exporter
    named sends it the request's spans."""
    receiver, endpoint = http_receiver
    trace_ids = {}
    for exporter in (None, "otlp"):
        server = traced_server(repository, tmp_path / str(exporter), endpoint, "http/protobuf", exporter=exporter)
        try:
            trace_ids[exporter] = secrets.token_hex(16)
            with server.clients() as (http, stub):
                answer = http.post("/v2/models/simple/infer", json=simple_body(),
                                   headers={"traceparent": f"00-{trace_ids[exporter]}-{secrets.token_hex(8)}-01"})
                assert answer.status_code == 200
                stub.ModelInfer(simple_grpc_request(), timeout=TIMEOUT,
                                metadata=(("traceparent", f"00-{trace_ids[exporter]}-{secrets.token_hex(8)}-01"),))
        finally:
            assert server.stop() == 0, server.log_text()  # stopping flushes whatever the exporter holds
        assert ("tracing on" in server.log_text()) == (exporter is not None), server.log_text()
    assert len(receiver.trace(trace_ids["otlp"], 10)) == 10  # the receiver works: 5 spans per request
    assert not [s for s in receiver.spans if s["trace_id"] == trace_ids[None]]
