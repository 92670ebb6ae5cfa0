"""text_output = text_input upper-cased (BYTES [1] each): one answer per request, for `/generate`."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec


class TextGenerate(Model):
    inputs = (TensorSpec("text_input", "BYTES", [1]),)
    outputs = (TensorSpec("text_output", "BYTES", [1]),)
    inline = True

    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"text_output": np.array([bytes(inputs["text_input"][0]).upper()], dtype=object)}
