"""Calling a model's `infer`: where it may run, the slots its plain calls share, and what its exceptions become.

A plain `infer` runs in a worker thread, one of `Settings.model_threads` slots (`Slots`) shared by every way a
request takes (the event loop's worker threads, the gRPC threads); a coroutine on the event loop. An exception the
model raises (not an `OipError`) becomes MODEL_FAILURE with its message (`model_error`), logged here with its
traceback, which never goes on the wire.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import weakref
from collections.abc import Callable
from typing import Any

import numpy.typing as npt

from ..errors import ModelFailure, OipError
from ..model import Model
from ..observe.logs import REPEATS_AS
from .batching import is_batching

__all__ = ["Slots", "call_in_thread", "is_plain", "model_error", "runs_alone", "set_model_threads"]

log = logging.getLogger(__name__)


def set_model_threads(loop: asyncio.AbstractEventLoop, threads: int) -> None:
    """Give `loop` a default executor of exactly `threads` worker threads, where plain `infer` methods run
    (`model.call_hook`): as many as the slots that may run at once, the instance count the model configuration
    extension reports. Whoever owns the loop calls it once, before serving (a server process, a Ray replica)."""
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="model"))


class Slots:
    """`with slots:` holds one of `count` slots while the block runs, waiting for one to be free (a semaphore;
    its tokens in a C queue, which costs a tenth of `threading.Semaphore` per use). `take` and `give` are that
    queue's own methods, for a caller that counts its calls."""

    __slots__ = ("give", "take")

    def __init__(self, count: int) -> None:
        free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(count):
            free.put(None)
        self.take: Callable[[], None] = free.get
        self.give: Callable[[None], None] = free.put

    def __enter__(self) -> None:
        self.take()

    def __exit__(self, *exc: object) -> None:
        self.give(None)


def runs_alone(model: Model) -> bool:
    """Whether requests to `model` can run wholly in the calling thread: its `infer` is a plain method, and it
    neither batches dynamically nor is decoupled."""
    hook = model.infer
    return not (model.decoupled or is_batching(model) or inspect.iscoroutinefunction(hook)
                or inspect.isasyncgenfunction(hook))


def call_in_thread(model: Model, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> Any:
    """Call a plain `infer` in this thread (no event loop here): what it returned (awaited, for a plain method
    that returned an awaitable); an exception other than OipError becomes ModelFailure (`model_error`)."""
    try:
        result = model.infer(inputs, parameters)
        if type(result) is not dict and inspect.isawaitable(result):  # dict: the common answer, told quickly
            result = asyncio.run(_awaited(result))
    except Exception as exc:
        raise model_error(model, exc)  # noqa: B904 (its cause is set: the model's exception)
    return result


def model_error(model: Model, exc: Exception) -> OipError:
    """What an exception raised by `model` is to the request: an OipError as it is (the model reports bad input,
    say), anything else ModelFailure with its message (its cause the exception), logged here with its traceback.
    Where the model is called: `except Exception as exc: raise model_error(model, exc)`."""
    if isinstance(exc, OipError):
        return exc
    # The same failure again within the minute is counted rather than written (`observe.logs.Repeats`).
    log.error("model '%s' version %s failed", model.name, model.version, exc_info=exc,
              extra={REPEATS_AS: f"{model.name}\0{model.version}\0{type(exc).__qualname__}\0{str(exc)[:200]}"})
    error = ModelFailure(str(exc) or type(exc).__name__)
    error.__cause__ = exc
    return error


_PLAIN: dict[int, bool] = {}  # by id of an `infer` function: whether it is plain (no coroutine or async generator)
_FORGET: dict[int, weakref.ref[Any]] = {}  # by the same id: drops the entry as its function goes (a reloaded model)


def is_plain(hook: Callable[..., Any]) -> bool:
    """Whether `hook` is a plain function (not a coroutine or async generator function), remembered per function:
    asked on every request, and `inspect` takes a microsecond to tell. Remembered by id, not by the function, and
    forgotten as the function goes: a model reloaded from its source (every load compiles it anew) leaves its old
    module, and all that module holds, to be freed."""
    function = getattr(hook, "__func__", None)  # a bound method's function: the same for every instance
    key = id(function)
    plain = _PLAIN.get(key) if function is not None else None
    if plain is None:
        plain = not (inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook))
        if function is not None:
            try:
                _FORGET[key] = weakref.ref(function, lambda _, key=key: _forget(key))  # type: ignore[misc]
            except TypeError:  # a function that takes no weak reference (a C one): asked again each time
                return plain
            _PLAIN[key] = plain
    return plain


def _forget(key: int) -> None:
    _PLAIN.pop(key, None)
    _FORGET.pop(key, None)


async def _awaited(result: Any) -> Any:
    return await result
