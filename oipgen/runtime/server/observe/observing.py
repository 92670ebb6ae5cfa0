"""What a data plane's inference is observed by, made in one place (`Observing.of`): the statistics extension,
the metrics (with `Settings.metrics`), tracing (when the OpenTelemetry environment turns it on: the composition
root configures it, `tracing_setup`), and all of them as the data plane's observers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..settings import Settings
from .events import Observers
from .metrics import Metrics
from .statistics import Statistics
from .tracing import Tracing

__all__ = ["Observing"]


@dataclass(frozen=True, slots=True)
class Observing:
    statistics: Statistics
    metrics: Metrics | None
    tracing: Tracing | None
    observers: Observers  # every one of the above that is on, statistics first

    @classmethod
    def of(cls, settings: Settings, inflight: Callable[[], Mapping[tuple[str, str], int]],
           tracing: Tracing | None = None) -> Observing:
        """The observers `settings` asks for; `inflight` tells the metrics the requests holding each model version
        (`ModelRepository.inflight`)."""
        statistics = Statistics()
        observers = Observers([statistics])
        metrics = Metrics(statistics, inflight, settings.metrics_buckets, observers.settled) if settings.metrics \
            else None
        for observer in (metrics, tracing):
            if observer is not None:
                observers.append(observer)
        return cls(statistics, metrics, tracing, observers)
