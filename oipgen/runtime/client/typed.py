"""Typed clients of one model: the machinery under the modules `oipgen client` renders from a model's metadata.

A rendered module holds the model's tables (name, version, inputs and outputs as (tensor name, Python name,
datatype, shape) with -1 for any size), its outputs dataclass, and a sync and an async client class whose `infer`
takes one keyword argument per input. Those classes build on `ModelClient` and `AsyncModelClient` here, over the
package's `RestClient` / `GrpcClient` or `AsyncRestClient` / `AsyncGrpcClient`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeAlias

import numpy as np

from .errors import InvalidArgument, ResponseError
from .tensors import InferResult

if TYPE_CHECKING:  # the clients of one transport only are needed at run time
    from .grpc import AsyncGrpcClient, GrpcClient
    from .rest import AsyncRestClient, RestClient

__all__ = ["AsyncModelClient", "ModelClient", "TensorSpec", "check_inputs", "output_arrays"]

TensorSpec: TypeAlias = tuple[str, str, str, tuple[int, ...]]
"""One tensor of the model: tensor name, Python name, datatype, shape (-1: any size)."""


def _shape(model: str, value: Any, argument: str) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        try:
            shape = np.shape(value)
        except ValueError as exc:
            raise InvalidArgument(f"{model}: argument {argument!r} has no shape: {exc}") from None
    return tuple(shape)


def check_inputs(model: str, inputs: Sequence[TensorSpec], values: Sequence[Any]) -> dict[str, Any]:
    """The request's inputs by tensor name, each shape checked against the declared one (InvalidArgument, before
    anything is sent)."""
    checked: dict[str, Any] = {}
    for (name, argument, _, declared), value in zip(inputs, values, strict=True):
        shape = _shape(model, value, argument)
        if len(shape) != len(declared) or any(d != -1 and d != s for d, s in zip(declared, shape, strict=False)):
            label = repr(name) if name == argument else f"{name!r} (argument {argument!r})"
            raise InvalidArgument(
                f"model {model!r}: input {label} has shape {list(shape)}, but the model takes {list(declared)} "
                "(-1: any size); nothing was sent"
            )
        checked[name] = value
    return checked


def output_arrays(model: str, outputs: Sequence[TensorSpec], result: InferResult) -> list[Any]:
    """The outputs of an inference result as numpy arrays, in the model's order; ResponseError when the answer
    lacks one."""
    missing = [name for name, _, _, _ in outputs if name not in result]
    if missing:
        raise ResponseError(f"the answer of model {model!r} lacks the output(s) {', '.join(map(repr, missing))}")
    return [result.as_numpy(name) for name, _, _, _ in outputs]


class ModelClient:
    """A client of one model (`_model`, set by the rendered class) over the package's `RestClient` or
    `GrpcClient`, asking for `version` ("": the server's choice). Close it, or use it as a context manager; that
    closes the underlying client."""

    _model: ClassVar[str]

    def __init__(self, client: RestClient | GrpcClient, *, version: str) -> None:
        self.client = client
        self.version = version

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.client!r}, version={self.version!r})"

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def ready(self) -> bool:
        """Whether the model (at `version`) is ready on the server."""
        return bool(self.client.model_ready(self._model, self.version).ready)


class AsyncModelClient:
    """An asyncio client of one model over the package's `AsyncRestClient` or `AsyncGrpcClient`; the same as
    `ModelClient`, with coroutines."""

    _model: ClassVar[str]

    def __init__(self, client: AsyncRestClient | AsyncGrpcClient, *, version: str) -> None:
        self.client = client
        self.version = version

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.client!r}, version={self.version!r})"

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def ready(self) -> bool:
        """Whether the model (at `version`) is ready on the server."""
        return bool((await self.client.model_ready(self._model, self.version)).ready)
