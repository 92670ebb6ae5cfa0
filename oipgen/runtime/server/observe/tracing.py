"""OpenTelemetry traces of inference requests: the `Tracing` observer (configured from the OpenTelemetry
environment by `tracing_setup`; off, nothing of OpenTelemetry is imported and a request costs nothing more than
reading two headers).

The caller's W3C trace context (`traceparent`, `tracestate`: REST headers or gRPC metadata, `carrier`) travels with
the request (`InferRequest.trace`), so the server's spans join the caller's trace. Each inference request is a span
(`ModelInfer <model>`, kind server) with a child per phase the timer measured (queue, compute_input,
compute_infer, compute_output; for a decoupled model one compute_infer / compute_output pair per response), and
the attributes `model_name`, `model_version`, `request_id`, `transport` and `status`. The request's span context
is OpenTelemetry's current one while the request runs, so spans a model makes with the OpenTelemetry API (the
SDK's tracer provider is the global one) are children of the request's span; log lines written meanwhile carry its
trace and span ids (`current_ids`). Spans are exported in batches (`OTEL_BSP_SCHEDULE_DELAY`,
`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).

What a caller sends is bounded before it is queued: string attributes that come from the request (`model_name`,
`model_version`, `request_id`) are cut to the SDK's attribute length limit (`OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`,
else `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`), and a request id to `REQUEST_ID_LIMIT` characters where neither is set;
the queue holds at most `OTEL_BSP_MAX_QUEUE_SIZE` spans and `MAX_QUEUE_BYTES` bytes, what it cannot hold dropped
and counted. A caller's trace context invalid in part or whole is ignored, as W3C Trace Context asks; the API's
warnings about it (quoting the caller's text) are dropped and such callers counted (`_CallerWarnings`), as are the
requests of a batch the collector did not take; each count is logged at most once a minute (`Tracing._report`).

How the spans are made, and why not with the SDK's `Span` objects: an SDK span per phase and the SDK's OTLP encoder
cost about three times the server's own work per request (measured: ~170 us for the five spans, ~140 us to encode
them, against ~200 us of server CPU for a whole REST inference). So the request path only does what must happen
then: the caller's context is extracted (the SDK's W3C propagator; a plain traceparent is read here, exactly as the
propagator reads it, `plain_caller`), the SDK's configured sampler decides once per request (a sampler that only
follows the parent's flags, as `always_on` and `parentbased_always_on` do, is not asked: its decision for each kind
of parent is read once, `fixed_decisions`), the SDK's id generator gives the span id, and the request's span context
is the API's current one (OpenTelemetry's runtime context sees the running request and makes its context only when
asked for, `_request_runtime`). When the request finishes, its outcome and the timer's phase timestamps are queued
as plain values (`otlp.Finished`). A background thread gives the children their ids, writes the spans' OTLP protobuf
encoding (`otlp`) and hands the batch to the exporter's transport (`tracing_setup`).
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
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

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
from .otlp import Finished, encode_finished, envelope_of, exported, new_finished, readable_spans, spans_of, wrap

__all__ = ["MAX_QUEUE_BYTES", "REQUEST_ID_LIMIT", "SCOPE", "TRACE_HEADERS", "Tracing", "carrier", "current_ids",
           "enabled", "fixed_decisions"]

log = logging.getLogger(__name__)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
_PLAIN_TRACEPARENT: Final = re.compile("00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_STATE: Final = "otel"  # Timer.state key: the request's `_Traced`, kept after it finished (log lines use its ids)
SCOPE: Final = "oip.server"  # the instrumentation scope of the server's spans
_SPANS: Final = 5  # the spans of a request that is not decoupled: its own and one per phase
REQUEST_ID_LIMIT: Final = 256
"""Characters of a client's request id the server repeats: in a log line, and as a span's attribute where no
OpenTelemetry attribute length limit is set."""
MAX_QUEUE_BYTES: Final = 16 * 1024 * 1024
"""Bytes the export queue holds at most (as well as `OTEL_BSP_MAX_QUEUE_SIZE` spans)."""
_ENTRY_BYTES: Final = 1024  # a queued request's memory but for its request id and error message (ids, phases)
_REPORT_EVERY: Final = 60.0  # seconds between two log lines counting ignored trace contexts, or failed exports
_REASON_LIMIT: Final = 300  # characters of an exporter's error kept in the log line that counts failed exports


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


class _CallerWarnings(logging.Filter):
    """Drops the OpenTelemetry API's warnings while a thread reads a caller's trace context (a bad `tracestate`
    member, a `traceparent` too long...: each quoting the caller's text), noting them; `count` counts the callers
    whose context was invalid in part or whole (warned about, or no valid context: API versions warn about
    different things), for a periodic line instead (`Tracing._report`)."""

    LOGGERS: Final = ("opentelemetry.trace.span", "opentelemetry.trace.propagation.tracecontext")

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.local()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        reading = self.reading
        if getattr(reading, "on", False):
            reading.warned = True
            return False
        return True

    def install(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)


_CALLER_WARNINGS: Final = _CallerWarnings()


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


# --- the observer -------------------------------------------------------------------------------------------------


class Tracing(Observer):
    """The inference timer's observer that traces requests: the request path samples and queues, a background
    thread makes, encodes and exports the spans (see the module's description)."""

    def __init__(self, provider: Any, exporter: Any, scope: Any,
                 post: Callable[[bytes, int], bool] | None = None) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.exporter = exporter
        self.scope = scope
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.propagator = TraceContextTextMapPropagator()
        _CALLER_WARNINGS.install()
        self._reading = _CALLER_WARNINGS.reading
        self._next_report = 0.0
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
        # The OTLP exporter's transport, taking an encoded export request and its span count, saying whether the
        # collector took it; None: the exporter takes ReadableSpans.
        self.post = post
        self.envelope = envelope_of(provider.resource, scope) if post is not None else None
        self.delay = _env_number("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        # The SDK's batch settings count spans; the queue holds requests, of _SPANS spans each (a plain request).
        self.max_queue = max(1, int(_env_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)) // _SPANS)
        self.batch_size = max(1, min(int(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)) // _SPANS,
                                     self.max_queue))
        self.queue: collections.deque[Finished] = collections.deque()
        self.max_queue_bytes = MAX_QUEUE_BYTES
        self.queued_bytes = 0  # `_size` of what is queued (under `_queue_lock`)
        self._queue_lock = threading.Lock()
        self.dropped = 0
        # Requests whose spans the collector did not take, the last reason, when they may next be told (`_report`)
        self.failed, self.failure, self._next_failure_report = 0, "", 0.0
        # String attributes from the request are cut to the SDK's attribute length limit (None: no limit), a
        # request id to REQUEST_ID_LIMIT without one.
        from opentelemetry.sdk.trace import SpanLimits

        self.value_limit: int | None = SpanLimits().max_span_attribute_length
        self.id_limit = REQUEST_ID_LIMIT if self.value_limit is None else self.value_limit
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
                reading = self._reading
                reading.on, reading.warned = True, False  # the API's warnings about the caller's text: not logged
                try:
                    parent = self.propagator.extract(caller)
                finally:
                    reading.on = False
                parent_context = trace.get_current_span(parent).get_span_context()
                if reading.warned or ("traceparent" in caller and not parent_context.is_valid):
                    _CALLER_WARNINGS.count += 1
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
        if len(request_id) > self.id_limit:
            request_id = request_id[:self.id_limit]
        limit = self.value_limit
        if limit is not None and (len(model) > limit or len(version) > limit):
            model, version = model[:limit], version[:limit]
        size = _size(request_id, message)
        queue = self.queue
        with self._queue_lock:
            if len(queue) >= self.max_queue or self.queued_bytes + size > self.max_queue_bytes:
                self.dropped += 1
                return
            self.queued_bytes += size
            queue.append(new_finished(Finished, (
                traced, model, version, request_id, state.get("transport", ""), status, message, start_ns, end_ns,
                phases, offset,
            )))
        if len(queue) >= self.batch_size and not self._wake.is_set():
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

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self.delay)
            self._wake.clear()
            stopping = self._stopping
            # Woken by a full batch: export full batches; at the schedule's delay or the stop: everything.
            self.flush(self.batch_size if woken and not stopping else 1)
            self._report(stopping)
            if stopping:
                return

    def _report(self, last: bool = False) -> None:
        """Log how many traced requests the collector did not take, and how many callers' trace contexts were
        invalid (ignored), each at most once every _REPORT_EVERY s, and what is left to tell at the `last`."""
        now = time.monotonic()
        if self.failed and (now >= self._next_failure_report or last):
            count, self.failed = self.failed, 0
            self._next_failure_report = now + _REPORT_EVERY
            log.warning("%d traced request(s) dropped: the collector did not take them (%s)", count, self.failure)
        if _CALLER_WARNINGS.count and (now >= self._next_report or last):
            count, _CALLER_WARNINGS.count = _CALLER_WARNINGS.count, 0
            self._next_report = now + _REPORT_EVERY
            log.info("%d caller trace context(s) (traceparent, tracestate) were invalid in part or whole and were "
                     "ignored, as W3C Trace Context asks", count)

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
            with self._queue_lock:
                batch = [queue.popleft() for _ in range(min(len(queue), self.batch_size))]
                self.queued_bytes -= sum(_size(finished.request_id, finished.message) for finished in batch)
            ids = self.span_ids(sum(len(finished.phases) for finished in batch))  # the phases' span ids
            try:
                if self.post is not None and self.envelope is not None:
                    spans = b"".join([encode_finished(finished, ids) for finished in batch])
                    taken = self.post(wrap(spans, self.envelope), sum(1 + len(finished.phases) for finished in batch))
                else:
                    readable = [span for finished in batch for span in spans_of(finished, ids)]
                    taken = exported(self.exporter.export(readable_spans(readable, self.provider.resource, self.scope)))
                reason = "the exporter reported a failure"
            except Exception as exc:  # an exporter that raises rather than returns its failure (older versions)
                taken, reason = False, f"{type(exc).__name__}: {exc}"[:_REASON_LIMIT]
            if not taken:
                self.failed, self.failure = self.failed + len(batch), reason
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


def _size(request_id: str, message: str) -> int:
    """The memory a queued request holds, about: its parts of a bounded size, its request id and error message."""
    return _ENTRY_BYTES + sys.getsizeof(request_id) + sys.getsizeof(message)


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
    `events.current()`) and no other context was attached since it started, the current context is the one it
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
