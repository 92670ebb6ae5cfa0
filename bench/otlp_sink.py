"""An OTLP/HTTP trace receiver for `make bench`: what a tracing server exports to, on the client's CPU.

It decodes every ExportTraceServiceRequest (opentelemetry-proto), counts the spans, answers 200, and on SIGTERM
prints `{"requests": N, "spans": M}`. The benchmark runs it once per run, pinned beside the load generator, so the
exporter's cost is measured in the server and the receiver's is not.

    python bench/otlp_sink.py --port PORT
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

COUNTS = {"requests": 0, "spans": 0}
LOCK = threading.Lock()
ANSWER = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections kept alive, as an OpenTelemetry Collector keeps them

    def do_POST(self) -> None:  # http.server's naming
        data = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
        spans = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        with LOCK:
            COUNTS["requests"] += 1
            COUNTS["spans"] += spans
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: Any) -> None:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    server.serve_forever()
    print(json.dumps(COUNTS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
