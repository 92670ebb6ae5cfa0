"""OUTPUT0 = INPUT0, a one-dimensional BYTES tensor of any length (an object array of `bytes`)."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from oip.server import Model, TensorSpec


class IdentityBytes(Model):
    inputs = (TensorSpec("INPUT0", "BYTES", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "BYTES", [-1]),)

    async def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"OUTPUT0": inputs["INPUT0"]}
