"""The statistics extension: per model version, what the data plane measured while it served requests.

One `Statistics` registry per data plane (`DataPlane.statistics`) holds a `ModelStats` per (model, version). It
is an observer of the inference pipeline (`events.Observer`): every finished request's record (its phases, timed
by the pipeline's one timer) is counted with `record_request`, every run of a model (one per request, or one per
batch when requests are batched) with `record_execution`. The counters follow Triton's statistics extension:

- `success` counts successful requests and their total time in the data plane; `fail` the failed ones (requests
  for a model version that exists and is ready, failing validation, in the model or in its outputs).
- `queue`, `compute_input`, `compute_infer` and `compute_output` count successful requests and the time of each
  phase: waiting to run, preparing and validating the inputs, the model itself, and checking and converting its
  outputs (decoding and encoding the wire format is the transports' work and is not included).
- `inference_count` adds the batch size of every successful request, `execution_count` counts model runs;
  `batch_stats` times the runs per batch size; `last_inference` is the end of the last successful request, in
  milliseconds since the Unix epoch.

Counters only grow while the server runs (they survive a model reload). Every update takes a lock, so recording
from worker threads is safe.

With metrics on, each model version also keeps the histogram of its successful requests' durations in seconds
(`Statistics.keep_durations`, `ModelStats.durations`): counted with `success` under the same lock, so the metrics'
latency histogram (`metrics.Metrics`) costs a request no call of its own and always agrees with the statistics.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...grpc import grpc_service_pb2 as pb
from .events import ExecutionRecord, InferenceRecord, Observer, Timer, phases_of

__all__ = ["BatchStats", "Duration", "ModelStats", "Statistics"]


@dataclass(slots=True)
class Duration:
    """How many times something happened and how long it took in all, in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, int(ns))

    def to_proto(self) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass(slots=True)
class BatchStats:
    """The model runs at one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """The statistics of one model version."""

    __slots__ = (
        "_lock", "batches", "bounds", "compute_infer", "compute_input", "compute_output", "durations",
        "execution_count", "fail", "inference_count", "last_inference", "name", "queue", "success", "version",
    )

    def __init__(self, name: str, version: str, bounds: Sequence[float] | None = None) -> None:
        self.name = name
        self.version = version
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference = 0  # ms since the Unix epoch; 0: never
        self.batches: dict[int, BatchStats] = {}
        # The histogram of successful requests' durations (seconds) when `bounds` (sorted upper bounds) are given:
        # a count per bound, one for +Inf, then the sum; made on the first success.
        self.bounds = bounds
        self.durations: list[float] | None = None
        self._lock = threading.Lock()

    def record_request(
        self,
        success: bool,
        batch_size: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        total_ns: int,
    ) -> None:
        """One finished request: its outcome, batch size (1 for a model that does not batch) and phase times.
        A failed request counts only in `fail`, with its total time."""
        if not success:
            with self._lock:
                self.fail.add(total_ns)
            return
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._add_request(batch_size, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns, total_ns,
                              now_ms)

    def record_alone(
        self, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int, total_ns: int
    ) -> None:
        """A successful request of batch size 1 that ran the model alone: `record_request` and
        `record_execution` at once (the same counts, under one lock)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._add_request(1, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns, total_ns, now_ms)
            self._add_execution(1, compute_input_ns, compute_infer_ns, compute_output_ns)

    def record_execution(
        self, batch_size: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One run of the model over `batch_size` items (the sum of the batch sizes of the requests it served)."""
        with self._lock:
            self._add_execution(batch_size, compute_input_ns, compute_infer_ns, compute_output_ns)

    # Every request passes through these, under the lock: the counters are added to in place (`Duration.add`
    # costs a call each).
    def _add_request(self, batch_size: int, queue_ns: int, compute_input_ns: int, compute_infer_ns: int,
                     compute_output_ns: int, total_ns: int, now_ms: int) -> None:
        succeeded, queue, compute_input = self.success, self.queue, self.compute_input
        compute_infer, compute_output = self.compute_infer, self.compute_output
        # A duration is never negative (two threads' readings of the clock may cross): a comparison, not max().
        succeeded.count += 1
        succeeded.ns += total_ns if total_ns > 0 else 0
        queue.count += 1
        queue.ns += queue_ns if queue_ns > 0 else 0
        compute_input.count += 1
        compute_input.ns += compute_input_ns if compute_input_ns > 0 else 0
        compute_infer.count += 1
        compute_infer.ns += compute_infer_ns if compute_infer_ns > 0 else 0
        compute_output.count += 1
        compute_output.ns += compute_output_ns if compute_output_ns > 0 else 0
        self.inference_count += batch_size
        if now_ms > self.last_inference:
            self.last_inference = now_ms
        bounds = self.bounds
        if bounds is not None:
            seconds = total_ns / 1e9
            durations = self.durations
            if durations is None:
                durations = self.durations = [0.0] * (len(bounds) + 2)
            durations[bisect.bisect_left(bounds, seconds)] += 1
            durations[-1] += seconds

    def _add_execution(self, batch_size: int, compute_input_ns: int, compute_infer_ns: int,
                       compute_output_ns: int) -> None:
        self.execution_count += 1
        batch = self.batches.get(batch_size)
        if batch is None:
            batch = self.batches[batch_size] = BatchStats()
        compute_input, compute_infer = batch.compute_input, batch.compute_infer
        compute_output = batch.compute_output
        compute_input.count += 1
        compute_input.ns += compute_input_ns if compute_input_ns > 0 else 0
        compute_infer.count += 1
        compute_infer.ns += compute_infer_ns if compute_infer_ns > 0 else 0
        compute_output.count += 1
        compute_output.ns += compute_output_ns if compute_output_ns > 0 else 0

    def to_proto(self) -> pb.ModelStatistics:
        """The `inference.ModelStatistics` message, every duration present (zero counts included)."""
        with self._lock:
            return pb.ModelStatistics(
                name=self.name,
                version=self.version,
                last_inference=self.last_inference,
                inference_count=self.inference_count,
                execution_count=self.execution_count,
                inference_stats=pb.InferStatistics(
                    success=self.success.to_proto(),
                    fail=self.fail.to_proto(),
                    queue=self.queue.to_proto(),
                    compute_input=self.compute_input.to_proto(),
                    compute_infer=self.compute_infer.to_proto(),
                    compute_output=self.compute_output.to_proto(),
                    cache_hit=pb.StatisticDuration(),  # no response cache: always zero
                    cache_miss=pb.StatisticDuration(),
                ),
                batch_stats=[
                    pb.InferBatchStatistics(
                        batch_size=size,
                        compute_input=batch.compute_input.to_proto(),
                        compute_infer=batch.compute_infer.to_proto(),
                        compute_output=batch.compute_output.to_proto(),
                    )
                    for size, batch in sorted(self.batches.items())
                ],
            )

    def __repr__(self) -> str:
        return (
            f"<ModelStats {self.name!r} version {self.version!r}: {self.success.count} succeeded, "
            f"{self.fail.count} failed, {self.execution_count} executions>"
        )


class Statistics(Observer):
    """The statistics of every model version the data plane has served, by (name, version)."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str], ModelStats] = {}
        self._lock = threading.Lock()
        self._bounds: list[float] | None = None

    def keep_durations(self, buckets: Sequence[float]) -> list[float]:
        """From now on, keep each model version's histogram of successful request durations, in seconds, with
        these bucket bounds; returns them sorted (without duplicates), as `ModelStats.durations` counts them."""
        with self._lock:
            self._bounds = sorted(set(buckets))
            for stats in self._models.values():
                with stats._lock:
                    stats.bounds, stats.durations = self._bounds, None
            return self._bounds

    def for_model(self, name: str, version: str) -> ModelStats:
        """The statistics of `name` at `version`, created (all zero) on first use."""
        stats = self._models.get((name, version))
        if stats is None:
            with self._lock:
                stats = self._models.setdefault((name, version), ModelStats(name, version, self._bounds))
        return stats

    def get(self, name: str, version: str) -> ModelStats | None:
        """The statistics of `name` at `version`, None when it never served a request."""
        return self._models.get((name, version))

    def snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every model version's counters, by (name, version): `(count, ns)` for each duration (success, fail,
        queue, compute_input, compute_infer, compute_output), and inference_count and execution_count."""
        with self._lock:
            models = list(self._models.items())
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for key, stats in models:
            with stats._lock:
                out[key] = {
                    name: (getattr(stats, name).count, getattr(stats, name).ns)
                    for name in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
                }
                out[key]["inference_count"] = stats.inference_count
                out[key]["execution_count"] = stats.execution_count
        return out

    def durations(self) -> dict[tuple[str, str], list[float]]:
        """A copy of every kept histogram of request durations (`keep_durations`), by (name, version): a model
        version with no successful request yet has none."""
        with self._lock:
            models = list(self._models.items())
        out: dict[tuple[str, str], list[float]] = {}
        for key, stats in models:
            with stats._lock:
                if stats.durations is not None:
                    out[key] = list(stats.durations)
        return out

    def to_proto(self, name: str, version: str) -> pb.ModelStatistics:
        """The `inference.ModelStatistics` of `name` at `version` (all zero when it never served a request)."""
        stats = self.get(name, version)
        return stats.to_proto() if stats is not None else ModelStats(name, version).to_proto()

    def request_finished(self, record: InferenceRecord) -> None:
        self.for_model(record.model, record.version).record_request(
            record.ok, record.batch_size, record.queue_ns, record.compute_input_ns, record.compute_infer_ns,
            record.compute_output_ns, record.total_ns,
        )

    def execution_finished(self, record: ExecutionRecord) -> None:
        self.for_model(record.model, record.version).record_execution(
            record.batch_size, record.compute_input_ns, record.compute_infer_ns, record.compute_output_ns
        )

    def request_ran_alone(self, record: InferenceRecord) -> None:
        stats = self.for_model(record.model, record.version)
        stats.record_execution(
            record.batch_size, record.compute_input_ns, record.compute_infer_ns, record.compute_output_ns
        )
        stats.record_request(
            True, record.batch_size, record.queue_ns, record.compute_input_ns, record.compute_infer_ns,
            record.compute_output_ns, record.total_ns,
        )

    def ran_alone(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                  started: int, ended: int, done: int) -> None:
        # The moments as they are: no record made (the lean gRPC way's success).
        # positional: keywords cost the call a dict
        self.for_model(model, version).record_alone(started - queued, queued - start, ended - started, done - ended,
                                                    done - start)

    def ran_in_batch(self, timer: Timer | None, model: str, version: str, request_id: str, start: int, queued: int,
                     formed: int, started: int, ended: int, done: int, batch_size: int) -> None:
        # The moments as they are: no record made (a request of a dynamic batch on the lean way; its batch's run is
        # counted by `execution_finished`).
        self.for_model(model, version).record_request(
            True, batch_size, *phases_of(start, queued, formed, started, ended, done))
