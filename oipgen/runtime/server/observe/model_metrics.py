"""Metrics of model code (`Model.metrics`): prometheus_client's Counter, Gauge and Histogram with the model's
`model` and `version` labels, registered once per process by name in `MODEL_REGISTRY`, which the server's metrics
collect (`metrics`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from ..settings import Settings

__all__ = ["DEFAULT_BUCKETS", "MODEL_REGISTRY", "ModelMetric", "ModelMetrics"]

DEFAULT_BUCKETS: Final = Settings().metrics_buckets


# Every model's metrics, in one registry: a metric is registered once per process, by name, whichever model or
# version registers it first; the server's registry collects this one.
MODEL_REGISTRY: Final = CollectorRegistry()
_MODEL_LOCK = threading.Lock()
_MODEL_METRICS: dict[str, tuple[str, tuple[str, ...], MetricWrapperBase]] = {}  # name: kind, label names, metric
_KINDS: Final[dict[str, type[MetricWrapperBase]]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}

M = TypeVar("M", Counter, Gauge, Histogram)


class ModelMetric(Generic[M]):
    """A model's prometheus_client metric, its `model` and `version` labels given: `labels(...)` gives the values
    of the label names it was registered with, and answers prometheus_client's own child (`inc`, `set`,
    `observe`, `time`...). A metric registered with no other label names is that child: `metric.inc()`."""

    def __init__(self, metric: M, name: str, model: str, version: str, names: tuple[str, ...]) -> None:
        self.metric: M = metric
        self.name = name
        self._model = model
        self._version = version
        self._names = names

    def labels(self, **values: str) -> M:
        """This metric with values for the other label names it was registered with."""
        if set(values) != set(self._names):
            raise ValueError(f"metric {self.name} takes the labels {list(self._names)}, got {sorted(values)}")
        return self.metric.labels(model=self._model, version=self._version, **values)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        if self._names:
            raise ValueError(f"metric {self.name} needs .labels({', '.join(self._names)}) before .{attribute}")
        return getattr(self.labels(), attribute)


class ModelMetrics:
    """What `Model.metrics` gives model code: register a metric once (by name), then update it."""

    def __init__(self, model: str, version: str) -> None:
        self._model = model
        self._version = version

    def _register(self, name: str, kind: str, help_text: str, labelnames: Sequence[str],
                  buckets: Sequence[float]) -> Any:
        if name.startswith(("nv_", "oip_")):
            raise ValueError(f"metric name {name!r}: nv_ and oip_ are the server's")
        names = tuple(labelnames)
        metric: MetricWrapperBase
        with _MODEL_LOCK:
            known = _MODEL_METRICS.get(name)
            if known is None:
                options: dict[str, Any] = {"buckets": buckets} if kind == "histogram" else {}
                metric = _KINDS[kind](name, help_text, ["model", "version", *names], registry=MODEL_REGISTRY,
                                      **options)
                _MODEL_METRICS[name] = (kind, names, metric)
            elif known[:2] != (kind, names):
                raise ValueError(f"metric {name!r} is already registered as a {known[0]} with labels "
                                 f"{list(known[1])}")
            else:
                metric = known[2]
        return ModelMetric(metric, name, self._model, self._version, names)

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> ModelMetric[Counter]:
        """A counter; exported as NAME_total, as prometheus_client names counters (a NAME ending _total is kept)."""
        return self._register(name, "counter", help_text, labelnames, ())  # type: ignore[no-any-return]

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> ModelMetric[Gauge]:
        return self._register(name, "gauge", help_text, labelnames, ())  # type: ignore[no-any-return]

    def histogram(self, name: str, help_text: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = DEFAULT_BUCKETS) -> ModelMetric[Histogram]:
        return self._register(name, "histogram", help_text, labelnames, buckets)  # type: ignore[no-any-return]
