"""A decoupled model: for text_input (BYTES [1]), one response per whitespace-separated word, text_output the word."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
from oip.server import Model, TensorSpec


class TextTokens(Model):
    inputs = (TensorSpec("text_input", "BYTES", [1]),)
    outputs = (TensorSpec("text_output", "BYTES", [1]),)

    async def infer(
        self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        for word in bytes(inputs["text_input"][0]).split():
            yield {"text_output": np.array([word], dtype=object)}
