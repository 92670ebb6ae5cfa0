"""`simple` for a model that batches: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over rows of INT32 [16]."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec


class Batched(Model):
    inputs = (TensorSpec("INPUT0", "INT32", [16]), TensorSpec("INPUT1", "INT32", [16]))
    outputs = (TensorSpec("OUTPUT0", "INT32", [16]), TensorSpec("OUTPUT1", "INT32", [16]))
    inline = True

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": np.add(a, b, dtype=np.int32), "OUTPUT1": np.subtract(a, b, dtype=np.int32)}
