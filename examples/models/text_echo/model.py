"""text_output = text_input: BYTES in, the same BYTES out (any number of elements)."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from oip.server import Model, TensorSpec


class TextEcho(Model):
    inputs = (TensorSpec("text_input", "BYTES", [-1]),)
    outputs = (TensorSpec("text_output", "BYTES", [-1]),)

    async def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        return {"text_output": inputs["text_input"]}
