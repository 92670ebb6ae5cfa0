"""The model API: subclass `Model`, declare its tensors with `TensorSpec`, and implement `infer`.

```python
from oip.server import Model, TensorSpec  # the generated package, under whatever name it has


class AddSub(Model):
    platform = "numpy"
    inputs = (TensorSpec("INPUT0", "INT32", [1, 16]), TensorSpec("INPUT1", "INT32", [1, 16]))
    outputs = (TensorSpec("OUTPUT0", "INT32", [1, 16]), TensorSpec("OUTPUT1", "INT32", [1, 16]))

    def infer(self, inputs, parameters):
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}
```

`load`, `unload` and `infer` may each be a plain method or a coroutine. Plain methods run in a worker thread
(`asyncio.to_thread`), so a model that computes for a while never stalls the server's event loop; coroutines run
on the loop itself and must not block it.

The server validates every request against the declared tensors before `infer` runs: `inputs` holds exactly
the declared inputs, each a numpy array of the declared datatype (an object array of `bytes` for BYTES) whose
shape matches the declared one (-1 matches any size). Arrays may be read-only views of the request's bytes:
copy one before writing into it.

A model that batches (`max_batch_size > 0`) declares its tensors WITHOUT the batch dimension, as Triton's model
configuration does: `TensorSpec("INPUT0", "FP32", [16])` with `max_batch_size = 8` accepts requests of shape
[b, 16] for 1 <= b <= 8 (every input with the same b), its metadata reports [-1, 16], and `infer` receives and
returns arrays with the batch dimension first. With `max_batch_size = 0` (the default) shapes are full shapes.
`dynamic_batching = DynamicBatching(...)` lets the server merge concurrent requests into one call; `decoupled =
True` declares a model that may answer a request with several responses (over streaming). An output declared
with `labels` names its classes for the classification extension (index i is `labels[i]`).

`infer` returns a mapping from output name to array (or anything `numpy.asarray` accepts), optionally with
response parameters as `(outputs, parameters)`. Each output is converted to its declared datatype when no value
changes meaning (int64 values that fit into INT32, whole floats into integers; floats may round to a narrower
float); otherwise, or when its shape differs from the declared one, the request fails with a model failure
naming the output. An exception raised by the model becomes a model failure (HTTP 500 / INTERNAL) carrying
`str(exc)`, never a traceback; raise `InvalidRequest` (from `errors`) to report bad input values instead.

With dynamic batching, `infer` gets the rows of several requests concatenated on the first axis (requests with
the same shapes after the batch dimension and the same parameters) and must return outputs whose first dimension
is the total: each request gets its own rows back. A decoupled model's `infer` is a generator, plain or async,
yielding what `infer` returns, once per response (zero, one or many per request):

```python
class Tokens(Model):
    decoupled = True
    inputs = (TensorSpec("PROMPT", "BYTES", [1]),)
    outputs = (TensorSpec("TOKEN", "BYTES", [1]),)

    async def infer(self, inputs, parameters):
        for word in inputs["PROMPT"][0].split():
            yield {"TOKEN": [word]}
```

Its responses go out over the gRPC stream (`ModelStreamInfer`) as it yields them; ModelInfer and REST refuse a
decoupled model, as Triton does. A plain generator advances in a worker thread, an async one on the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy.typing as npt

from .. import datatypes

if TYPE_CHECKING:
    from .observe.model_metrics import ModelMetrics

__all__ = ["DynamicBatching", "InferResult", "Model", "TensorSpec", "call_hook", "check_model"]

InferResult: TypeAlias = (
    Mapping[str, npt.ArrayLike] | tuple[Mapping[str, npt.ArrayLike], Mapping[str, bool | int | float | str]]
)
"""What `Model.infer` returns: outputs by name, or `(outputs, response_parameters)`."""


@dataclass(frozen=True, slots=True, init=False)
class TensorSpec:
    """A declared input or output: its name, datatype ("FP32", "BYTES"...) and shape (-1: any size), without the
    batch dimension for a model that batches. `labels` (outputs only) names the classes of the classification
    extension: the label of index i is `labels[i]`."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    labels: tuple[str, ...]

    def __init__(
        self, name: str, datatype: str, shape: Sequence[int], labels: Sequence[str] | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tensor name must be a non-empty string, got {name!r}")
        if not isinstance(datatype, str) or datatypes.get(datatype) is None:
            raise ValueError(
                f"tensor '{name}': unknown datatype {datatype!r}; valid datatypes: {', '.join(datatypes.NAMES)}"
            )
        if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
            raise ValueError(f"tensor '{name}': shape must be a list of integers, got {shape!r}")
        dims = tuple(shape)
        for dim in dims:
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < -1:
                raise ValueError(
                    f"tensor '{name}': shape {list(dims)} is invalid: dimensions are integers >= 0, or -1 for any size"
                )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "datatype", datatype)
        object.__setattr__(self, "shape", tuple(int(d) for d in dims))
        if labels is None:
            labels = ()
        if isinstance(labels, str | bytes) or not isinstance(labels, Iterable):
            raise ValueError(f"tensor '{name}': labels must be a list of strings, got {labels!r}")
        names = tuple(labels)
        for label in names:
            if not isinstance(label, str):
                raise ValueError(f"tensor '{name}': labels must be strings, got {label!r}")
        object.__setattr__(self, "labels", names)

    @classmethod
    def of(cls, value: TensorSpec | Mapping[str, Any]) -> TensorSpec:
        """A TensorSpec from itself or from a mapping `{"name": ..., "datatype": ..., "shape": [...]}` (and
        optionally `"labels": [...]`)."""
        if isinstance(value, TensorSpec):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"name", "datatype", "shape", "labels"}
            if unknown:
                raise ValueError(
                    f"unknown tensor keys {sorted(unknown)}; a tensor has name, datatype, shape and optionally labels"
                )
            return cls(value.get("name", ""), value.get("datatype", ""), value.get("shape", ()), value.get("labels"))
        raise ValueError(f"a tensor is a TensorSpec or a mapping of name, datatype and shape, got {value!r}")


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """Dynamic batching of a model that batches: the server merges concurrent requests into one `infer` call of
    at most `max_batch_size` items, waiting at most `max_queue_delay_microseconds` for a batch to fill, and
    preferring the batch sizes in `preferred_batch_size`. Reported in the model configuration as Triton's
    `dynamic_batching`."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()

    @classmethod
    def of(cls, value: DynamicBatching | Mapping[str, Any]) -> DynamicBatching:
        """A DynamicBatching from itself or from a mapping (a model.toml `[dynamic_batching]` table)."""
        if isinstance(value, DynamicBatching):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"dynamic_batching must be a table of settings, got {value!r}")
        unknown = set(value) - {"max_queue_delay_microseconds", "preferred_batch_size"}
        if unknown:
            raise ValueError(
                f"unknown dynamic_batching keys {sorted(unknown)}; known keys: max_queue_delay_microseconds, "
                "preferred_batch_size"
            )
        delay = value.get("max_queue_delay_microseconds", 0)
        sizes = value.get("preferred_batch_size", ())
        if isinstance(sizes, str | bytes) or not isinstance(sizes, Iterable):
            raise ValueError(f"dynamic_batching.preferred_batch_size must be a list of integers, got {sizes!r}")
        return cls(delay, tuple(sizes))


class Model:
    """A servable model: name, tensors and the `load` / `infer` / `unload` hooks.

    Declare `name`, `platform`, `inputs`, `outputs`, `max_batch_size`, `dynamic_batching`, `decoupled` and
    `properties` as class attributes or pass them to the constructor (which wins). With `max_batch_size = 0`
    shapes are full tensor shapes and metadata reports them as declared; a model that batches declares them
    without the batch dimension and metadata reports [-1, *shape]. `settings` holds the `[parameters]` table of the
    model's `model.toml` (or what the caller passes), `path` its folder, `version` the version it serves.

    A plain `infer` runs in a worker thread, so that it never holds up the server. A model whose plain `infer` is
    quick (microseconds) and never blocks can set `inline = True`: it is then called on the thread that has the
    request, the event loop for REST and streams, grpcio's polling thread for unary gRPC inference (no pool thread,
    no worker slot), which saves the hops to other threads (about 50 us of CPU per request here); under dynamic
    batching, on the thread that completes a batch (or the batcher's timer thread, once a batch's delay ran out).
    While it runs, that thread serves nothing else: a slow inline model holds up every other request of its
    transport.
    """

    name: str = ""
    inline: bool = False
    platform: str = "python"
    inputs: Sequence[TensorSpec] = ()
    outputs: Sequence[TensorSpec] = ()
    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    decoupled: bool = False
    properties: Mapping[str, str] = MappingProxyType({})

    version: str
    settings: dict[str, Any]
    path: Path | None

    def __init__(
        self,
        name: str | None = None,
        *,
        version: str = "1",
        settings: Mapping[str, Any] | None = None,
        path: Path | None = None,
        platform: str | None = None,
        inputs: Sequence[TensorSpec | Mapping[str, Any]] | None = None,
        outputs: Sequence[TensorSpec | Mapping[str, Any]] | None = None,
        max_batch_size: int | None = None,
        properties: Mapping[str, str] | None = None,
        dynamic_batching: DynamicBatching | Mapping[str, Any] | None = None,
        decoupled: bool | None = None,
    ) -> None:
        cls = type(self)
        self.name = name if name is not None else (cls.name or cls.__name__)
        self.version = version
        self.settings = dict(settings or {})
        self.path = path
        self.platform = platform if platform is not None else cls.platform
        self.inputs = tuple(TensorSpec.of(t) for t in (inputs if inputs is not None else cls.inputs))
        self.outputs = tuple(TensorSpec.of(t) for t in (outputs if outputs is not None else cls.outputs))
        self.max_batch_size = max_batch_size if max_batch_size is not None else cls.max_batch_size
        self.properties = dict(properties if properties is not None else cls.properties)
        batching = dynamic_batching if dynamic_batching is not None else cls.dynamic_batching
        self.dynamic_batching = DynamicBatching.of(batching) if batching is not None else None
        self.decoupled = decoupled if decoupled is not None else cls.decoupled
        check_model(self)

    @property
    def metrics(self) -> ModelMetrics:
        """The model's own metrics, exported at /metrics with its `model` and `version` labels:
        `self.metrics.counter("tokens", "Tokens generated").inc(n)`, `.gauge(...)`, `.histogram(...)`; extra label
        names are given when registering and their values with `.labels(...)`. Register once (in `load`, say):
        the same name gives the same metric."""
        from .observe.model_metrics import ModelMetrics

        return ModelMetrics(self.name, self.version)

    def load(self) -> Awaitable[None] | None:
        """Prepare the model (read weights, warm up). Raise to report the failure: the version becomes
        UNAVAILABLE with `str(exc)` as its reason, and the server keeps serving the other models."""
        return None

    def unload(self) -> Awaitable[None] | None:
        """Release what `load` acquired. Errors are logged and otherwise ignored."""
        return None

    def infer(
        self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]
    ) -> InferResult | Awaitable[InferResult]:
        """Compute the outputs from `inputs` (validated numpy arrays by input name) and the request's
        `parameters` (bool, int, float or str values by key)."""
        raise NotImplementedError(f"model '{self.name}' does not implement infer()")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} version {self.version!r}>"


def check_model(model: Model) -> None:
    """Raise ValueError unless the model's declarations are well-formed (the repository checks this again
    after `load`, which may set them)."""
    if not isinstance(model.name, str) or not model.name or "/" in model.name:
        raise ValueError(f"a model name is a non-empty string without '/', got {model.name!r}")
    if not isinstance(model.version, str) or not model.version or "/" in model.version:
        raise ValueError(f"model '{model.name}': a version is a non-empty string without '/', got {model.version!r}")
    if not isinstance(model.platform, str):
        raise ValueError(f"model '{model.name}': platform must be a string, got {model.platform!r}")
    if isinstance(model.max_batch_size, bool) or not isinstance(model.max_batch_size, int) or model.max_batch_size < 0:
        raise ValueError(f"model '{model.name}': max_batch_size must be an integer >= 0, got {model.max_batch_size!r}")
    if not isinstance(model.decoupled, bool):
        raise ValueError(f"model '{model.name}': decoupled must be a boolean, got {model.decoupled!r}")
    _check_batching(model)
    for kind, specs in (("input", model.inputs), ("output", model.outputs)):
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec, TensorSpec):
                raise ValueError(f"model '{model.name}': {kind}s must be TensorSpec objects, got {spec!r}")
            if spec.name in seen:
                raise ValueError(f"model '{model.name}': {kind} '{spec.name}' is declared twice")
            if kind == "input" and spec.labels:
                raise ValueError(f"model '{model.name}': input '{spec.name}' has labels; only outputs have labels")
            seen.add(spec.name)
    for key, value in model.properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"model '{model.name}': properties map strings to strings, got {key!r}: {value!r}")


def _check_batching(model: Model) -> None:
    batching = model.dynamic_batching
    if batching is None:
        return
    if not isinstance(batching, DynamicBatching):
        raise ValueError(f"model '{model.name}': dynamic_batching must be a DynamicBatching, got {batching!r}")
    if model.max_batch_size < 1:
        raise ValueError(
            f"model '{model.name}': dynamic_batching needs max_batch_size >= 1 (the largest batch to form)"
        )
    delay = batching.max_queue_delay_microseconds
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(
            f"model '{model.name}': dynamic_batching.max_queue_delay_microseconds must be an integer >= 0, "
            f"got {delay!r}"
        )
    for size in batching.preferred_batch_size:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= model.max_batch_size:
            raise ValueError(
                f"model '{model.name}': dynamic_batching.preferred_batch_size entries must be integers from 1 to "
                f"max_batch_size ({model.max_batch_size}), got {size!r}"
            )


async def call_hook(
    hook: Callable[..., Any], *args: Any, on_start: Callable[[int], object] | None = None
) -> tuple[Any, int, int]:
    """Call a model hook (`load`, `unload`, `infer`): a coroutine function on the event loop, anything else in a
    worker thread. What it returned, and when it started and ended (`time.perf_counter_ns`; the wait for a worker
    thread comes before the start). `on_start` is told the start as it happens (in the worker thread for a plain
    hook), so that it is known even when the hook fails."""
    if inspect.iscoroutinefunction(hook):
        started = time.perf_counter_ns()
        if on_start is not None:
            on_start(started)
        result = await hook(*args)
    else:
        marks: list[int] = []

        def call() -> Any:
            marks.append(time.perf_counter_ns())
            if on_start is not None:
                on_start(marks[0])
            return hook(*args)

        result = await asyncio.to_thread(call)
        started = marks[0]
        if inspect.isawaitable(result):  # a plain function that returned an awaitable
            result = await result
    return result, started, time.perf_counter_ns()
