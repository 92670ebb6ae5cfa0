"""Prometheus metrics: Triton's inference metrics, latency histograms, request counts per transport, model metrics.

Served at `GET /metrics` on the REST port (and on `--metrics-port` if set) in Prometheus' text format.

- Triton's names and meanings, labels `model` and `version`: `nv_inference_request_success`,
  `nv_inference_request_failure` (and its `reason`: REJECTED for a request refused by validation, BACKEND for a
  model failure, CANCELED for a caller that went away, OTHER otherwise), `nv_inference_count`,
  `nv_inference_exec_count`, `nv_inference_pending_request_count`, and the cumulative microsecond counters
  `nv_inference_request_duration_us`, `nv_inference_queue_duration_us` and
  `nv_inference_compute_{input,infer,output}_duration_us`. They are read from the statistics extension at scrape
  time (`statistics.Statistics`, fed by the same inference timer), so both always agree: a duration in
  microseconds is the statistics' nanoseconds // 1000.
- `nv_inference_request_duration_seconds` (a histogram of request durations) and
  `nv_inference_first_response_histogram_ms` (time to a decoupled model's first response), buckets configurable.
- `oip_requests_total{transport, operation, code}`: every request of every operation, by transport (rest, grpc)
  and answer (the HTTP status, or the gRPC code's name).
- Metrics of model code (`Model.metrics`): counters, gauges and histograms a model registers, with its `model`
  and `version` labels.

The exposition is written here rather than by prometheus_client: Triton's counters are named without the
`_total` suffix that prometheus_client adds to every counter, and dashboards built for Triton query those names.
A request costs the hot path one dictionary update in the calling thread's own counts (its answer) and no lock
of the metrics: its end and its duration's bucket are counted by the statistics, under the lock they take anyway,
and the scrape reads pending requests from the model repository, which counts the requests holding each model. With
`--workers N` a scrape answered by any worker is the sum over the workers: it asks the others for their samples
(`cluster`) and adds them up, sample by sample (a gauge is summed too).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import ErrorKind
from .settings import Settings
from .statistics import Statistics
from .timing import InferenceRecord, Observer

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_BUCKETS",
    "Family",
    "Metrics",
    "ModelMetrics",
    "merge",
    "render",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_BUCKETS: Final = Settings().metrics_buckets

# A failed request's reason, as Triton labels nv_inference_request_failure.
REASONS: Final[dict[ErrorKind, str]] = {
    ErrorKind.INVALID_ARGUMENT: "REJECTED",
    ErrorKind.TOO_LARGE: "REJECTED",
    ErrorKind.NOT_FOUND: "REJECTED",
    ErrorKind.NOT_READY: "REJECTED",
    ErrorKind.UNIMPLEMENTED: "REJECTED",
    ErrorKind.ALREADY_EXISTS: "REJECTED",
    ErrorKind.MODEL_FAILURE: "BACKEND",
    ErrorKind.CANCELLED: "CANCELED",
}

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family: its samples by (sample name, labels)."""

    name: str
    type: str  # counter, gauge, histogram
    help: str
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def add(self, sample: str, labels: Labels, value: float) -> None:
        key = (sample, labels)
        self.samples[key] = self.samples.get(key, 0.0) + value

    def to_json(self) -> list[Any]:
        samples = [[s, [list(kv) for kv in lb], v] for (s, lb), v in self.samples.items()]
        return [self.name, self.type, self.help, samples]

    @staticmethod
    def from_json(doc: list[Any]) -> Family:
        family = Family(str(doc[0]), str(doc[1]), str(doc[2]))
        for sample, labels, value in doc[3]:
            family.add(str(sample), tuple((str(k), str(v)) for k, v in labels), float(value))
        return family


def merge(groups: Iterable[Iterable[Family]]) -> list[Family]:
    """Families of several processes as one: samples with the same name and labels add up."""
    merged: dict[str, Family] = {}
    for families in groups:
        for family in families:
            target = merged.setdefault(family.name, Family(family.name, family.type, family.help))
            for (sample, labels), value in family.samples.items():
                target.add(sample, labels, value)
    return list(merged.values())


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def render(families: Iterable[Family]) -> bytes:
    """Prometheus' text exposition format (version 0.0.4)."""
    out: list[str] = []
    for family in sorted(families, key=lambda f: f.name):
        help_text = family.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {family.name} {help_text}")
        out.append(f"# TYPE {family.name} {family.type}")
        for (sample, labels), value in sorted(family.samples.items(), key=_sample_order):
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.append(f"{sample}{{{text}}} {_number(value)}" if text else f"{sample} {_number(value)}")
    return ("\n".join(out) + "\n").encode()


def _sample_order(item: tuple[tuple[str, Labels], float]) -> tuple[Any, ...]:
    (sample, labels), _ = item
    rest = tuple(kv for kv in labels if kv[0] != "le")
    le = next((float(v.replace("+Inf", "inf")) for k, v in labels if k == "le"), 0.0)
    return (rest, sample, le)


class _Histogram:
    """Cumulative bucket counts, a sum and a count per label set (Prometheus' histogram)."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.help = help_text
        self.bounds = sorted(set(buckets))
        self.data: dict[Labels, list[float]] = {}  # per labels: one count per bound, +Inf, sum

    def observe(self, labels: Labels, value: float) -> None:
        row = self.row(labels)
        row[bisect.bisect_left(self.bounds, value)] += 1
        row[-1] += value

    def row(self, labels: Labels) -> list[float]:
        """The counts of `labels` (made all zero on first use), updated in place: one per bound, +Inf, the sum."""
        row = self.data.get(labels)
        if row is None:
            row = self.data[labels] = [0.0] * (len(self.bounds) + 2)
        return row

    def family(self) -> Family:
        family = Family(self.name, "histogram", self.help)
        for labels, row in self.data.items():
            running = 0.0
            for bound, count in zip([*self.bounds, math.inf], row[:-1], strict=True):
                running += count
                family.add(f"{self.name}_bucket", (*labels, ("le", _number(float(bound)))), running)
            family.add(f"{self.name}_count", labels, running)
            family.add(f"{self.name}_sum", labels, row[-1])
        return family


_COUNTERS: Final = (
    # name, help, statistics field, what of it
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success", "count"),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)", "inference_count", None),
    ("nv_inference_exec_count", "Number of model executions performed", "execution_count", None),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", "success", "us"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue", "us"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     "compute_input", "us"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     "compute_infer", "us"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     "compute_output", "us"),
)


class _Shard:
    """One thread's counts: only that thread adds to them (no lock); a scrape adds up every thread's."""

    __slots__ = ("requests", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.requests: dict[tuple[str, str, str | int], int] = {}  # (transport, operation, code): answers

    def fold(self, into: _Shard) -> None:
        """Add these counts to `into`'s (safe while this thread counts on: each dictionary is read in one step)."""
        requests = into.requests
        for key, n in list(self.requests.items()):
            requests[key] = requests.get(key, 0) + n


class Metrics(Observer):
    """The server's metrics: an observer of the inference timer, and the counts the transports report.

    A request costs the hot path little, and takes no lock of the metrics: each thread counts in its own
    dictionaries (`_Shard`), a scrape adds them up. A request's end, and its duration in the latency histogram, are
    counted by the statistics (`Statistics.keep_durations`), under the lock they take anyway; a transport counts
    its answer (`count`). The pending requests of a model version are those holding it in the model repository
    (`inflight`: `ModelRepository.inflight`). Labels are made at scrape time.
    """

    def __init__(self, statistics: Statistics, inflight: Callable[[], Mapping[tuple[str, str], int]],
                 buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        self.statistics = statistics
        self.inflight = inflight
        self.failures: dict[tuple[Labels, str], int] = {}
        self._lock = threading.Lock()  # failures, first responses, the list of shards
        self._local = threading.local()  # .shard: this thread's
        self._shards: list[_Shard] = []
        self._ended = _Shard(threading.current_thread())  # the counts of threads that ended
        self._bounds = statistics.keep_durations(buckets)
        self.first_response = _Histogram(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to the first response of a decoupled model, in milliseconds",
            [b * 1000.0 for b in buckets],
        )

    def _shard(self) -> _Shard:
        """This thread's counts, made on its first count."""
        shard = self._local.shard = _Shard(threading.current_thread())
        with self._lock:
            self._shards.append(shard)
        return shard

    def _totals(self) -> _Shard:
        """Every thread's counts added up (the counts of threads that ended are kept in one)."""
        with self._lock:
            live = []
            for shard in self._shards:
                if shard.thread.is_alive():
                    live.append(shard)
                else:  # it counts no more
                    shard.fold(self._ended)
            self._shards = live
            total = _Shard(self._ended.thread)
            self._ended.fold(total)
        for shard in live:
            shard.fold(total)
        return total

    @property
    def requests(self) -> dict[tuple[str, str, str], int]:
        """Answered requests, by (transport, operation, code): the HTTP status or gRPC code's name."""
        counted: dict[tuple[str, str, str], int] = {}
        for (transport, operation, code), n in self._totals().requests.items():
            key = (transport, operation, str(code))
            counted[key] = counted.get(key, 0) + n
        return counted

    @property
    def duration(self) -> _Histogram:
        """The histogram of successful request durations, in seconds, as the statistics keep it."""
        histogram = _Histogram("nv_inference_request_duration_seconds",
                               "Inference request duration in seconds (successful requests)", self._bounds)
        for (model, version), row in self.statistics.durations().items():
            histogram.data[(("model", model), ("version", version))] = row
        return histogram

    @property
    def pending(self) -> dict[Labels, int]:
        """The requests of each model version that started and did not finish yet, by labels (those holding the
        model in the repository: a request costs the metrics nothing at its start)."""
        return {(("model", model), ("version", version)): n for (model, version), n in self.inflight().items()}

    # --- the inference timer ------------------------------------------------------------------------------------

    def request_finished(self, record: InferenceRecord) -> None:
        # The statistics count the request's end and its duration; what they do not tell is counted here.
        if record.error is not None:
            failure = ((("model", record.model), ("version", record.version)),
                       REASONS.get(record.error.kind, "OTHER"))
            with self._lock:
                self.failures[failure] = self.failures.get(failure, 0) + 1
        elif record.first_response_ns is not None:
            with self._lock:
                self.first_response.observe((("model", record.model), ("version", record.version)),
                                            record.first_response_ns / 1e6)

    def request_ran_alone(self, record: InferenceRecord) -> None:
        # Model runs are not counted here (nv_inference_exec_count: the statistics), nor a plain success.
        if record.first_response_ns is not None:
            self.request_finished(record)

    # --- the transports -----------------------------------------------------------------------------------------

    def count(self, transport: str, operation: str, code: str | int) -> None:
        """One answered request of `operation` over `transport` (rest, grpc), with its HTTP status or gRPC code."""
        try:
            requests = self._local.shard.requests
        except AttributeError:
            requests = self._shard().requests
        key = (transport, operation, code)
        requests[key] = requests.get(key, 0) + 1

    # --- a scrape -----------------------------------------------------------------------------------------------

    def families(self) -> list[Family]:
        """Every metric of this process (a worker's own, with --workers)."""
        families = []
        stats = self.statistics.snapshot()
        for name, help_text, source, what in _COUNTERS:
            family = Family(name, "counter", help_text)
            for (model, version), values in stats.items():
                value = values[source]
                if isinstance(value, tuple):  # (count, ns)
                    value = value[0] if what == "count" else value[1] // 1000
                family.add(name, (("model", model), ("version", version)), float(value))
            families.append(family)
        failure = Family("nv_inference_request_failure", "counter",
                         "Number of failed inference requests, all batch sizes")
        for model, version in stats:  # a zero sample for every model version, as Triton
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                labels: Labels = (("model", model), ("version", version), ("reason", reason))
                failure.add("nv_inference_request_failure", labels, 0.0)
        pendings = list(self.pending.items())
        families_of_histograms = [self.duration.family()]
        with self._lock:
            failures = list(self.failures.items())
            families_of_histograms.append(self.first_response.family())
        for (labels, reason), n in failures:
            failure.add("nv_inference_request_failure", (*labels, ("reason", reason)), float(n))
        families.append(failure)
        pending = Family("nv_inference_pending_request_count", "gauge",
                         "Instantaneous number of pending requests awaiting execution per model")
        for model, version in stats:
            pending.add("nv_inference_pending_request_count", (("model", model), ("version", version)), 0.0)
        for labels, n in pendings:
            pending.add("nv_inference_pending_request_count", labels, float(n))
        families.append(pending)
        families += families_of_histograms
        requests = Family("oip_requests_total", "counter", "Requests answered, by transport, operation and answer")
        for (transport, operation, code), n in self.requests.items():
            labels = (("code", code), ("operation", operation), ("transport", transport))
            requests.add("oip_requests_total", labels, float(n))
        families.append(requests)
        families += _model_families()
        return families


# --- metrics of model code ------------------------------------------------------------------------------------

_MODEL_LOCK = threading.Lock()
_MODEL_METRICS: dict[str, _UserMetric] = {}


class _UserMetric:
    """A metric registered by model code: one kind, one help text, its label names (`model` and `version` first)."""

    def __init__(self, name: str, kind: str, help_text: str, labelnames: Sequence[str],
                 buckets: Sequence[float]) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.labelnames = ("model", "version", *labelnames)
        self.values: dict[Labels, float] = {}
        self.histogram = _Histogram(name, help_text, buckets) if kind == "histogram" else None
        self.lock = threading.Lock()

    def family(self) -> Family:
        if self.histogram is not None:
            with self.lock:
                return self.histogram.family()
        family = Family(self.name, self.kind, self.help)
        with self.lock:
            for labels, value in self.values.items():
                family.add(self.name, labels, value)
        return family


def _model_families() -> list[Family]:
    with _MODEL_LOCK:
        metrics = list(_MODEL_METRICS.values())
    return [m.family() for m in metrics]


class ModelMetric:
    """A model's counter, gauge or histogram, with the model's labels (and any others, set with `labels`)."""

    def __init__(self, metric: _UserMetric, labels: Labels) -> None:
        self._metric = metric
        self._labels = labels

    def labels(self, **values: str) -> ModelMetric:
        """This metric with values for the other label names it was registered with."""
        names = self._metric.labelnames[2:]
        if set(values) != set(names):
            raise ValueError(f"metric {self._metric.name} takes the labels {list(names)}, got {sorted(values)}")
        return ModelMetric(self._metric, self._labels[:2] + tuple((n, str(values[n])) for n in names))

    def _key(self) -> Labels:
        if len(self._labels) != len(self._metric.labelnames):
            raise ValueError(f"metric {self._metric.name} needs .labels({', '.join(self._metric.labelnames[2:])})")
        return self._labels

    def inc(self, amount: float = 1.0) -> None:
        if self._metric.kind == "counter" and amount < 0:
            raise ValueError("a counter only goes up")
        self._add(amount)

    def dec(self, amount: float = 1.0) -> None:
        if self._metric.kind != "gauge":
            raise ValueError("only a gauge goes down")
        self._add(-amount)

    def set(self, value: float) -> None:
        if self._metric.kind != "gauge":
            raise ValueError("only a gauge is set")
        key = self._key()
        with self._metric.lock:
            self._metric.values[key] = float(value)

    def observe(self, value: float) -> None:
        if self._metric.histogram is None:
            raise ValueError("only a histogram observes")
        key = self._key()
        with self._metric.lock:
            self._metric.histogram.observe(key, float(value))

    def _add(self, amount: float) -> None:
        if self._metric.kind == "histogram":
            raise ValueError("a histogram observes values")
        key = self._key()
        with self._metric.lock:
            self._metric.values[key] = self._metric.values.get(key, 0.0) + amount


class ModelMetrics:
    """What `Model.metrics` gives model code: register a metric once (by name), then update it."""

    def __init__(self, model: str, version: str) -> None:
        self._labels: Labels = (("model", model), ("version", version))

    def _register(self, name: str, kind: str, help_text: str, labelnames: Sequence[str],
                  buckets: Sequence[float]) -> ModelMetric:
        if not name.replace("_", "a").isalnum() or name[0].isdigit() or name.startswith("nv_"):
            raise ValueError(f"metric name {name!r}: use letters, digits and '_', not starting with a digit or nv_")
        with _MODEL_LOCK:
            metric = _MODEL_METRICS.get(name)
            if metric is None:
                metric = _MODEL_METRICS[name] = _UserMetric(name, kind, help_text, labelnames, buckets)
            elif metric.kind != kind or metric.labelnames[2:] != tuple(labelnames):
                raise ValueError(f"metric {name!r} is already registered as a {metric.kind} with labels "
                                 f"{list(metric.labelnames[2:])}")
        return ModelMetric(metric, self._labels)

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> ModelMetric:
        return self._register(name, "counter", help_text, labelnames, ())

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> ModelMetric:
        return self._register(name, "gauge", help_text, labelnames, ())

    def histogram(self, name: str, help_text: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = DEFAULT_BUCKETS) -> ModelMetric:
        return self._register(name, "histogram", help_text, labelnames, buckets)
