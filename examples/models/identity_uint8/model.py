"""OUTPUT0 = INPUT0, a one-dimensional UINT8 tensor of any length."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from oip.server import Model, TensorSpec


class IdentityUInt8(Model):
    inputs = (TensorSpec("INPUT0", "UINT8", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "UINT8", [-1]),)
    inline = True  # no work at all: called on the thread that has the request

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"OUTPUT0": inputs["INPUT0"]}
