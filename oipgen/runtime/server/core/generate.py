"""Triton's generate extension over the data plane's inference: a flat JSON request in, flat JSON answers out.

The request is one JSON object. A top-level key that names an input of the model becomes that input: a scalar or
a string is one element, a flat array its elements; the shape comes from the model's metadata (fixed dimensions
take their share of the elements, the innermost variable one the rest, any other variable one 1). `id` is the
request id. `parameters` is an object whose keys are read the same way (inputs or parameters). Every other key is
a request parameter (a boolean, number or string).

An answer is one JSON object: `model_name`, `model_version`, `id` when the request had one, one key per output (a
one-element output as the element itself, otherwise a flat array; BYTES as strings) and the response's
parameters. `generate` needs exactly one response from the model; `generate_stream` passes on each response of a
decoupled model as it comes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ... import codec
from ..errors import InvalidRequest, ModelFailure, TooLarge
from ..model import Model
from ..types import InferRequest, InferResponse, Tensor
from .streaming import EMPTY_FINAL, FINAL

__all__ = ["ID", "PARAMETERS", "answer", "request", "shape_for"]

ID: Final = "id"
PARAMETERS: Final = "parameters"
_SCALARS: Final = (bool, int, float, str)
# Answer keys the data plane owns; response parameters of these names are not copied over them.
_ANSWER_KEYS: Final = frozenset({"model_name", "model_version", ID})


def request(model: Model, shapes: Mapping[str, Sequence[int]], body: Mapping[str, Any], *, model_name: str,
            model_version: str, max_elements: int) -> InferRequest:
    """The inference request that a generate body asks of `model` (InvalidRequest when it cannot be one).

    `shapes` holds each input's shape as the model's metadata declares it (batch dimension included)."""
    out = InferRequest(model_name=model_name, model_version=model_version)
    declared = {spec.name: spec for spec in model.inputs}
    request_id = body.get(ID, "")
    if not isinstance(request_id, str):
        raise InvalidRequest(f"'{ID}' must be a string, got {codec.describe(request_id)}")
    out.id = request_id
    seen: set[str] = set()

    def take(key: str, value: Any, where: str) -> None:
        spec = declared.get(key)
        if spec is None:
            if not isinstance(value, _SCALARS):
                raise InvalidRequest(f"{where}parameter '{key}' has invalid type: parameters are booleans, numbers "
                                     f"or strings, got {codec.describe(value)}")
            if key in out.parameters:
                raise InvalidRequest(f"{where}parameter '{key}' already exists in request")
            out.parameters[key] = value
            return
        if key in seen:
            raise InvalidRequest(f"{where}input '{key}' already exists in request")
        seen.add(key)
        out.inputs.append(_tensor(key, spec.datatype, shapes[key], value, where, max_elements))

    for key, value in body.items():
        if key == ID:
            continue
        if key == PARAMETERS and key not in declared:
            if not isinstance(value, dict):
                raise InvalidRequest(
                    f"Expected JSON object for keyword: '{PARAMETERS}', got {codec.describe(value)}"
                )
            for inner, item in value.items():
                take(inner, item, f"Converting keyword: '{PARAMETERS}': ")
            continue
        take(key, value, "")
    # The stream's empty final response carries nothing a generate answer could show.
    out.parameters.pop(EMPTY_FINAL, None)
    return out


def _tensor(name: str, datatype: str, declared: Sequence[int], value: Any, where: str, max_elements: int) -> Tensor:
    if isinstance(value, list):
        if any(isinstance(item, list | dict) for item in value):
            raise InvalidRequest(f"{where}input '{name}' must be a scalar, a string or a flat array of them")
        items = value
    elif isinstance(value, dict) or value is None:
        raise InvalidRequest(
            f"{where}input '{name}' must be a scalar, a string or a flat array, got {codec.describe(value)}"
        )
    else:
        items = [value]
    if len(items) > max_elements:
        raise TooLarge(f"{where}input '{name}' has {len(items)} elements, more than the {max_elements} allowed")
    shape = shape_for(declared, len(items))
    if shape is None:
        raise InvalidRequest(
            f"{where}cannot convert input '{name}' ({len(items)} element(s)) to a tensor of shape "
            f"[{', '.join(map(str, declared))}]"
        )
    try:
        array = codec.from_json(items, datatype, shape, name=name)
    except codec.CodecError as exc:
        raise InvalidRequest(f"{where}{exc}") from None
    return Tensor(name, datatype, shape, array)


def shape_for(declared: Sequence[int], count: int) -> list[int] | None:
    """The shape of `count` elements under a declared shape, as Triton fills it: every fixed dimension takes its
    size, the innermost variable (-1) dimension the remaining count and any other variable one 1; None when the
    elements do not fit."""
    remaining = count
    for d in declared:
        if d == 0:  # a zero-size dimension holds no element, and only that
            return None if count else [max(x, 0) for x in declared]
        if d > 0:
            if remaining % d:
                return None
            remaining //= d
    shape = list(declared)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] < 0:
            shape[i], remaining = remaining, 1
    return shape if remaining == 1 else None


def answer(response: InferResponse) -> dict[str, Any]:
    """The flat JSON answer of one inference response."""
    out: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        out[ID] = response.id
    for tensor in response.outputs:
        try:
            data = [] if tensor.data is None else codec.to_json(tensor.data, tensor.datatype, name=tensor.name)
        except codec.CodecError as exc:
            raise ModelFailure(str(exc)) from None
        out[tensor.name] = data[0] if len(data) == 1 else data  # one element: the output's shape holds one
    for key, value in response.parameters.items():
        if key != FINAL and key not in _ANSWER_KEYS and key not in out:
            out[key] = value
    return out

