"""A decoupled model: for a BYTES text_input of one element, one response per whitespace-separated word, in order,
each with text_output holding that word (no response for a text without words)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec


class TextStream(Model):
    inputs = (TensorSpec("text_input", "BYTES", [1]),)
    outputs = (TensorSpec("text_output", "BYTES", [1]),)

    async def infer(
        self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        for word in bytes(inputs["text_input"][0]).split():
            yield {"text_output": np.array([word], dtype=object)}
