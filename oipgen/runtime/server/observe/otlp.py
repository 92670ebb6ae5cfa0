"""The OTLP protobuf encoding of the server's spans, written here: byte for byte what the SDK's OTLP encoder writes
for the same spans (a test compares the two, `readable_spans`), at a fraction of its cost (building the
opentelemetry-proto messages alone costs ~35 us per request). A finished request (`Finished`, queued by `tracing`)
becomes its spans (`spans_of`) or their encoding (`encode_finished`), written from parts that repeat; `wrap` makes
the export request of a batch."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple, TypeVar

from ...grpc.wire import varint

__all__ = ["Envelope", "Finished", "OtlpSpan", "encode", "encode_finished", "envelope_of", "exported", "new_finished",
           "readable_spans", "spans_of", "wrap"]


def exported(result: Any) -> bool:
    """Whether an SDK exporter's `export` result (`SpanExportResult`) says the collector took the spans."""
    return getattr(result, "name", "SUCCESS") == "SUCCESS"


class Finished(NamedTuple):
    """A finished, sampled request as the request path queues it: no span is made there."""

    traced: Any  # its span's ids: trace_id, span_id, parent_id (0: none), remote, trace_state (`tracing`)
    model: str
    version: str
    request_id: str
    transport: str
    status: str  # "OK" or the error's kind
    message: str  # the error's message (clipped), "" for a success
    start_ns: int
    end_ns: int
    phases: Sequence[tuple[str, int, int]]  # (phase, start, end) on the timer's clock (`InferenceRecord.marks`)
    offset: int  # that clock + offset = nanoseconds since the epoch


# Makes a Finished from a tuple of its fields: what its constructor does, without its Python-level call.
new_finished: Final[Callable[[type[Finished], tuple[Any, ...]], Finished]] = tuple.__new__

class OtlpSpan(NamedTuple):
    """One span, ready to encode: what OTLP carries of a span of ours."""

    trace_id: int
    span_id: int
    parent_id: int  # 0: none
    remote: bool  # the parent is the caller's
    trace_state: str  # W3C tracestate text ("" for none)
    name: str
    server: bool  # kind server (the request), internal otherwise (a phase)
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, str], ...]
    status: int  # OpenTelemetry's status code: 0 unset, 1 ok, 2 error
    message: str  # the status' description


# --- the OTLP protobuf encoding of our spans ----------------------------------------------------------------------
# Field numbers of opentelemetry/proto/trace/v1/trace.proto (Span, Status), common.proto (KeyValue, AnyValue) and
# trace_service.proto (ExportTraceServiceRequest); fields are written in field-number order, as protobuf does.

_TIMES: Final = struct.Struct("<BQBQ")  # Span.start_time_unix_nano (7) and end_time_unix_nano (8), fixed64
_FLAGS_LOCAL: Final = b"\x85\x01" + struct.pack("<I", 0x100)  # Span.flags (16, fixed32): HAS_IS_REMOTE
_FLAGS_REMOTE: Final = b"\x85\x01" + struct.pack("<I", 0x300)  # HAS_IS_REMOTE | IS_REMOTE
_KIND_SERVER: Final = b"\x30\x02"
_KIND_INTERNAL: Final = b"\x30\x01"
_STATUS_UNSET: Final = b"\x7a\x00"  # Span.status (15), an empty Status
_STATUS_OK: Final = b"\x7a\x02\x18\x01"  # Status.code (3) = OK


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field."""
    return tag + varint(len(data)) + data


_Made = TypeVar("_Made")


class _Cache(dict[Any, _Made]):
    """Encoded fields that repeat (span names, attributes but the request id, trace states), bounded."""

    def __init__(self, make: Callable[[Any], _Made]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: Any) -> _Made:
        if len(self) >= 4096:
            self.clear()
        value = self[key] = self.make(key)
        return value


def _attribute(item: tuple[str, str]) -> bytes:
    """Span.attributes (9): KeyValue{key (1), value (2): AnyValue{string_value (1)}}."""
    key, value = item
    return _field(b"\x4a", _field(b"\x0a", key.encode()) + _field(b"\x12", _field(b"\x0a", value.encode())))


_ATTRIBUTES: Final = _Cache(_attribute)
# The request id attribute before its value, by the value's size (in bytes)
_REQUEST_ID_HEADS: Final = _Cache(lambda size: _attribute(("request_id", "\0" * size))[:-size or None])


def _request_id(value: str) -> bytes:
    """The request id attribute (`_attribute(("request_id", value))`)."""
    data = value.encode()
    return _REQUEST_ID_HEADS[len(data)] + data


_NAMES: Final = _Cache(lambda name: _field(b"\x2a", name.encode()))  # Span.name (5)
_STATES: Final = _Cache(lambda state: _field(b"\x1a", state.encode()) if state else b"")  # Span.trace_state (3)
_PHASES: Final = _Cache(lambda name: _field(b"\x2a", name.encode()) + _KIND_INTERNAL)  # a phase's name and kind
_PHASE_TAIL: Final = _STATUS_UNSET + _FLAGS_LOCAL


def _request_tail(key: tuple[str, str, str, bool]) -> bytes:
    """A request span's fields after its request id: its transport and status attributes, status, flags."""
    transport, status, message, remote = key
    out = _ATTRIBUTES["transport", transport] if transport else b""
    out += _ATTRIBUTES["status", status]
    if status == "OK" and not message:
        out += _STATUS_OK
    else:
        code = 1 if status == "OK" else 2
        out += _field(b"\x7a", (_field(b"\x12", message.encode()) if message else b"") + b"\x18" + varint(code))
    return out + (_FLAGS_REMOTE if remote else _FLAGS_LOCAL)


def _phase_form(key: tuple[str, int]) -> tuple[Callable[..., bytes], bytes, bytes]:
    """How a phase's span is written, given its name and the size of its parent fields (trace state, parent id):
    one struct packing the Span field's tag and length, the trace id field, the span id, the parent fields, the
    name and kind, the times and the tail (status, flags); the first and the name and kind, encoded."""
    phase, parent_size = key
    name = _PHASES[phase]
    body = f"20s8s{parent_size}s{len(name)}sBQBQ{len(_PHASE_TAIL)}s"
    head = b"\x12" + varint(struct.calcsize("<" + body))
    return struct.Struct(f"<{len(head)}s{body}").pack, head, name


_PHASE_FORMS: Final = _Cache(_phase_form)
_REQUEST_NAMES: Final = _Cache(lambda model: _field(b"\x2a", f"ModelInfer {model}".encode()) + _KIND_SERVER)
_MODEL_ATTRIBUTES: Final = _Cache(lambda key: _ATTRIBUTES["model_name", key[0]] + _ATTRIBUTES["model_version", key[1]])
_REQUEST_TAILS: Final = _Cache(_request_tail)


def _span(span: OtlpSpan) -> bytes:
    """ScopeSpans.spans (2): one Span."""
    body = b"\x0a\x10" + span.trace_id.to_bytes(16, "big") + b"\x12\x08" + span.span_id.to_bytes(8, "big")
    if span.trace_state:
        body += _STATES[span.trace_state]
    if span.parent_id:
        body += b"\x22\x08" + span.parent_id.to_bytes(8, "big")
    body += _NAMES[span.name] + (_KIND_SERVER if span.server else _KIND_INTERNAL)
    body += _TIMES.pack(0x39, span.start_ns, 0x41, span.end_ns)
    for item in span.attributes:
        body += _attribute(item) if item[0] == "request_id" else _ATTRIBUTES[item]
    if span.status == 1 and not span.message:
        body += _STATUS_OK
    elif span.status == 0 and not span.message:
        body += _STATUS_UNSET
    else:
        status = (_field(b"\x12", span.message.encode()) if span.message else b"") + b"\x18" + varint(span.status)
        body += _field(b"\x7a", status)
    body += _FLAGS_REMOTE if span.remote else _FLAGS_LOCAL
    return b"\x12" + varint(len(body)) + body


class Envelope(NamedTuple):
    """What wraps the spans of an export request: the resource and the instrumentation scope, encoded."""

    resource: bytes  # a Resource message
    scope: bytes  # an InstrumentationScope message
    resource_schema: str
    scope_schema: str


def encode(spans: Sequence[OtlpSpan], envelope: Envelope) -> bytes:
    """An ExportTraceServiceRequest of `spans`, all of one resource and scope, encoded: byte for byte what the
    SDK's OTLP encoder (`opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`) writes for the same
    spans as `readable_spans` makes them."""
    return wrap(b"".join(map(_span, spans)), envelope)


def wrap(spans: bytes, envelope: Envelope) -> bytes:
    """An ExportTraceServiceRequest of spans already encoded (ScopeSpans.spans fields), encoded."""
    scope_spans = _field(b"\x0a", envelope.scope) + spans
    if envelope.scope_schema:
        scope_spans += _field(b"\x1a", envelope.scope_schema.encode())
    resource_spans = _field(b"\x0a", envelope.resource) + _field(b"\x12", scope_spans)
    if envelope.resource_schema:
        resource_spans += _field(b"\x1a", envelope.resource_schema.encode())
    return _field(b"\x0a", resource_spans)


def readable_spans(spans: Sequence[OtlpSpan], resource: Any, scope: Any) -> list[Any]:
    """`spans` as the SDK's ReadableSpans (for exporters other than OTLP, and to check `encode`)."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

    out = []
    for span in spans:
        state = TraceState.from_header([span.trace_state]) if span.trace_state else TraceState()
        context = SpanContext(span.trace_id, span.span_id, False, TraceFlags(TraceFlags.SAMPLED), state)
        parent = SpanContext(span.trace_id, span.parent_id, span.remote) if span.parent_id else None
        out.append(ReadableSpan(
            name=span.name, context=context, parent=parent, resource=resource, attributes=dict(span.attributes),
            kind=SpanKind.SERVER if span.server else SpanKind.INTERNAL, instrumentation_scope=scope,
            status=Status(StatusCode(span.status), span.message or None), start_time=span.start_ns,
            end_time=span.end_ns,
        ))
    return out


def envelope_of(resource: Any, scope: Any) -> Envelope:
    """The encoded resource and scope, as the SDK's OTLP encoder writes them (it encodes one probe span here)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    probe = OtlpSpan(1, 1, 0, False, "", "probe", False, 0, 0, (), 0, "")
    resource_spans = encode_spans(readable_spans([probe], resource, scope)).resource_spans[0]
    scope_spans = resource_spans.scope_spans[0]
    return Envelope(resource_spans.resource.SerializeToString(), scope_spans.scope.SerializeToString(),
                    resource_spans.schema_url, scope_spans.schema_url)


def spans_of(finished: Finished, ids: Iterator[int]) -> list[OtlpSpan]:
    """A finished request's spans: the request's, then one per phase (their ids from `ids`)."""
    traced = finished.traced
    state = traced.trace_state
    state_text = ",".join(f"{key}={value}" for key, value in state.items()) if state else ""
    attributes = [("model_name", finished.model), ("model_version", finished.version),
                  ("request_id", finished.request_id)]
    if finished.transport:
        attributes.append(("transport", finished.transport))
    attributes.append(("status", finished.status))
    spans = [OtlpSpan(
        traced.trace_id, traced.span_id, traced.parent_id, traced.remote, state_text,
        f"ModelInfer {finished.model}", True, finished.start_ns, finished.end_ns, tuple(attributes),
        1 if finished.status == "OK" else 2, finished.message,
    )]
    offset = finished.offset
    for phase, start, end in finished.phases:
        spans.append(OtlpSpan(traced.trace_id, next(ids), traced.span_id, False, state_text, phase, False,
                              start + offset, end + offset, (), 0, ""))
    return spans

def encode_finished(finished: Finished, ids: Iterator[int]) -> bytes:
    """`encode` of `spans_of(finished, ids)` without the whole's ScopeSpans envelope, written from parts that
    repeat: the request's span from its model's, its outcome's and its ids' parts, the phases, which differ
    only in ids, name and times, from their common parts (a third of the cost of `_span` each)."""
    traced = finished.traced
    state = traced.trace_state
    state_field = _STATES[",".join(f"{key}={value}" for key, value in state.items()) if state else ""]
    common = b"\x0a\x10" + traced.trace_id.to_bytes(16, "big") + b"\x12\x08"
    span_id = traced.span_id.to_bytes(8, "big")
    body = common + span_id + state_field
    if traced.parent_id:
        body += b"\x22\x08" + traced.parent_id.to_bytes(8, "big")
    pack = _TIMES.pack
    body += (_REQUEST_NAMES[finished.model] + pack(0x39, finished.start_ns, 0x41, finished.end_ns)
             + _MODEL_ATTRIBUTES[finished.model, finished.version]
             + _request_id(finished.request_id)
             + _REQUEST_TAILS[finished.transport, finished.status, finished.message, traced.remote])
    out = [b"\x12", varint(len(body)), body]
    # A phase: its length and trace id field, its span id, its parent, then its name, times and tail.
    parent = state_field + b"\x22\x08" + span_id
    offset, forms, size = finished.offset, _PHASE_FORMS, len(parent)
    for phase, start, end in finished.phases:
        pack_phase, head, name = forms[phase, size]
        out.append(pack_phase(head, common, next(ids).to_bytes(8, "big"), parent, name, 0x39,
                              start + offset, 0x41, end + offset, _PHASE_TAIL))
    return b"".join(out)
