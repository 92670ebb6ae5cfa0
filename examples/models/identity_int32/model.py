"""OUTPUT0 = INPUT0, a one-dimensional INT32 tensor of any length."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from oip.server import Model, TensorSpec


class IdentityInt32(Model):
    inputs = (TensorSpec("INPUT0", "INT32", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "INT32", [-1]),)
    inline = True  # no work at all: called on the thread that has the request

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"OUTPUT0": inputs["INPUT0"]}
