"""The classification extension: a requested output's `classification` parameter asks for its top k elements
as class strings "<value>:<index>[:<label>]" (BYTES), values written as C++ `std::to_string` writes them, as
Triton does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from ... import datatypes, extensions
from ..errors import InvalidRequest, Unimplemented
from ..model import Model, TensorSpec
from ..types import RequestedOutput, Tensor

__all__ = ["CLASSIFICATION", "check_classification", "classify"]

CLASSIFICATION: Final = extensions.CLASSIFICATION
"""The requested-output parameter (an integer k; 0: no classification)."""
# Triton ranks integer and float outputs that have a JSON form (not BOOL, FP16, BF16 or BYTES).
_CLASSIFIABLE: Final = frozenset(d.name for d in datatypes.DATATYPES if d.json and d.dtype.kind in "iuf")
_CLASSIFICATION_LIMIT: Final = 1_000_000  # elements of one output (Triton's limit)


def check_classification(model: Model, outputs: Sequence[RequestedOutput], enabled: bool) -> dict[str, int]:
    """Output name -> top k for the requested outputs whose `classification` parameter asks for classes (an
    integer; 0 means no classification). InvalidRequest for a wrong value or an output datatype without an order
    (BOOL, FP16, BF16, BYTES); Unimplemented when the extension is disabled."""
    counts: dict[str, int] = {}
    declared = {spec.name: spec for spec in model.outputs}
    for output in outputs:
        if CLASSIFICATION not in output.parameters:
            continue
        value = output.parameters[CLASSIFICATION]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(
                f"invalid value type for 'classification' parameter of output '{output.name}', expected an integer, "
                f"got {value!r}"
            )
        if value < 0:
            raise InvalidRequest(
                f"invalid value for 'classification' parameter of output '{output.name}', expected >= 0, got {value}"
            )
        if value == 0:
            continue
        if not enabled:
            raise Unimplemented("the classification extension is not enabled on this server")
        if extensions.SHARED_MEMORY_REGION in output.parameters:
            raise InvalidRequest(f"output '{output.name}': classification cannot be written to shared memory")
        spec = declared[output.name]
        if spec.datatype not in _CLASSIFIABLE:
            raise InvalidRequest(
                f"class result not available for output '{spec.name}' due to unsupported type '{spec.datatype}'"
            )
        counts[output.name] = value
    return counts


def classify(model: Model, spec: TensorSpec, tensor: Tensor, count: int) -> Tensor:
    """The classification of an output: per batch item (the whole tensor for a model that does not batch) the
    `count` largest elements, largest first (ties: lowest index first), as BYTES "<value>:<index>[:<label>]";
    shape [batch, k] or [k], k = min(count, elements per item). Values are written as C++ `std::to_string`
    writes them, as Triton does: integers as integers, floats with six decimals ("3.300000")."""
    data = tensor.data
    assert data is not None
    if data.size > _CLASSIFICATION_LIMIT:
        raise InvalidRequest(
            f"classification output tensor too large: output '{spec.name}' has {data.size} elements, more than "
            f"{_CLASSIFICATION_LIMIT}"
        )
    batching = model.max_batch_size > 0
    rows = data.reshape(data.shape[0], -1) if batching else data.reshape(1, -1)
    width = rows.shape[1]
    k = min(count, width)
    floating = data.dtype.kind == "f"
    labels = spec.labels
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        row = rows[r]
        # Descending by value, ties by ascending index: a stable ascending sort of the reversed row, reversed.
        top = (width - 1) - np.argsort(row[::-1], kind="stable")[::-1][:k]
        for j, index in enumerate(top.tolist()):
            value = row[index]
            text = f"{float(value):f}" if floating else str(int(value))
            label = labels[index] if index < len(labels) else ""
            out[r, j] = (f"{text}:{index}:{label}" if label else f"{text}:{index}").encode()
    shape = [rows.shape[0], k] if batching else [k]
    return Tensor(name=spec.name, datatype="BYTES", shape=shape, data=out.reshape(shape))

