"""What inference reports, and to whom: one `Timer` per request, `Observer`s told about every outcome, all of a
data plane's observers as one (`Observers`).

The pipeline (`core.pipeline`) moves a request through four phases, named as Triton's statistics extension names them:
`compute_input` (checking the request and preparing its inputs, a batch's merge included), `queue` (waiting to
run: for a worker thread, or for a dynamic batch to form), `compute_infer` (the model) and `compute_output`
(checking and converting what the model returned, classification and shared memory included). The timer enters
each phase as the request reaches it and adds up the time spent in each; time the request spends elsewhere (a
decoupled model's response being sent by the transport) is in no phase. Decoding and encoding the wire format is
the transports' work and in no phase either.

When a request is done, the pipeline hands its `InferenceRecord` (model, version, request id, batch size, outcome
and reason, phase durations, total time, and the phases as spans in wall-clock time) to every observer of the
data plane; every run of a model (one per request, or one per batch under dynamic batching) is reported as an
`ExecutionRecord`. The statistics extension (`statistics.Statistics`) is such an observer; metrics and tracing
subscribe the same way (`DataPlane.observers`). Observers are called on the event loop or in a gRPC server thread
(a request that runs there wholly): they must be quick and thread-safe; an exception in one is logged and
otherwise ignored. Every way an inference runs reports through one construct (`core.accounting.Inference`), and
the observers as one composite (`Observers`), which calls each observer only for what it listens to.

The lean way (`core.lean`, over both transports) times a request by its moments instead of a timer and reports a
success as they are, one that ran alone (`Observer.ran_alone`) or in a dynamic batch (`Observer.ran_in_batch`): an
observer may take them directly (the statistics do, and tracing those that ran alone); by default they become the
request's record, as on every other way. Its other requests (a failure, a batch of rows) are reported by the record
their moments make (`InferenceRecord.from_marks`).

A request answered in the gRPC polling thread (the lean way, an inline model) is recorded just after its answer
is sent, so that recording never delays it; that thread holds `Observers.recording` from before the answer goes
until the record is made, and whoever reads what the observers counted (the statistics extension, a metrics
scrape) takes it first (`Observers.settled`): a request answered before a read began is in what it reads.

Observers are also told when a request starts (`request_started`, once its model version is known), with the
request's timer: `Timer.state` holds what an observer keeps for the request until it finishes (a trace span), and
`Timer.trace` the caller's trace context as the transport received it (W3C `traceparent` and `tracestate`). While
a request runs, `current()` is its timer, so that log lines written meanwhile name the request.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ErrorKind, OipError

__all__ = [
    "COMPUTE_INFER",
    "COMPUTE_INPUT",
    "COMPUTE_OUTPUT",
    "PHASES",
    "QUEUE",
    "ExecutionRecord",
    "InferenceRecord",
    "Observer",
    "Observers",
    "Span",
    "Timer",
    "current",
    "execution_of",
    "ignore",
    "phases_of",
    "set_current",
]

log = logging.getLogger(__name__)

QUEUE: Final = "queue"
COMPUTE_INPUT: Final = "compute_input"
COMPUTE_INFER: Final = "compute_infer"
COMPUTE_OUTPUT: Final = "compute_output"
PHASES: Final = (QUEUE, COMPUTE_INPUT, COMPUTE_INFER, COMPUTE_OUTPUT)
"""Every phase of an inference request."""

MAX_SPANS: Final = 256
"""Spans kept per request (a decoupled model may answer with many responses); durations always add up."""
_clock: Final = time.perf_counter_ns  # the timers' clock (a decoupled stream reads it three times a response)


@dataclass(frozen=True, slots=True)
class Span:
    """One stretch of time a request spent in a phase, in nanoseconds since the Unix epoch."""

    phase: str
    start_ns: int
    end_ns: int


class InferenceRecord:
    """One finished inference request, as the data plane saw it.

    `error` is None for a success; a failure counts only its total time (its phase durations are what it got
    through before it failed). A request fails here only once its model version was found ready: an unknown model
    or version is refused before the pipeline starts.

    Made once per request: a plain class with slots (a frozen dataclass pays a call per field), its `spans` made
    only when an observer reads them (tracing does; the statistics and metrics do not).
    """

    __slots__ = (
        "_marks", "_offset", "_spans", "batch_size", "compute_infer_ns", "compute_input_ns", "compute_output_ns",
        "error", "first_response_ns", "model", "queue_ns", "request_id", "start_ns", "state", "total_ns", "version",
    )

    def __init__(
        self,
        model: str,
        version: str,
        request_id: str,
        batch_size: int,  # the request's batch dimension for a model that batches, 1 otherwise
        error: OipError | None,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        total_ns: int,  # from the data plane's first look at the request to its last response
        start_ns: int,  # when the request reached the data plane, in nanoseconds since the Unix epoch
        marks: Sequence[tuple[str, int, int]] = (),  # the phases as (phase, start, end) on another clock
        offset_ns: int = 0,  # that clock's reading + offset_ns = nanoseconds since the Unix epoch
        first_response_ns: int | None = None,  # a decoupled model's first response, after the start; None: none
        state: dict[str, Any] | None = None,  # what observers kept for the request (`Timer.state`)
    ) -> None:
        self.model = model
        self.version = version
        self.request_id = request_id
        self.batch_size = batch_size
        self.error = error
        self.queue_ns = queue_ns
        self.compute_input_ns = compute_input_ns
        self.compute_infer_ns = compute_infer_ns
        self.compute_output_ns = compute_output_ns
        self.total_ns = total_ns
        self.start_ns = start_ns
        self.first_response_ns = first_response_ns
        self.state: dict[str, Any] = {} if state is None else state
        self._marks = marks
        self._offset = offset_ns
        self._spans: tuple[Span, ...] | None = None

    @classmethod
    def from_marks(
        cls, model: str, version: str, request_id: str, error: OipError | None, start: int, queued: int,
        started: int, ended: int, done: int, timer: Timer | None = None, batch_size: int = 1, formed: int = 0,
    ) -> InferenceRecord:
        """The record of a request timed by moments on `time.perf_counter_ns`'s clock (the lean way): `start`, then
        `queued` (waiting for a slot, or for its dynamic batch), `formed` (its batch, whose inputs are then merged,
        in compute_input: 0 for a request that ran alone), `started` and `ended` (the model), `done`; a moment the
        request never reached is 0 (a failure), and so is the phase it would have begun (no span), as on the
        general way. `timer` (when there is one) gives the observers' state and the clock's offset."""
        marks: list[tuple[str, int, int]] = [(COMPUTE_INPUT, start, queued or done)]
        if queued:
            marks.append((QUEUE, queued, formed or started or done))
        if formed:
            marks.append((COMPUTE_INPUT, formed, started or done))
        if started:
            marks.append((COMPUTE_INFER, started, ended or done))
        if ended:
            marks.append((COMPUTE_OUTPUT, ended, done))
        offset = timer.start_unix - timer.start if timer is not None else time.time_ns() - time.perf_counter_ns()
        return cls(
            model, version, request_id, batch_size, error, *phases_of(start, queued, formed, started, ended, done),
            start + offset, tuple(marks), offset, None, timer.state if timer is not None else None,
        )

    @property
    def spans(self) -> tuple[Span, ...]:
        """The phases in the order the request went through them (at most MAX_SPANS), in wall-clock time."""
        if self._spans is None:
            offset = self._offset
            self._spans = tuple(Span(phase, start + offset, end + offset) for phase, start, end in self._marks)
        return self._spans

    @property
    def marks(self) -> tuple[Sequence[tuple[str, int, int]], int]:
        """What `spans` is made of, for an observer that makes the spans later elsewhere: the phases as (phase,
        start, end) on the timer's clock, and the offset that takes that clock to nanoseconds since the epoch."""
        return self._marks, self._offset

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def error_kind(self) -> ErrorKind | None:
        """The failure's kind (a status: invalid argument, model failure...), None for a success."""
        return self.error.kind if self.error is not None else None

    def __repr__(self) -> str:
        outcome = "ok" if self.error is None else f"failed ({self.error.kind.name})"
        return (
            f"<InferenceRecord {self.model!r} version {self.version!r} id {self.request_id!r}: {outcome}, "
            f"{self.total_ns} ns>"
        )


@dataclass(slots=True)
class ExecutionRecord:
    """One run of a model: `batch_size` is the sum of the batch sizes of the requests it served. (Not frozen: a
    frozen dataclass's constructor pays a call per field, and one is made per request.)"""

    model: str
    version: str
    batch_size: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


class Observer:
    """Told about every inference request and model run of a data plane (`DataPlane.observers`). Override what
    you need; what is not overridden is never called (`Observers`)."""

    def request_started(self, timer: Timer, model: str, version: str) -> None:
        """A request reached its model version: it will finish, and be told about, exactly once."""

    def request_finished(self, record: InferenceRecord) -> None:
        """A request is done, successfully or not."""

    def execution_finished(self, record: ExecutionRecord) -> None:
        """A model run is done (before the requests it served finish)."""

    def request_ran_alone(self, record: InferenceRecord) -> None:
        """A successful request that ran the model by itself is done: that run (`execution_finished` with the
        request's own phases), then the request (`request_finished`). One call instead of two on the way every
        plain request takes; override it to do both more cheaply."""
        self.execution_finished(execution_of(record))
        self.request_finished(record)

    def ran_alone(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                  started: int, ended: int, done: int) -> None:
        """`request_ran_alone` of a request timed by its moments (the lean gRPC way; see
        `InferenceRecord.from_marks`; `timer` is None when no observer listens to `request_started` and the request
        has no id). Here: `request_ran_alone` with the record made of them; override it to take the moments as
        they are."""
        self.request_ran_alone(
            InferenceRecord.from_marks(model, version, request_id, None, start, queued, started, ended, done, timer)
        )

    def ran_in_batch(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                     formed: int, started: int, ended: int, done: int, batch_size: int) -> None:
        """`request_finished` of a successful request of the lean way that ran in a dynamic batch (its batch size
        `batch_size`), timed by its moments (`formed`: when its batch was formed; see `ran_alone`). Here:
        `request_finished` with the record made of them; override it to take the moments as they are."""
        self.request_finished(InferenceRecord.from_marks(
            model, version, request_id, None, start, queued, started, ended, done, timer, batch_size, formed))


def _ignored(self: Observer, *args: Any) -> None:
    """A hook this observer does not listen to: never called."""


ignore: Final[Any] = _ignored
"""What a hook of `Observer` is set to in an observer that does not listen to it, though a default would do
something (`ran_alone = ignore`): never called, as a hook not overridden."""


class Timer:
    """The phases of one inference request (see the module's description).

    The timer starts in `compute_input` when it is created. `enter(phase)` closes the current phase and starts
    `phase` (None: no phase, the time is not counted); `at` gives the moment when it was measured elsewhere
    (`time.perf_counter_ns()`, as when a worker thread started the model). `record` makes the request's record.
    """

    __slots__ = (
        "_durations", "_mark", "_phase", "_spans", "first_response", "request_id", "start", "start_unix", "state",
        "trace",
    )

    def __init__(self, request_id: str = "", trace: Mapping[str, str] | None = None, transport: str = "") -> None:
        self.request_id = request_id
        self.trace = trace
        self.state: dict[str, Any] = {"transport": transport} if transport else {}
        self.first_response: int | None = None  # perf_counter_ns of a decoupled model's first response
        self.start = time.perf_counter_ns()
        self.start_unix = time.time_ns()
        self._phase: str | None = COMPUTE_INPUT
        self._mark = self.start
        self._durations = dict.fromkeys(PHASES, 0)
        self._spans: list[tuple[str, int, int]] = []

    def enter(self, phase: str | None, at: int | None = None) -> int:
        """Close the current phase at `at` (now when None) and start `phase` there; returns that moment."""
        now = _clock() if at is None else at
        current = self._phase
        if current is not None:
            mark = self._mark
            elapsed = now - mark if now > mark else 0  # `at` may precede the mark (another thread's clock reading)
            self._durations[current] += elapsed
            spans = self._spans
            if len(spans) < MAX_SPANS:
                spans.append((current, mark, mark + elapsed))
        self._phase = phase
        self._mark = now
        return now

    def duration(self, phase: str) -> int:
        """The time spent so far in `phase` (closed stretches only), in nanoseconds."""
        return self._durations[phase]

    def execution(self, model: str, version: str, batch_size: int) -> ExecutionRecord:
        """This request's phases as the record of a model run that served it alone."""
        d = self._durations
        return ExecutionRecord(model, version, batch_size, d[COMPUTE_INPUT], d[COMPUTE_INFER], d[COMPUTE_OUTPUT])

    def record(self, model: str, version: str, batch_size: int, error: OipError | None = None) -> InferenceRecord:
        """Close the current phase and make the request's record; the total runs until now."""
        end = self.enter(None)
        d = self._durations
        return InferenceRecord(
            model, version, self.request_id, batch_size, error, d[QUEUE], d[COMPUTE_INPUT], d[COMPUTE_INFER],
            d[COMPUTE_OUTPUT], end - self.start, self.start_unix, tuple(self._spans), self.start_unix - self.start,
            None if self.first_response is None else self.first_response - self.start, self.state,
        )


_CURRENT: contextvars.ContextVar[Timer | None] = contextvars.ContextVar("oip_timer", default=None)


def current() -> Timer | None:
    """The timer of the inference request running in this context (task or thread), if any."""
    return _CURRENT.get()


def set_current(timer: Timer | None) -> None:
    """Make `timer` the current request's (None: no request) in this context."""
    _CURRENT.set(timer)


def phases_of(start: int, queued: int, formed: int, started: int, ended: int, done: int) -> tuple[
        int, int, int, int, int]:
    """The time in each phase of a request timed by its moments (see `InferenceRecord.from_marks`), in
    nanoseconds: queue, compute_input, compute_infer, compute_output, and the total."""
    queued, started, ended = queued or done, started or done, ended or done
    waited = (formed or started) - queued
    return waited, queued - start + started - queued - waited, ended - started, done - ended, done - start


def execution_of(record: InferenceRecord) -> ExecutionRecord:
    """The model run of a request that ran alone: its phases."""
    return ExecutionRecord(
        record.model, record.version, record.batch_size, record.compute_input_ns, record.compute_infer_ns,
        record.compute_output_ns,
    )


_HOOKS: Final = ("request_started", "request_finished", "execution_finished", "request_ran_alone", "ran_alone",
                 "ran_in_batch")


def _listens(observer: Observer, hook: str) -> bool:
    """Whether `observer` does something on `hook`: overrides it (not with `ignore`), or keeps a default that calls
    hooks it overrides."""
    function = getattr(getattr(observer, hook), "__func__", None)
    if function is ignore:
        return False
    if function is not getattr(Observer, hook):
        return True
    if hook == "request_ran_alone":
        return _listens(observer, "execution_finished") or _listens(observer, "request_finished")
    if hook == "ran_alone":
        return _listens(observer, "request_ran_alone")
    if hook == "ran_in_batch":
        return _listens(observer, "request_finished")
    return False


class Observers:
    """A data plane's observers as one: each hook of `Observer`, told to every observer that listens to it (in
    order; an exception in one is logged and otherwise ignored). A list of observers otherwise: `append`, `insert`,
    `remove`, iteration."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers = list(observers)
        self._hooks: dict[str, tuple[Callable[..., None], ...]] = {}
        self._refresh()
        # Held while answers already sent are being recorded (see the module's description).
        self.recording = threading.Lock()

    def settled(self) -> None:
        """Return once every request answered so far is recorded: before reading what the observers counted."""
        with self.recording:
            pass

    def _refresh(self) -> None:
        self._hooks = {hook: tuple(getattr(o, hook) for o in self._observers if _listens(o, hook)) for hook in _HOOKS}
        self.starting = bool(self._hooks["request_started"])  # some observer is told when a request starts

    def append(self, observer: Observer) -> None:
        self._observers.append(observer)
        self._refresh()

    def insert(self, index: int, observer: Observer) -> None:
        self._observers.insert(index, observer)
        self._refresh()

    def remove(self, observer: Observer) -> None:
        self._observers.remove(observer)
        self._refresh()

    def __iter__(self) -> Iterator[Observer]:
        return iter(list(self._observers))

    def __len__(self) -> int:
        return len(self._observers)

    def __repr__(self) -> str:
        return f"Observers({self._observers!r})"

    def request_started(self, timer: Timer | None, model: str, version: str) -> None:
        """Make `timer` the current request's, and tell every observer that listens; None: no request is current
        here (nobody listens, and the request has nothing to name in log lines)."""
        _CURRENT.set(timer)
        if timer is not None:
            for hook in self._hooks["request_started"]:
                try:
                    hook(timer, model, version)
                except Exception:
                    log.exception("observer %r failed on a started request", _owner(hook))

    def request_finished(self, record: InferenceRecord) -> None:
        for hook in self._hooks["request_finished"]:
            try:
                hook(record)
            except Exception:
                log.exception("observer %r failed on a finished request", _owner(hook))

    def execution_finished(self, record: ExecutionRecord) -> None:
        for hook in self._hooks["execution_finished"]:
            try:
                hook(record)
            except Exception:
                log.exception("observer %r failed on a finished model run", _owner(hook))

    def request_ran_alone(self, record: InferenceRecord) -> None:
        for hook in self._hooks["request_ran_alone"]:
            try:
                hook(record)
            except Exception:
                log.exception("observer %r failed on a finished request", _owner(hook))

    def ran_alone(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                  started: int, ended: int, done: int) -> None:
        for hook in self._hooks["ran_alone"]:
            try:
                hook(timer, model, version, request_id, start, queued, started, ended, done)
            except Exception:
                log.exception("observer %r failed on a finished request", _owner(hook))

    def ran_in_batch(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                     formed: int, started: int, ended: int, done: int, batch_size: int) -> None:
        for hook in self._hooks["ran_in_batch"]:
            try:
                hook(timer, model, version, request_id, start, queued, formed, started, ended, done, batch_size)
            except Exception:
                log.exception("observer %r failed on a finished request", _owner(hook))


def _owner(hook: Callable[..., None]) -> object:
    return getattr(hook, "__self__", hook)
