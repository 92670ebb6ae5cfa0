"""The small models the tests of the lean ways of inference run (gRPC's `in_thread`, REST's `lean`): the same
models over both transports, each a case the lean ways read differently (plain, a coroutine, rows, dynamic
batching, BYTES, BOOL, and a model answering whatever a function returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec
from oip.server.model import DynamicBatching

Arrays = dict[str, npt.NDArray[Any]]


class Simple(Model):
    name = "simple"
    inputs = (TensorSpec("INPUT0", "INT32", [1, 16]), TensorSpec("INPUT1", "INT32", [1, 16]))
    outputs = (TensorSpec("OUTPUT0", "INT32", [1, 16]), TensorSpec("OUTPUT1", "INT32", [1, 16]))

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": np.add(a, b, dtype=np.int32), "OUTPUT1": np.subtract(a, b, dtype=np.int32)}


class Answers(Model):
    """Answers whatever `answer(inputs)` returns: FP32 [-1] in, OUT FP32 [-1] out."""

    inputs = (TensorSpec("IN", "FP32", [-1]),)
    outputs = (TensorSpec("OUT", "FP32", [-1]),)

    def __init__(self, name: str, answer: Callable[[Arrays], Any], **kw: Any) -> None:
        super().__init__(name, **kw)
        self.answer = answer

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return self.answer(inputs)


class Async(Simple):
    name = "async_simple"

    async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:  # type: ignore[override]
        return Simple.infer(self, inputs, parameters)


class Batching(Simple):
    name = "batching"
    inputs = (TensorSpec("INPUT0", "INT32", [16]), TensorSpec("INPUT1", "INT32", [16]))
    outputs = (TensorSpec("OUTPUT0", "INT32", [16]), TensorSpec("OUTPUT1", "INT32", [16]))
    max_batch_size = 4
    dynamic_batching = DynamicBatching()


class Flags(Model):
    name = "flags"
    inputs = (TensorSpec("IN", "BOOL", [2]),)
    outputs = (TensorSpec("OUT", "BOOL", [2]),)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return {"OUT": inputs["IN"]}


class Texts(Model):
    """BYTES in, each string upper-cased out; the parameters it saw as its response parameters."""

    name = "texts"
    inputs = (TensorSpec("IN", "BYTES", [-1]),)
    outputs = (TensorSpec("OUT", "BYTES", [-1]),)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        out = {"OUT": np.array([bytes(s).upper() for s in inputs["IN"]], dtype=object)}
        return (out, dict(parameters)) if parameters else out


class Rows(Simple):
    """`simple` over rows: a model that batches (max_batch_size 4), without dynamic batching."""

    name = "rows"
    inputs = Batching.inputs
    outputs = Batching.outputs
    max_batch_size = 4


# What a model (`Answers`) may return: answers the lean ways pass on or convert as the general way does, and answers
# they fail as it does.
GOOD_ANSWERS: list[Callable[[Arrays], Any]] = [
    lambda i: {"OUT": i["IN"] * 2},  # as declared
    lambda i: {"OUT": (i["IN"] * 2).astype(np.float64)},  # converted to FP32
    lambda i: {"OUT": [1.0, 2.0]},  # a list
    lambda i: ({"OUT": i["IN"]}, {"note": "hi", "n": 3}),  # with response parameters
    lambda i: {"OUT": i["IN"][::-1]},  # not contiguous
]
WRONG_ANSWERS: list[Callable[[Arrays], Any]] = [
    lambda i: {"OTHER": i["IN"]},  # output missing
    lambda i: {"OUT": np.zeros((2, 2), np.float32)},  # wrong rank
    lambda i: {"OUT": np.array(["a"])},  # not convertible
    lambda i: [i["IN"]],  # not a mapping
    lambda i: 1 / 0,  # the model fails
]
