"""OpenTelemetry traces of inference requests, configured the standard way: from the OpenTelemetry environment.

Tracing is on when `OTEL_TRACES_EXPORTER` names `otlp` (or `console`), and off otherwise (unset or `none`): then
nothing of OpenTelemetry is imported and a request costs nothing more than reading two headers. The exporter's
protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default,
or `grpc`); the endpoint, headers, compression and timeouts come from the exporter's own `OTEL_EXPORTER_OTLP_*`
variables, the service name from `OTEL_SERVICE_NAME` (default: the server's name), the sampler from
`OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (the SDK's samplers: `always_on`, `traceidratio`,
`parentbased_*`...). Spans are exported in batches (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`,
`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).

The caller's W3C trace context (`traceparent`, `tracestate`: REST headers or gRPC metadata) travels with the
request (`InferRequest.trace`), so the server's spans join the caller's trace. Each inference request is a span
(`ModelInfer <model>`, kind server) with a child per phase the timer measured (queue, compute_input,
compute_infer, compute_output; for a decoupled model one compute_infer / compute_output pair per response), and
the attributes `model_name`, `model_version`, `request_id`, `transport` and `status`. The request's span context
is OpenTelemetry's current one while the request runs, so spans a model makes with the OpenTelemetry API (the
SDK's tracer provider is the global one) are children of the request's span; log lines written meanwhile carry its
trace and span ids (`current_ids`).

How the spans are made, and why not with the SDK's `Span` objects: an SDK span per phase and the SDK's OTLP encoder
cost about three times the server's own work per request (measured: ~170 us for the five spans, ~140 us to encode
them, against ~200 us of server CPU for a whole REST inference). So the request path only does what must happen
then: the caller's context is extracted (the SDK's W3C propagator; a plain traceparent is read here, exactly as the
propagator reads it, `plain_caller`), the SDK's configured sampler decides once per request (a sampler that only
follows the parent's flags, as `always_on` and `parentbased_always_on` do, is not asked: its decision for each kind
of parent is read once, `fixed_decisions`), the SDK's id generator gives the span id, and the request's span context
is the API's current one (OpenTelemetry's runtime context sees the running request and makes its context only when
asked for, `_request_runtime`). When the request finishes, its outcome and the timer's phase timestamps are
queued as plain values. A background thread gives the children their ids, writes the spans' OTLP protobuf encoding
(`encode`) and hands the batch to the standard OTLP exporter's transport (retries, headers, compression, TLS are the
exporter's; over HTTP, a plain `http.client` connection where no proxy or .netrc setting applies, `_http_exporter`).
The encoding is written here because building the opentelemetry-proto messages still costs ~35 us per request; it is
byte for byte what the SDK's encoder writes for the same spans (a test compares the two, `readable_spans`).
Exporters other than OTLP get the spans as the SDK's `ReadableSpan`s.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import logging
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar

from ...grpc.wire import varint
from .events import (
    COMPUTE_INFER,
    COMPUTE_INPUT,
    COMPUTE_OUTPUT,
    QUEUE,
    InferenceRecord,
    Observer,
    Timer,
    current,
    set_current,
)

__all__ = [
    "TRACE_HEADERS", "OtlpSpan", "Tracing", "carrier", "configure", "current_ids", "encode", "fixed_decisions", "wrap",
]

log = logging.getLogger(__name__)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
_PLAIN_TRACEPARENT: Final = re.compile("00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_STATE: Final = "otel"  # Timer.state key: the request's `_Traced`, kept after it finished (log lines use its ids)
_SCOPE: Final = "oip.server"  # the instrumentation scope of the server's spans
_SPANS: Final = 5  # the spans of a request that is not decoupled: its own and one per phase


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
    traced: _Traced | None = timer.state.get(_STATE) if timer is not None else None
    return None if traced is None else (f"{traced.trace_id:032x}", f"{traced.span_id:016x}")


def enabled() -> bool:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return bool(exporter) and exporter != "none"


class _Traced:
    """One request's span while it runs: its ids, its parent, the sampler's decision, the context it started in."""

    __slots__ = ("context", "flags", "parent_id", "previous", "raw", "remote", "running", "sampled", "span_id",
                 "trace_id", "trace_state")

    def __init__(self, trace_id: int, span_id: int, parent_id: int, remote: bool, sampled: bool, trace_state: Any,
                 flags: Any, previous: Any, raw: Any) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id  # 0: a root span
        self.remote = remote  # the parent came from the caller
        self.sampled = sampled
        self.trace_state = trace_state  # the sampler's TraceState (or None)
        self.flags = flags  # the API's TraceFlags of the request's span
        self.previous = previous  # OpenTelemetry's current context when the request started
        self.raw = raw  # the runtime context's own value then (`_request_runtime`; None where requests attach)
        self.context: Any = None  # `previous` with the request's span, once made (`_request_runtime`)
        self.running = True


class _Finished(NamedTuple):
    """A finished, sampled request as the request path queues it: no span is made there."""

    traced: _Traced
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


# Makes a _Finished from a tuple of its fields: what its constructor does, without its Python-level call.
_new_finished: Final[Callable[[type[_Finished], tuple[Any, ...]], _Finished]] = tuple.__new__


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


# --- the observer -------------------------------------------------------------------------------------------------


class Tracing(Observer):
    """The inference timer's observer that traces requests: the request path samples and queues, a background
    thread makes, encodes and exports the spans (see the module's description)."""

    def __init__(self, provider: Any, exporter: Any, scope: Any,
                 post: Callable[[bytes, int], None] | None = None) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.exporter = exporter
        self.scope = scope
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.propagator = TraceContextTextMapPropagator()
        random_flag = getattr(trace.TraceFlags, "RANDOM_TRACE_ID", 0)
        self._random_flag = random_flag if random_flag and provider.id_generator.is_trace_id_random() else 0
        flags = {bits: trace.TraceFlags(bits) for bits in {0, 1, self._random_flag, 1 | self._random_flag}}
        make_context = _own_span_context(trace)
        self._api = (trace, trace.SpanKind.SERVER, make_context, flags, trace.NonRecordingSpan)
        # Where OpenTelemetry's runtime context sees the request running here, a request's context is made only
        # when asked for; otherwise each request attaches its context when it starts, and the previous one after.
        self.runtime = _request_runtime(context, trace, make_context)
        self._context_now: Callable[[], Any] = context.get_current if self.runtime is None else self.runtime.get_current
        self._raw_now: Callable[[], Any] | None = None if self.runtime is None else self.runtime.variable.get
        self._attach: Callable[[Any], Any] | None = context.attach if self.runtime is None else None
        self._span_context = trace.SpanContext
        self._last_seen: tuple[Any, Any] = (None, None)  # a context and the span context current in it
        self._trace_flags = trace.TraceFlags
        self.fixed = fixed_decisions(self.sampler)
        self._random_ids = type(self.ids) is RandomIdGenerator
        # The default id generator's draw, made here as it makes it (a zero is drawn again by the generator)
        self._draw: Callable[[int], int] | None = random.getrandbits if self._random_ids else None
        # The OTLP exporter's transport, taking an encoded export request and its span count; None: the exporter
        # takes ReadableSpans.
        self.post = post
        self.envelope = envelope_of(provider.resource, scope) if post is not None else None
        self.delay = _env_number("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        # The SDK's batch settings count spans; the queue holds requests, of _SPANS spans each (a plain request).
        self.max_queue = max(1, int(_env_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)) // _SPANS)
        self.batch_size = max(1, min(int(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)) // _SPANS,
                                     self.max_queue))
        self.queue: collections.deque[_Finished] = collections.deque()
        self.dropped = 0
        self._wake = threading.Event()
        self._stopping = False
        self._given_up = False  # the stop's deadline passed: nothing more is exported
        self._exporter_lock = threading.Lock()
        self._exporter_stopped = False
        self._thread = threading.Thread(target=self._run, name="oip-trace-export", daemon=True)
        self._thread.start()

    # --- the request path: sample once, make the context current, queue plain values -----------------------------

    def request_started(self, timer: Timer, model: str, version: str) -> None:
        trace, server, make_context, flags, non_recording = self._api
        raw = self._raw_now() if self._raw_now is not None else None
        previous = self._context_now()  # what the sampler sees without a caller's context
        caller = timer.trace
        parent = parent_context = None
        if caller:
            parent_context = self.plain_caller(caller) if self.fixed is not None else None
            if parent_context is None:  # anything but a plain traceparent, or a sampler that takes a context
                parent = self.propagator.extract(caller)
                parent_context = trace.get_current_span(parent).get_span_context()
        if parent_context is not None and parent_context.is_valid:
            trace_id, parent_id, remote = parent_context.trace_id, parent_context.span_id, parent_context.is_remote
            random_flag = parent_context.trace_flags & self._random_flag if self._random_flag else 0
        else:
            draw = self._draw
            trace_id = (draw(128) if draw is not None else 0) or self.ids.generate_trace_id()
            parent_id, remote, random_flag = 0, False, self._random_flag
        fixed = self.fixed
        if fixed is None:
            result = self.sampler.should_sample(
                parent if parent is not None else previous, trace_id, f"ModelInfer {model}", server,
                {"model_name": model, "model_version": version, "request_id": timer.request_id})
            sampled, trace_state = result.decision.is_sampled(), result.trace_state
        else:  # the sampler's answer without asking it: its decision for this kind of parent, the parent's state
            if caller:
                seen = parent_context
            else:  # the span current before the request's: contexts do not change, the last one's is kept
                last, seen = self._last_seen
                if last is not previous:
                    seen = trace.get_current_span(previous).get_span_context()
                    self._last_seen = (previous, seen)
            if seen is not None and seen.is_valid:
                sampled = fixed[(1 if seen.is_remote else 3) + (0 if seen.trace_flags.sampled else 1)]
                trace_state = seen.trace_state
            else:
                sampled, trace_state = fixed[0], None
        draw = self._draw
        span_id = (draw(64) if draw is not None else 0) or self.ids.generate_span_id()
        trace_flags = flags[(1 if sampled else 0) | random_flag]
        timer.state[_STATE] = _Traced(trace_id, span_id, parent_id, remote, sampled, trace_state, trace_flags,
                                      previous, raw)
        # The request's span context is the current one while it runs: a model's own spans are its children.
        attach = self._attach
        if attach is not None:
            own = make_context(trace_id, span_id, trace_flags, trace_state)
            attach(trace.set_span_in_context(non_recording(own), previous))

    def plain_caller(self, caller: Mapping[str, str]) -> Any:
        """The caller's span context when `caller` is a plain W3C traceparent (version 00, lowercase, nothing
        around it, ids not zero) and no tracestate: exactly what the SDK's propagator reads from it, without the
        context it makes around it. None for anything else (the propagator reads it)."""
        header = caller.get("traceparent")
        if len(caller) != 1 or header is None or len(header) != 55:
            return None
        match = _PLAIN_TRACEPARENT.fullmatch(header)
        if match is None:
            return None
        trace_id, span_id, flags = int(match[1], 16), int(match[2], 16), int(match[3], 16)
        if not trace_id or not span_id:
            return None
        return self._span_context(trace_id, span_id, True, self._trace_flags(flags), None)

    def request_finished(self, record: InferenceRecord) -> None:
        error = record.error
        status, message = ("OK", "") if error is None else (error.kind.name, error.message[:200])
        marks, offset = record.marks  # made into spans by the background thread
        self.finished(record.state, record.model, record.version, record.request_id, status, message,
                      record.start_ns, record.start_ns + record.total_ns, marks, offset)

    def finished(self, state: Mapping[str, Any], model: str, version: str, request_id: str, status: str,
                 message: str, start_ns: int, end_ns: int, phases: Sequence[tuple[str, int, int]],
                 offset: int) -> None:
        """A request is done (`request_finished`, told without a record): `state` is its timer's, `status` "OK"
        or its error's kind, `message` the error's (clipped), `phases` as `InferenceRecord.marks` has them."""
        traced: _Traced | None = state.get(_STATE)
        if traced is None:
            return
        traced.running = False
        if self._attach is not None:
            # Back to the context before the request's (attached, not detached: the request may finish in a copy
            # of the context it started in, where a token would not apply).
            self._attach(traced.previous)
        if not traced.sampled:
            return
        if len(self.queue) >= self.max_queue:
            self.dropped += 1
            return
        self.queue.append(_new_finished(_Finished, (
            traced, model, version, request_id, state.get("transport", ""), status, message, start_ns, end_ns,
            phases, offset,
        )))
        if len(self.queue) >= self.batch_size and not self._wake.is_set():
            self._wake.set()

    request_ran_alone = request_finished  # a model run is nothing to trace

    def ran_alone(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                  started: int, ended: int, done: int) -> None:
        # The lean gRPC way's success: its moments are the phases' marks (a timer when tracing is on: it listens
        # to `request_started`).
        if timer is not None:
            offset = timer.start_unix - timer.start
            marks = ((COMPUTE_INPUT, start, queued), (QUEUE, queued, started), (COMPUTE_INFER, started, ended),
                     (COMPUTE_OUTPUT, ended, done))
            self.finished(timer.state, model, version, request_id, "OK", "", start + offset, done + offset, marks,
                          offset)

    # --- the background thread --------------------------------------------------------------------------------------

    def spans_of(self, finished: _Finished, ids: Iterator[int]) -> list[OtlpSpan]:
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

    def encoded(self, finished: _Finished, ids: Iterator[int]) -> bytes:
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

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self.delay)
            self._wake.clear()
            stopping = self._stopping
            # Woken by a full batch: export full batches; at the schedule's delay or the stop: everything.
            self.flush(self.batch_size if woken and not stopping else 1)
            if stopping:
                return

    def span_ids(self, count: int) -> Iterator[int]:
        """`count` span ids from the configured id generator. The SDK's default one draws each id as 64 random
        bits of the `random` module, not zero: they are drawn here at once, alike."""
        if self._random_ids and count:
            drawn = struct.unpack(f">{count}Q", random.randbytes(8 * count))
            if 0 not in drawn:
                return iter(drawn)
        return iter(self.ids.generate_span_id, None)

    def flush(self, at_least: int = 1) -> None:
        """Export what is queued, while `at_least` requests are, in batches of `batch_size` requests at most."""
        queue = self.queue
        while len(queue) >= at_least and not self._given_up:
            batch = [queue.popleft() for _ in range(min(len(queue), self.batch_size))]
            ids = self.span_ids(sum(len(finished.phases) for finished in batch))  # the phases' span ids
            try:
                if self.post is not None and self.envelope is not None:
                    spans = b"".join([self.encoded(finished, ids) for finished in batch])
                    self.post(wrap(spans, self.envelope), sum(1 + len(finished.phases) for finished in batch))
                else:
                    readable = [span for finished in batch for span in self.spans_of(finished, ids)]
                    self.exporter.export(readable_spans(readable, self.provider.resource, self.scope))
            except Exception:
                log.exception("the trace exporter failed")
        if self.dropped:
            log.warning("%d traced request(s) dropped: the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE)",
                        self.dropped)
            self.dropped = 0

    def shutdown(self, deadline: float | None = None) -> None:
        """Export what is queued and stop (at the server's stop), by `deadline` (`time.monotonic()`; default: in
        30 s, as the SDK's processor allows). Past it the export is given up: the exporter stops mid-retry and what
        is still queued is dropped, told in the log, so that a collector that is down or silent cannot hold the
        server past its graceful shutdown (and a pod past its grace period)."""

        def stop() -> None:
            self._stopping = True
            self._wake.set()
            self._thread.join()
            try:
                self.provider.shutdown()  # the SDK's processor of models' own spans
            except Exception:
                log.exception("the trace exporter failed to flush")
            self._stop_exporter()

        stopping = threading.Thread(target=stop, name="oip-trace-stop", daemon=True)
        stopping.start()
        stopping.join(max(0.0, (time.monotonic() + 30 if deadline is None else deadline) - time.monotonic()))
        if not stopping.is_alive():
            return
        self._given_up = True  # `flush` takes no further batch
        log.warning("the trace export did not finish within the graceful shutdown: %d queued traced request(s) "
                    "dropped (the collector is down or slow)", len(self.queue))
        self._stop_exporter()  # ends a retry's wait; an export still sending ends at its own timeout
        stopping.join(1.0)

    def _stop_exporter(self) -> None:
        with self._exporter_lock:
            stopped, self._exporter_stopped = self._exporter_stopped, True
        if not stopped:
            try:
                self.exporter.shutdown()
            except Exception:
                log.exception("the trace exporter failed to stop")


def _own_span_context(trace: Any) -> Callable[[int, int, Any, Any], Any]:
    """What makes a request's own span context (not remote) from its ids, flags and trace state: the API's
    `SpanContext`, built as its constructor builds it (the tuple of its fields, validity computed) without the
    constructor's Python-level call, where that gives what the constructor gives; the constructor otherwise."""
    span_context, default_state = trace.SpanContext, trace.DEFAULT_TRACE_STATE
    new = tuple.__new__

    def made(trace_id: int, span_id: int, flags: Any, state: Any) -> Any:
        valid = 0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64
        return new(span_context, (trace_id, span_id, False, flags, default_state if state is None else state, valid))

    def constructed(trace_id: int, span_id: int, flags: Any, state: Any) -> Any:
        return span_context(trace_id, span_id, False, flags, state)

    flags, state = trace.TraceFlags, trace.TraceState([("vendor", "a")])
    probes = [(1, 1, flags(1), None), ((1 << 128) - 1, (1 << 64) - 1, flags(0), state), (0, 5, flags(1), None),
              (5, 1 << 64, flags(1), None), (1 << 128, 5, flags(1), state)]
    for probe in probes:
        ours, theirs = made(*probe), constructed(*probe)
        if type(ours) is not type(theirs) or ours != theirs or (ours.trace_id, ours.span_id, ours.is_remote,
                ours.trace_flags, ours.trace_state, ours.is_valid) != (theirs.trace_id, theirs.span_id,
                theirs.is_remote, theirs.trace_flags, theirs.trace_state, theirs.is_valid):
            return constructed
    return made


@functools.cache
def _request_runtime_type() -> type:
    """The runtime context that sees the traced request running here (`_request_runtime`)."""
    from opentelemetry import trace
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    set_span_in_context, non_recording = trace.set_span_in_context, trace.NonRecordingSpan

    class RequestRuntime(ContextVarsRuntimeContext):
        """The API's contextvars runtime context (its variable, its attach and detach), whose current context is
        the running request's while no other was attached since it started."""

        def __init__(self, variable: Any, make_context: Callable[[int, int, Any, Any], Any]) -> None:
            self._current_context = self.variable = variable
            self.make_context = make_context

        def get_current(self) -> Any:
            value = self.variable.get()
            timer = current()
            if timer is not None:
                traced: _Traced | None = timer.state.get(_STATE)
                if traced is not None and traced.running and value is traced.raw:
                    made = traced.context
                    if made is None:  # two threads may both make it: alike
                        own = self.make_context(traced.trace_id, traced.span_id, traced.flags, traced.trace_state)
                        made = traced.context = set_span_in_context(non_recording(own), traced.previous)
                    return made
            return value

    return RequestRuntime


def _request_runtime(context: Any, trace: Any, make_context: Callable[[int, int, Any, Any], Any]) -> Any:
    """OpenTelemetry's runtime context, made to see the traced request running here; None where it cannot be.

    A request then attaches nothing when it starts and restores nothing when it ends (an attach and its undoing, a
    context and a span object per request, which most requests never read): while the request runs (it is
    `timing.current()`) and no other context was attached since it started, the current context is the one it
    started in with the request's span, made when first asked for. A context a model attaches (its own span) is the
    current one until it is detached, as before. The runtime context replaces the API's default one (contextvars),
    and keeps its variable: what was attached before stays current. None, and nothing replaced, where the API's
    runtime context is another (OTEL_PYTHON_CONTEXT) or a check of the replacement fails; requests then attach their
    context."""
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime_type = _request_runtime_type()
    installed = getattr(context, "_RUNTIME_CONTEXT", None)
    if type(installed) is runtime_type:  # another data plane's, in this process
        return installed
    variable = getattr(installed, "_current_context", None)
    if type(installed) is not ContextVarsRuntimeContext or not isinstance(variable, contextvars.ContextVar):
        return None
    runtime = runtime_type(variable, make_context)
    context._RUNTIME_CONTEXT = runtime
    if contextvars.copy_context().run(_sees_the_request, context, trace, runtime):
        return runtime
    context._RUNTIME_CONTEXT = installed
    log.warning("OpenTelemetry's runtime context does not see the running request: each request attaches its own")
    return None


def _sees_the_request(context: Any, trace: Any, runtime: Any) -> bool:
    """Whether the API, through `runtime`, sees a request's span as current while it runs and nothing else is
    attached, what is attached meanwhile while it is, and no request after it finished."""
    timer = Timer("check")
    set_current(timer)
    flags = trace.TraceFlags(1)
    timer.state[_STATE] = traced = _Traced(5, 7, 0, False, True, None, flags, runtime.get_current(),
                                           runtime.variable.get())

    def ids() -> tuple[int, int]:
        span = trace.get_current_span().get_span_context()
        return span.trace_id, span.span_id

    seen = [ids()]
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(9, 11, False, flags))))
    seen.append(ids())
    context.detach(token)
    seen.append(ids())
    traced.running = False
    seen.append(ids())
    return seen == [(5, 7), (9, 11), (5, 7), (0, 0)]


def fixed_decisions(sampler: Any) -> tuple[bool, bool, bool, bool, bool] | None:
    """What a sampler that looks at the parent's flags only decides (the SDK's `always_on`, `always_off`, and
    `parentbased_*` of those, whose trace state is the parent's): for a root, a remote sampled parent, a remote
    unsampled one, a local sampled one, a local unsampled one. None for any other sampler: it is asked each time."""
    from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler

    def fixed(one: Any) -> bool | None:
        decision: Any = getattr(one, "_decision", None) if type(one) is StaticSampler else None
        return None if decision is None else bool(decision.is_sampled())

    if type(sampler) is StaticSampler:
        return (bool(fixed(sampler)),) * 5
    if type(sampler) is ParentBased:
        decisions = [fixed(getattr(sampler, name, None)) for name in (
            "_root", "_remote_parent_sampled", "_remote_parent_not_sampled", "_local_parent_sampled",
            "_local_parent_not_sampled")]
        if None not in decisions:
            return (bool(decisions[0]), bool(decisions[1]), bool(decisions[2]), bool(decisions[3]),
                    bool(decisions[4]))
    return None


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        log.warning("%s=%r is not a number: %s", name, text, default)
        return default


def _otlp_post(exporter: Any, protocol: str) -> Callable[[bytes, int], None] | None:
    """How an encoded export request reaches the OTLP exporter's own transport (with the exporter's retries,
    headers, compression, TLS), or None where this exporter's version offers no way in: its spans then go through
    its `export`, encoded by the SDK."""
    if protocol == "http/protobuf":
        client = getattr(exporter, "_client", None)  # the exporter's HTTP client
        if client is None or not callable(getattr(client, "export", None)):
            return None

        def post_http(payload: bytes, count: int) -> None:
            result = client.export(payload)
            if not getattr(result, "success", True):
                log.warning("the OTLP export of %d span(s) failed", count)

        return post_http
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def post_grpc(payload: bytes, count: int) -> None:
        exporter.export(_Encoded(ExportTraceServiceRequest.FromString(payload), count))

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
    the proxy variables and no_proxy), no .netrc credentials for its host, no credential provider's session."""
    import requests.utils

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
    scope = InstrumentationScope(_SCOPE)  # what provider.get_tracer(_SCOPE) would have
    tracing = Tracing(provider, exporter, scope, _otlp_post(exporter, protocol) if protocol else None)
    client = getattr(getattr(exporter, "_client", None), "_transport", None)
    sending = f", {type(client).__name__}" if protocol == "http/protobuf" and client is not None else ""
    log.info("tracing on: %s exporter%s", exporter_name, f" ({protocol}{sending})" if protocol else "")
    return tracing
