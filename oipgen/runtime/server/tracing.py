"""OpenTelemetry traces of inference requests, configured the standard way: from the OpenTelemetry environment.

Tracing is on when `OTEL_TRACES_EXPORTER` names `otlp` (or `console`), and off otherwise (unset or `none`): then
nothing of OpenTelemetry is imported and a request costs nothing more than reading two headers. The exporter's
protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default,
or `grpc`); the endpoint, headers and timeouts come from the exporter's own `OTEL_EXPORTER_OTLP_*` variables, the
service name from `OTEL_SERVICE_NAME` (default: the server's name), the sampler from `OTEL_TRACES_SAMPLER` and
`OTEL_TRACES_SAMPLER_ARG`. Spans are exported in batches (`OTEL_BSP_*`).

The caller's W3C trace context (`traceparent`, `tracestate`: REST headers or gRPC metadata) travels with the
request (`InferRequest.trace`), so the server's spans join the caller's trace. Each inference request is a span
(`ModelInfer <model>`) with a child per phase the timer measured (queue, compute_input, compute_infer,
compute_output; for a decoupled model one compute_infer / compute_output pair per response), and the attributes
`model_name`, `model_version`, `request_id`, `transport` and `status`. The request span starts when the request
reaches its model, so log lines written meanwhile carry its trace and span ids (`current_ids`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Final

from .timing import InferenceRecord, Observer, Timer, current

__all__ = ["TRACE_HEADERS", "Tracing", "carrier", "configure", "current_ids"]

log = logging.getLogger(__name__)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
_SPAN: Final = "otel_span"  # Timer.state keys: the request's span while it runs, and its ids (kept for logs)
_IDS: Final = "otel_ids"


def carrier(get: Any) -> dict[str, str] | None:
    """The W3C trace context among a request's headers or metadata (`get(name)` gives a value or None)."""
    parent = get("traceparent")
    if not parent:
        return None
    state = get("tracestate")
    return {"traceparent": str(parent), "tracestate": str(state)} if state else {"traceparent": str(parent)}


def current_ids() -> tuple[str, str] | None:
    """The trace and span ids (hex) of the inference request running here, when it is traced."""
    timer = current()
    ids: tuple[str, str] | None = timer.state.get(_IDS) if timer is not None else None
    return ids


def enabled() -> bool:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return bool(exporter) and exporter != "none"


class Tracing(Observer):
    """The inference timer's observer that makes the spans."""

    def __init__(self, tracer: Any, provider: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.provider = provider
        self.propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.SERVER
        self._status = (Status, StatusCode)

    def request_started(self, timer: Timer, model: str, version: str) -> None:
        parent = self.propagator.extract(timer.trace) if timer.trace else None
        span = self.tracer.start_span(
            f"ModelInfer {model}", context=parent, kind=self._kind, start_time=timer.start_unix,
            attributes={"model_name": model, "model_version": version, "request_id": timer.request_id},
        )
        timer.state[_SPAN] = span
        context = span.get_span_context()
        timer.state[_IDS] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")

    def request_finished(self, record: InferenceRecord) -> None:
        span = record.state.pop(_SPAN, None)
        if span is None:
            return
        from opentelemetry import trace

        status, code = self._status
        transport = record.state.get("transport")
        if transport:
            span.set_attribute("transport", transport)
        if record.error is None:
            span.set_attribute("status", "OK")
            span.set_status(status(code.OK))
        else:
            span.set_attribute("status", record.error.kind.name)
            span.set_status(status(code.ERROR, record.error.message[:200]))
        context = trace.set_span_in_context(span)
        for phase in record.spans:
            self.tracer.start_span(phase.phase, context=context, start_time=phase.start_ns).end(end_time=phase.end_ns)
        span.end(end_time=record.start_ns + record.total_ns)

    def shutdown(self) -> None:
        """Export what is buffered (at the server's stop)."""
        try:
            self.provider.shutdown()
        except Exception:
            log.exception("the trace exporter failed to flush")


def configure(service_name: str) -> Tracing | None:
    """The tracing observer the environment asks for, or None when tracing is off."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name or exporter_name == "none":
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip().lower()
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            exporter = GrpcExporter()
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            exporter = HttpExporter()
        else:
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc")
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: use otlp, console or none")
    attributes: Mapping[str, str] = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(dict(attributes)))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: %s exporter", exporter_name)
    return Tracing(provider.get_tracer("oip.server"), provider)
