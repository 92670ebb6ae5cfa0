"""The caller's trace context on outgoing calls, when OpenTelemetry is installed.

With `opentelemetry-api` importable, every request of the clients carries the current context as W3C
`traceparent` / `tracestate` (REST headers, gRPC metadata) through OpenTelemetry's configured propagator, so the
server's spans join the caller's trace. Without it, or outside any span, nothing is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_propagate: Any
try:
    from opentelemetry import propagate as _propagate
except ImportError:  # OpenTelemetry is optional for the clients
    _propagate = None

__all__ = ["with_trace_context"]


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """`headers` with the current trace context added (headers given explicitly win)."""
    if _propagate is None:
        return headers
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    if not carrier:
        return headers
    return {**carrier, **headers} if headers else carrier
