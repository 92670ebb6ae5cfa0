"""OUTPUT0[i] = INPUT0[i].upper(): one BYTES tensor of any length in, the same count of strings out."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec


class Text(Model):
    inputs = (TensorSpec("INPUT0", "BYTES", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "BYTES", [-1]),)
    inline = True  # microseconds of work: called where the request is, no hop to a worker thread

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"OUTPUT0": np.array([bytes(s).upper() for s in inputs["INPUT0"]], dtype=object)}
