"""Tracing configured the standard way, from the OpenTelemetry environment (`configure`, called by the composition
root): which exporter, over which protocol, and how the encoded spans reach its transport.

Tracing is on when `OTEL_TRACES_EXPORTER` names `otlp` (or `console`), and off otherwise (unset or `none`, or
`OTEL_SDK_DISABLED=true`): then nothing of OpenTelemetry is imported. The exporter's protocol is
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default, or `grpc`); the
endpoint, headers, compression and timeouts come from the exporter's own `OTEL_EXPORTER_OTLP_*` variables, the
service name from `OTEL_SERVICE_NAME` (default: the server's name), the sampler from `OTEL_TRACES_SAMPLER` and
`OTEL_TRACES_SAMPLER_ARG`. The encoded spans go to the standard OTLP exporter's transport (retries, headers,
compression, TLS are the exporter's; over HTTP, a plain `http.client` connection where no proxy or .netrc setting
applies, `_http_exporter`); exporters other than OTLP get the SDK's `ReadableSpan`s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from .otlp import exported
from .tracing import SCOPE, Tracing

__all__ = ["configure"]

log = logging.getLogger(__name__)


def _otlp_post(exporter: Any, protocol: str) -> Callable[[bytes, int], bool] | None:
    """How an encoded export request reaches the OTLP exporter's own transport (with the exporter's retries,
    headers, compression, TLS), saying whether the collector took it; None where this exporter's version offers no
    way in: its spans then go through its `export`, encoded by the SDK."""
    if protocol == "http/protobuf":
        client = getattr(exporter, "_client", None)  # the exporter's HTTP client
        if client is None or not callable(getattr(client, "export", None)):
            return None

        def post_http(payload: bytes, count: int) -> bool:
            return bool(getattr(client.export(payload), "success", True))

        return post_http
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def post_grpc(payload: bytes, count: int) -> bool:
        return exported(exporter.export(_Encoded(ExportTraceServiceRequest.FromString(payload), count)))

    return post_grpc


def _shared(exporter: Any) -> Any:
    """The exporter as the SDK's processor of the spans models make sees it: that processor exports through it,
    but its stop leaves the exporter running, for `Tracing.shutdown` stops the exporter (once, in time)."""
    from opentelemetry.sdk.trace.export import SpanExporter

    class Shared(SpanExporter):
        def export(self, spans: Any) -> Any:
            return exporter.export(spans)

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

        def shutdown(self) -> None:
            pass

    return Shared()


class _Encoded:
    """A batch already made into its export request, for the gRPC exporter below."""

    __slots__ = ("count", "request")

    def __init__(self, request: Any, count: int) -> None:
        self.request = request
        self.count = count

    def __len__(self) -> int:
        return self.count


def _grpc_exporter() -> Any:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    class GrpcExporter(OTLPSpanExporter):
        """The OTLP gRPC exporter (channel, retries, headers, compression), taking requests already made."""

        def _translate_data(self, data: Any) -> Any:
            return data.request if isinstance(data, _Encoded) else super()._translate_data(data)

    return GrpcExporter()


def _http_exporter() -> Any:
    """The OTLP/HTTP exporter. Its default transport (`requests`) reads the environment's proxy and .netrc settings
    again at each export, and costs about six times a plain `http.client` connection per export (`otlp_http`).
    Where none of those settings can apply (a plain-HTTP endpoint that no proxy variable and no .netrc entry covers,
    no credential provider's session), the exporter sends over such a connection; otherwise, or where this
    exporter's version takes no transport, it keeps its default."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter()
    if not _settings_cannot_apply(str(getattr(exporter, "_endpoint", ""))):
        return exporter
    try:
        from .otlp_http import PlainHTTPTransport

        lean = OTLPSpanExporter(_transport=PlainHTTPTransport())  # type: ignore[call-arg,unused-ignore]
    except (ImportError, TypeError):  # an exporter without pluggable transports
        return exporter
    exporter.shutdown()  # type: ignore[no-untyped-call,unused-ignore]
    return lean


def _settings_cannot_apply(endpoint: str) -> bool:
    """Whether requests would send to `endpoint` as is: plain HTTP, no proxy for it (requests' own reading of
    the proxy variables and no_proxy), no .netrc credentials for its host, no credential provider's session.
    False where requests is not there (an exporter version that sends otherwise): its own transport is kept."""
    try:
        import requests.utils
    except ImportError:
        return False
    if not endpoint.startswith("http://"):
        return False  # HTTPS: requests' CA bundle (REQUESTS_CA_BUNDLE, certifi) is its own
    if any(os.environ.get(f"OTEL_PYTHON_EXPORTER_OTLP_HTTP{kind}_CREDENTIAL_PROVIDER") for kind in ("", "_TRACES")):
        return False
    return not requests.utils.get_environ_proxies(endpoint) and requests.utils.get_netrc_auth(endpoint) is None


def configure(service_name: str) -> Tracing | None:
    """The tracing observer the environment asks for, or None when tracing is off."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name or exporter_name == "none":
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":  # the standard switch, as the SDK reads it
        log.info("tracing off: OTEL_SDK_DISABLED=true")
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    exporter: Any
    protocol = ""
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip().lower()
        if protocol == "grpc":
            exporter = _grpc_exporter()
        elif protocol == "http/protobuf":
            exporter = _http_exporter()
        else:
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc")
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: use otlp, console or none")
    attributes: Mapping[str, str] = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(dict(attributes)))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(_shared(exporter)))  # the spans models make themselves
    trace.set_tracer_provider(provider)
    scope = InstrumentationScope(SCOPE)  # what provider.get_tracer(SCOPE) would have
    tracing = Tracing(provider, exporter, scope, _otlp_post(exporter, protocol) if protocol else None)
    client = getattr(getattr(exporter, "_client", None), "_transport", None)
    sending = f", {type(client).__name__}" if protocol == "http/protobuf" and client is not None else ""
    log.info("tracing on: %s exporter%s", exporter_name, f" ({protocol}{sending})" if protocol else "")
    return tracing
