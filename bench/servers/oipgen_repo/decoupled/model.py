"""A decoupled model: to a request with IN (INT32 [1]), 100 responses, the i-th with OUT = IN + i (wrapping)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec

RESPONSES = 100


class Decoupled(Model):
    inputs = (TensorSpec("IN", "INT32", [1]),)
    outputs = (TensorSpec("OUT", "INT32", [1]),)

    async def infer(
        self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]
    ) -> AsyncIterator[dict[str, npt.NDArray[Any]]]:
        value = inputs["IN"]
        for i in range(RESPONSES):
            yield {"OUT": np.add(value, i, dtype=np.int32)}
