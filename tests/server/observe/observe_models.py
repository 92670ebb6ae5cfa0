"""What the observability tests share (test_served_metrics, test_tracing, test_logs): the models they serve beside
`simple`, a real OTLP receiver over HTTP and gRPC (decoded with opentelemetry-proto), and the access log's lines."""

from __future__ import annotations

import contextlib
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from serving import TIMEOUT, Server, build_repository

# Models of this module: a batching identity, a decoupled word splitter, a model that fails, and one that keeps
# its own metrics.
MODELS = {
    "batched": ('class = "model:Batched"\nmax_batch_size = 8\n', '''
        from oip.server import Model, TensorSpec

        class Batched(Model):
            inputs = (TensorSpec("INPUT0", "FP32", [2]),)
            outputs = (TensorSpec("OUTPUT0", "FP32", [2]),)

            def infer(self, inputs, parameters):
                return {"OUTPUT0": inputs["INPUT0"]}
    '''),
    "words": ('class = "model:Words"\ndecoupled = true\n', '''
        import numpy as np
        from oip.server import Model, TensorSpec

        class Words(Model):
            inputs = (TensorSpec("TEXT", "BYTES", [1]),)
            outputs = (TensorSpec("WORD", "BYTES", [1]),)

            def infer(self, inputs, parameters):
                for word in inputs["TEXT"][0].split():
                    yield {"WORD": np.array([word], dtype=object)}
    '''),
    "broken_math": ('class = "model:BrokenMath"\n', '''
        from oip.server import Model, TensorSpec

        class BrokenMath(Model):
            inputs = (TensorSpec("INPUT0", "FP32", [2]),)
            outputs = (TensorSpec("OUTPUT0", "FP32", [2]),)

            def infer(self, inputs, parameters):
                raise ZeroDivisionError("the model divided by zero")
    '''),
    "counting": ('class = "model:Counting"\n', '''
        from oip.server import Model, TensorSpec

        class Counting(Model):
            inputs = (TensorSpec("INPUT0", "FP32", [2]),)
            outputs = (TensorSpec("OUTPUT0", "FP32", [2]),)

            def load(self):
                self.seen = self.metrics.counter("counting_values_total", "Values seen, by sign", ["sign"])
                self.last = self.metrics.gauge("counting_last_sum", "Sum of the last input")
                self.sizes = self.metrics.histogram("counting_request_values", "Values per request", buckets=[1, 2, 4])
                self.busy = self.metrics.gauge("counting_busy", "Requests being counted")

            def infer(self, inputs, parameters):
                with self.busy.track_inprogress():  # prometheus_client's own API, through the model's labels
                    values = inputs["INPUT0"]
                    self.seen.labels(sign="positive").inc(int((values > 0).sum()))
                    self.seen.labels(sign="other").inc(int((values <= 0).sum()))
                    self.last.set(float(values.sum()))
                    self.sizes.observe(values.size)
                    return {"OUTPUT0": values}
    '''),
    "spanning": ('class = "model:Spanning"\n', '''
        from opentelemetry import trace
        from oip.server import Model, TensorSpec

        class Spanning(Model):
            inputs = (TensorSpec("INPUT0", "FP32", [2]),)
            outputs = (TensorSpec("OUTPUT0", "FP32", [2]),)

            def infer(self, inputs, parameters):
                with trace.get_tracer("spanning").start_as_current_span("model work"):
                    return {"OUTPUT0": inputs["INPUT0"]}
    '''),
}


def write_models(repository: Path) -> None:
    for name, (toml, code) in MODELS.items():
        folder = repository / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.toml").write_text(toml)
        (folder / "model.py").write_text(textwrap.dedent(code))


def fp32_body(values: list[float], shape: list[int] | None = None) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape or [len(values)], "data": values}]}

def observed_repository(root: Path) -> Path:
    """`simple` and the models above, in a repository at `root`."""
    repository = build_repository(root, only=("simple",))
    write_models(repository)
    return repository


# --- a receiver of OTLP trace exports --------------------------------------------------------------------------


class Receiver:
    """What a real OTLP endpoint received: every span of every ExportTraceServiceRequest, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def take(self, data: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
        with self.lock:
            for resource in request.resource_spans:
                attributes = {a.key: _any(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append({
                            "service": attributes.get("service.name"), "resource": attributes,
                            "name": span.name, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                            "attributes": {a.key: _any(a.value) for a in span.attributes},
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                            "kind": span.kind, "status": (span.status.code, span.status.message),
                            "scope": scope.scope.name,
                        })

    def trace(self, trace_id: str, count: int) -> list[dict[str, Any]]:
        """The spans of `trace_id`, once at least `count` arrived (bounded wait)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["trace_id"] == trace_id]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{len(found)} span(s) of trace {trace_id} arrived, expected {count}: {self.spans}")


def _any(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@contextlib.contextmanager
def otlp_http_receiver() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/HTTP endpoint on loopback (its URL) and what it received."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("content-length", "0")))
            assert self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
            receiver.take(data)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def otlp_grpc_receiver() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/gRPC endpoint on loopback (its URL) and what it received."""
    receiver = Receiver()
    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    def export(request: bytes, context: Any) -> bytes:
        receiver.take(request)
        return empty

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(0)


def access_lines(server: Server, *request_ids: str) -> list[dict[str, Any]]:
    """The JSON access-log lines of these requests, in this order, once all are logged (bounded wait)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = [json.loads(line) for line in server.log_text().splitlines() if line.startswith("{")]
        found = {x.get("request_id"): x for x in lines if x["logger"] == "oip.access"}
        if set(request_ids) <= found.keys() or time.monotonic() > deadline:
            return [found[request_id] for request_id in request_ids]
        time.sleep(0.05)
