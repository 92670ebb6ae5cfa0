"""The model of the Open Inference Protocol's REST inference example (`mymodel`): two inputs, one output. The
protocol never says what it computes; here output0 is input0 (UINT32 [2, 2]) and input1 (BOOL [3]) is validated
by the server, then ignored."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from oip.server import Model, TensorSpec


class MyModel(Model):
    inputs = (TensorSpec("input0", "UINT32", [2, 2]), TensorSpec("input1", "BOOL", [3]))
    outputs = (TensorSpec("output0", "UINT32", [2, 2]),)
    inline = True

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"output0": inputs["input0"]}
