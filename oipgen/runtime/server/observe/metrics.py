"""Prometheus metrics: Triton's inference metrics, latency histograms, request counts per transport, model metrics.

Served at `GET /metrics` on the REST port (and on `--metrics-port` if set) in Prometheus' text format, by
prometheus_client: its metric families, its registry and collectors, its exposition.

- Triton's names and meanings, labels `model` and `version`: `nv_inference_request_success`,
  `nv_inference_request_failure` (and its `reason`: REJECTED for a request refused by validation, BACKEND for a
  model failure, CANCELED for a caller that went away, OTHER otherwise), `nv_inference_count`,
  `nv_inference_exec_count`, `nv_inference_pending_request_count`, and the cumulative microsecond counters
  `nv_inference_request_duration_us`, `nv_inference_queue_duration_us` and
  `nv_inference_compute_{input,infer,output}_duration_us`. As Triton, every model version that is loaded has them
  all, at zero until it serves. They are read from the statistics extension at scrape time
  (`statistics.Statistics`, fed by the same inference timer), so both always agree: a duration in microseconds is
  the statistics' nanoseconds // 1000.
- `nv_inference_request_duration_seconds` (a histogram of request durations) and
  `nv_inference_first_response_histogram_ms` (time to a decoupled model's first response), buckets configurable.
- `oip_requests_total{transport, operation, code}`: every request of every operation, by transport (rest, grpc)
  and answer (the HTTP status, or the gRPC code's name).
- Metrics of model code (`Model.metrics`, `model_metrics`): prometheus_client's Counter, Gauge and Histogram,
  with the model's `model` and `version` labels.
- The process's, as every prometheus_client application exports them: `process_cpu_seconds_total`,
  `process_resident_memory_bytes`, open file descriptors, start time, `python_info`, `python_gc_*`.

Triton's counters are named without the `_total` suffix that prometheus_client gives every counter it writes, and
dashboards built for Triton query those names: they are prometheus_client families whose samples keep Triton's
names, and `render` writes their HELP and TYPE lines under the same names.

A request costs the hot path one dictionary update in the calling thread's own counts (its answer) and no lock
of the metrics: its end and its duration's bucket are counted by the statistics, under the lock they take anyway,
and the scrape reads pending requests from the model repository, which counts the requests holding each model. With
`--workers N` a scrape answered by any worker is the sum over the workers: it asks the others for their samples
(`cluster`) and adds them up, sample by sample (a gauge is summed too: the workers' memory), but for a start time
(the earliest) and what is the same in each (`process_max_fds`, `python_info`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from ..errors import ErrorKind
from .events import InferenceRecord, Observer, ignore
from .model_metrics import DEFAULT_BUCKETS, MODEL_REGISTRY
from .statistics import Statistics

__all__ = ["CONTENT_TYPE", "DEFAULT_BUCKETS", "Metric", "Metrics", "from_json", "merge", "render", "to_json"]

# The text format Triton serves, and generate_latest writes.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

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
_FAILURE: Final = "nv_inference_request_failure"

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
# Counters named as Triton names them: no `_total`, on the family or its samples.
_TRITON_COUNTERS: Final = frozenset([*(name for name, *_ in _COUNTERS), _FAILURE])
# The HELP and TYPE lines prometheus_client writes for them (`render`), up to the `_total` it adds.
_TRITON_HEADS: Final = re.compile(
    rb"^(# (?:HELP|TYPE) (?:" + b"|".join(re.escape(n.encode()) for n in sorted(_TRITON_COUNTERS)) + rb"))_total(?= )",
    re.MULTILINE,
)
# How the samples of the workers add up, where not summed.
_ACROSS_WORKERS: Final[dict[str, Callable[[float, float], float]]] = {
    "process_start_time_seconds": min,  # the server started when its first worker did
    "process_max_fds": max,  # a limit, each worker's own
    "python_info": max,  # the same interpreter in each
}


# --- families: a scrape's answer, a worker's share of it, the text ------------------------------------------------


def to_json(metric: Metric) -> list[Any]:
    """A family as JSON (what a worker sends the one answering a scrape)."""
    return [metric.name, metric.type, metric.documentation, [[s.name, s.labels, s.value] for s in metric.samples]]


def from_json(doc: list[Any]) -> Metric:
    metric = Metric(str(doc[0]), str(doc[2]), str(doc[1]))
    for sample, labels, value in doc[3]:
        metric.add_sample(str(sample), {str(k): str(v) for k, v in labels.items()}, float(value))
    return metric


def merge(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """Families of several processes as one: samples with the same name and labels add up (`_ACROSS_WORKERS`
    says where they combine otherwise)."""
    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for metrics in groups:
        for metric in metrics:
            if metric.name not in families:
                families[metric.name] = Metric(metric.name, metric.documentation, metric.type)
                sums[metric.name] = {}
            family = sums[metric.name]
            combine = _ACROSS_WORKERS.get(metric.name, float.__add__)
            for sample in metric.samples:
                key = (sample.name, tuple(sample.labels.items()))
                value = float(sample.value)
                family[key] = combine(family[key], value) if key in family else value
    for name, metric in families.items():
        for (sample_name, labels), value in sums[name].items():
            metric.add_sample(sample_name, dict(labels), value)
    return list(families.values())


class _Families:
    """Families already collected, as prometheus_client's exposition takes them (anything with `collect`)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus' text exposition format (version 0.0.4), written by prometheus_client, families by name."""
    ordered = sorted(metrics, key=lambda m: m.name)
    # prometheus_client heads every counter family NAME_total; Triton's counters and their samples are NAME. Only
    # the comment lines are renamed: a label value may hold any text (a model's name), never a line's start.
    return _TRITON_HEADS.sub(rb"\1", generate_latest(_Families(ordered)))


def _without_created(metrics: Iterable[Metric]) -> list[Metric]:
    """The families without prometheus_client's `_created` samples (Triton's exposition has none). Each collect
    makes new families, so they are filtered in place."""
    out = list(metrics)
    for metric in out:
        created = metric.name + "_created"
        metric.samples = [s for s in metric.samples if s.name != created]
    return out


# --- the server's metrics -----------------------------------------------------------------------------------------


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
    """The server's metrics: an observer of the inference timer, and the counts the transports report; a
    prometheus_client collector of them, in a registry with the models' own metrics (`registry`).

    A request costs the hot path little, and takes no lock of the metrics: each thread counts in its own
    dictionaries (`_Shard`), a scrape adds them up. A request's end, and its duration in the latency histogram, are
    counted by the statistics (`Statistics.keep_durations`), under the lock they take anyway; a transport counts
    its answer (`count`). The pending requests of a model version are those holding it in the model repository
    (`inflight`: `ModelRepository.inflight`), which also tells which model versions are loaded. Labels are made at
    scrape time, once every request answered so far is recorded (`settled`: `Observers.settled`).
    """

    def __init__(self, statistics: Statistics, inflight: Callable[[], Mapping[tuple[str, str], int]],
                 buckets: Sequence[float] = DEFAULT_BUCKETS, settled: Callable[[], None] | None = None) -> None:
        self.statistics = statistics
        self.inflight = inflight
        self.settled = settled
        self.failures: dict[tuple[str, str, str], int] = {}  # (model, version, reason)
        self._lock = threading.Lock()  # failures, the list of shards
        self._local = threading.local()  # .shard: this thread's
        self._shards: list[_Shard] = []
        self._ended = _Shard(threading.current_thread())  # the counts of threads that ended
        self._bounds = statistics.keep_durations(buckets)
        self.first_response = Histogram(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to the first response of a decoupled model, in milliseconds",
            ["model", "version"], buckets=[b * 1000.0 for b in self._bounds], registry=None,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.registry.register(self.first_response)
        self.registry.register(MODEL_REGISTRY)
        ProcessCollector(registry=self.registry)  # the process's CPU, memory, file descriptors, start time
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_*

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
    def pending(self) -> dict[tuple[tuple[str, str], ...], int]:
        """The requests of each loaded model version that started and did not finish yet, by labels (those holding
        the model in the repository: a request costs the metrics nothing at its start)."""
        if self.settled is not None:
            self.settled()
        return {(("model", model), ("version", version)): n for (model, version), n in self.inflight().items()}

    # --- the inference timer ------------------------------------------------------------------------------------

    def request_finished(self, record: InferenceRecord) -> None:
        # The statistics count the request's end and its duration; what they do not tell is counted here.
        if record.error is not None:
            failure = (record.model, record.version, REASONS.get(record.error.kind, "OTHER"))
            with self._lock:
                self.failures[failure] = self.failures.get(failure, 0) + 1
        elif record.first_response_ns is not None:
            self.first_response.labels(record.model, record.version).observe(record.first_response_ns / 1e6)

    def request_ran_alone(self, record: InferenceRecord) -> None:
        # Model runs are not counted here (nv_inference_exec_count: the statistics), nor a plain success.
        if record.first_response_ns is not None:
            self.request_finished(record)

    # A success of the lean way: nothing here (no first response; the statistics count the rest).
    ran_alone = ignore
    ran_in_batch = ignore

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

    def families(self) -> list[Metric]:
        """Every metric of this process (a worker's own, with --workers): this registry's families."""
        return _without_created(self.registry.collect())

    def collect(self) -> list[Metric]:
        """The server's own families (prometheus_client's collector interface)."""
        if self.settled is not None:
            self.settled()
        stats = self.statistics.snapshot()
        loaded = self.inflight()
        versions = sorted({*stats, *loaded})  # as Triton: a loaded model version has its samples from the start
        families: list[Metric] = []
        for name, help_text, source, what in _COUNTERS:
            family = Metric(name, help_text, "counter")
            for model, version in versions:
                value = stats.get((model, version), {}).get(source, 0)
                if isinstance(value, tuple):  # (count, ns)
                    value = value[0] if what == "count" else value[1] // 1000
                family.add_sample(name, {"model": model, "version": version}, float(value))
            families.append(family)
        with self._lock:
            failures = dict(self.failures)
        failure = Metric(_FAILURE, "Number of failed inference requests, all batch sizes", "counter")
        for model, version in sorted({*versions, *((m, v) for m, v, _ in failures)}):
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                failure.add_sample(_FAILURE, {"model": model, "version": version, "reason": reason},
                                   float(failures.get((model, version, reason), 0)))
        families.append(failure)
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per model",
                                    labels=["model", "version"])
        for model, version in versions:
            pending.add_metric([model, version], float(loaded.get((model, version), 0)))
        families.append(pending)
        duration = HistogramMetricFamily("nv_inference_request_duration_seconds",
                                         "Inference request duration in seconds (successful requests)",
                                         labels=["model", "version"])
        for (model, version), row in sorted(self.statistics.durations().items()):
            buckets, running = [], 0.0  # the statistics keep a count per bucket, then +Inf's, then the sum
            for bound, count in zip([*self._bounds, float("inf")], row[:-1], strict=True):
                running += count
                buckets.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
            duration.add_metric([model, version], buckets, row[-1])
        families.append(duration)
        requests = CounterMetricFamily("oip_requests", "Requests answered, by transport, operation and answer",
                                       labels=["code", "operation", "transport"])
        for (transport, operation, code), n in sorted(self.requests.items()):
            requests.add_metric([code, operation, transport], float(n))
        families.append(requests)
        return families
