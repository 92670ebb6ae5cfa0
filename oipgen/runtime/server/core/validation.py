"""What the data plane checks of an inference request and of a model's answer, against the model's declarations.

Inputs (`check_inputs`): every declared input present once and no other, datatype equal, same rank and every
dimension equal unless declared -1; for a model that batches (`max_batch_size > 0`) the first dimension is the
batch, 1 to max_batch_size and the same for every input. Requested outputs (`check_requested_outputs`): known and
not repeated. Request parameters (`check_request_parameters`): scalars, the reserved `triton_*` keys refused
except those that steer the server, transport keys removed. A raw binary request (`raw_input`) gets the shape of
the model's only input from its declaration.

The model's answer (`split_result`, `check_output`): outputs by name, optionally with response parameters; every
needed output present, convertible without loss to its declared datatype (`codec.as_datatype`), shape as declared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ... import codec, datatypes, extensions
from ..errors import InvalidRequest, ModelFailure, TooLarge
from ..model import Model, TensorSpec
from ..types import Tensor

__all__ = [
    "RESERVED_ALLOWED",
    "RESERVED_PREFIX",
    "TRANSPORT_PARAMETERS",
    "check_inputs",
    "check_output",
    "check_request_parameters",
    "check_requested_outputs",
    "declared_shape",
    "raw_input",
    "shape_text",
    "split_result",
]

# Request parameters that steer a transport (the binary tensor data extension), not the model: the model
# never sees them.
TRANSPORT_PARAMETERS: Final = frozenset({extensions.BINARY_DATA_OUTPUT})
# Request parameter keys starting with this are reserved (Triton's parameters extension), except these, which
# steer the server (the stream's empty final response) and never reach the model.
RESERVED_PREFIX: Final = "triton_"
RESERVED_ALLOWED: Final = frozenset({"triton_enable_empty_final_response"})
_SCALARS: Final = (bool, int, float, str)

def declared_shape(model: Model, spec: TensorSpec) -> tuple[int, ...]:
    """The shape a request or response tensor must have: the declared one, after a -1 batch dimension when the
    model batches."""
    return (-1, *spec.shape) if model.max_batch_size > 0 else spec.shape


def shape_fits(declared: Sequence[int], shape: Sequence[int]) -> bool:
    """The shape rule, for requests and answers over every way: `shape` has the rank of the `declared` shape, and
    each dimension is the declared one where that is not -1 (any size). Dimensions are checked to be sizes (integers
    >= 0) before: `tensor_elements` for a request's tensor, numpy for an answer's array."""
    if shape == declared:  # most answers' arrays: as declared, no dimension that varies (a tuple's compare is cheap)
        return True
    if len(shape) != len(declared):
        return False
    for d, s in zip(declared, shape, strict=True):  # noqa: SIM110 (a loop: cheaper than all() over a generator)
        if d != s and d != -1:
            return False
    return True


def tensor_elements(name: str, shape: Any, limit: int) -> int:
    """The one check of a request tensor's header, over both transports and the lean gRPC way: the element count of
    `shape`; CodecError unless it is a list of integers >= 0, TooLarge beyond `limit` elements per tensor (checked
    before anything is allocated)."""
    count = 1
    if type(shape) is list:
        for d in shape:  # plain ints in range, told quickly; anything else as the codec reads it
            if type(d) is not int or not 0 <= d < _MAX_DIM:
                count = codec.element_count(shape, name=name)
                break
            count *= d
    else:
        count = codec.element_count(shape, name=name)
    if count > limit:
        raise TooLarge(f"input '{name}': shape {shape} has {count} elements, more than the {limit} allowed per tensor")
    return count


_MAX_DIM: Final = 1 << 63



def shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"



def check_inputs(model: Model, tensors: Sequence[Tensor]) -> tuple[dict[str, npt.NDArray[Any]], int]:
    """The request's inputs as arrays by name, in declared order, and the batch size (1 for a model that does not
    batch); InvalidRequest unless they match."""
    given: dict[str, Tensor] = {}
    for item in tensors:
        if item.name in given:
            raise InvalidRequest(f"input '{item.name}' appears more than once in the request")
        given[item.name] = item
    declared = {spec.name: spec for spec in model.inputs}
    for name in given:
        if name not in declared:
            raise InvalidRequest(f"unexpected inference input '{name}' for model '{model.name}'")
    arrays: dict[str, npt.NDArray[Any]] = {}
    batching = model.max_batch_size > 0
    batch: tuple[str, int] | None = None  # the first input's name and batch size
    for spec in model.inputs:
        tensor = given.get(spec.name)
        if tensor is None:
            raise InvalidRequest(f"missing input '{spec.name}' for model '{model.name}'")
        if tensor.datatype != spec.datatype:
            raise InvalidRequest(
                f"inference input '{spec.name}' data-type is '{tensor.datatype}', but model '{model.name}' "
                f"expects '{spec.datatype}'"
            )
        shape = tensor.shape
        if not _plain_shape(shape) and any(
            isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in shape
        ):
            raise InvalidRequest(f"input '{spec.name}': shape {shape_text(shape)} is invalid")
        expected = declared_shape(model, spec)
        if not shape_fits(expected, shape):
            raise InvalidRequest(
                f"unexpected shape for input '{spec.name}' for model '{model.name}'. Expected "
                f"{shape_text(expected)}, got {shape_text(shape)}"
            )
        if batching:
            size = int(shape[0])
            if size > model.max_batch_size:
                raise InvalidRequest(
                    f"inference request batch-size must be <= {model.max_batch_size} for '{model.name}' "
                    f"(input '{spec.name}' has {size})"
                )
            if size < 1:
                raise InvalidRequest(
                    f"inference request batch-size must be >= 1 for '{model.name}' (input '{spec.name}')"
                )
            if batch is None:
                batch = (spec.name, size)
            elif size != batch[1]:
                raise InvalidRequest(
                    f"input '{spec.name}' has batch size {size} but input '{batch[0]}' has {batch[1]}: every input "
                    f"of model '{model.name}' must have the same batch size"
                )
        arrays[spec.name] = _input_array(spec, tensor)
    return arrays, batch[1] if batch is not None else 1


def _plain_shape(shape: Sequence[Any]) -> bool:
    """Whether every dimension is a Python int >= 0 (what the transports give): the common case, told quickly."""
    for d in shape:  # noqa: SIM110 (a loop: cheaper than all() over a generator)
        if type(d) is not int or d < 0:
            return False
    return True


def _input_array(spec: TensorSpec, tensor: Tensor) -> npt.NDArray[Any]:
    data = tensor.data
    if data is None:
        raise InvalidRequest(f"input '{spec.name}' has no data")
    dims = tuple(tensor.shape) if _plain_shape(tensor.shape) else tuple(int(d) for d in tensor.shape)
    if data.shape != dims:
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if data.size != count:
            raise InvalidRequest(
                f"input '{spec.name}': shape {shape_text(dims)} needs {count} elements, the data has {data.size}"
            )
        data = data.reshape(dims)
    info = datatypes.BY_NAME[spec.datatype]
    if data.dtype != info.dtype and not (info.variable and data.dtype.kind == "O"):
        try:
            data = codec.as_datatype(data, spec.datatype)
        except ValueError as exc:
            raise InvalidRequest(f"input '{spec.name}': {exc}") from exc
    return data



def check_requested_outputs(model: Model, names: Sequence[str]) -> list[TensorSpec]:
    """The outputs to answer, in answer order; InvalidRequest for unknown or repeated names."""
    if not names:
        return list(model.outputs)
    declared = {spec.name: spec for spec in model.outputs}
    wanted: list[TensorSpec] = []
    seen: set[str] = set()
    for name in names:
        spec = declared.get(name)
        if spec is None:
            raise InvalidRequest(f"unexpected inference output '{name}' for model '{model.name}'")
        if name in seen:
            raise InvalidRequest(f"output '{name}' appears more than once in the request")
        seen.add(name)
        wanted.append(spec)
    return wanted



def check_request_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters the model sees: transport keys and the allowed reserved keys removed; InvalidRequest for
    any other `triton_*` key, a reserved key of the wrong type or a value that is not a scalar."""
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if key in TRANSPORT_PARAMETERS or key in RESERVED_ALLOWED:
            if not isinstance(value, bool):
                raise InvalidRequest(f"invalid value type for '{key}' parameter, expected a boolean, got {value!r}")
            continue
        if key.startswith(RESERVED_PREFIX):
            raise InvalidRequest(
                f"parameter keys starting with '{RESERVED_PREFIX}' are reserved for Triton usage and should not be "
                f"specified (got '{key}')"
            )
        if not isinstance(value, _SCALARS):
            raise InvalidRequest(f"parameter '{key}' has invalid type: parameters are booleans, numbers or strings")
        out[key] = value
    return out



def split_result(model: Model, result: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """(outputs, response parameters) of what `infer` returned; ModelFailure when it is neither form."""
    parameters: Any = {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Mapping):
        result, parameters = result
    if type(result) is not dict and not isinstance(result, Mapping):  # a dict first: an ABC's check costs more
        raise ModelFailure(
            f"model '{model.name}' returned {type(result).__name__} from infer(), not a mapping of output names to "
            "arrays"
        )
    if type(parameters) is not dict and not isinstance(parameters, Mapping):
        raise ModelFailure(f"model '{model.name}' returned response parameters of type {type(parameters).__name__}")
    checked: dict[str, Any] = {}
    for key, value in parameters.items():
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(key, str) or not isinstance(value, _SCALARS):
            raise ModelFailure(
                f"model '{model.name}' returned response parameter {key!r} = {value!r}: parameters are booleans, "
                "numbers or strings"
            )
        checked[key] = value
    return result, checked


def check_output(model: Model, spec: TensorSpec, outputs: Mapping[str, Any], batch_size: int = 1) -> Tensor:
    if spec.name not in outputs:
        raise ModelFailure(f"model '{model.name}' did not return output '{spec.name}'")
    value = outputs[spec.name]
    info = datatypes.BY_NAME.get(spec.datatype)
    if info is not None and type(value) is np.ndarray and value.dtype == info.dtype and (
            value.dtype.kind != "O" or codec.holds_bytes_only(value)):
        array = value  # already in its datatype (what most models return; BYTES: bytes only): nothing to convert
    else:
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            array = codec.as_datatype(array, spec.datatype)
        except (ValueError, TypeError) as exc:
            raise ModelFailure(f"model '{model.name}' output '{spec.name}': {exc}") from exc
    expected = declared_shape(model, spec)
    shape = array.shape
    fits = shape == expected or shape_fits(expected, shape)  # as declared (most answers): no call
    if not fits or (model.max_batch_size > 0 and shape[0] != batch_size):
        batch = f" for a batch of {batch_size}" if model.max_batch_size > 0 else ""
        raise ModelFailure(
            f"model '{model.name}' output '{spec.name}' has shape {shape_text(shape)}, but the model "
            f"declares {shape_text(expected)}{batch}"
        )
    return Tensor(spec.name, spec.datatype, list(shape), array)  # positional: keywords cost a dict (0.7 us)



def raw_input(model: Model, data: bytes | memoryview, max_elements: int) -> Tensor:
    """The input of a raw binary request (REST `Inference-Header-Content-Length: 0`): the body is the data of the
    model's only input. Its shape comes from the declaration: for BYTES it must be [1] and the body is that one
    element; otherwise at most one dimension may vary (the batch dimension counts), and the body's size fixes it."""
    if len(model.inputs) != 1:
        raise InvalidRequest(
            f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; "
            f"model '{model.name}' has {len(model.inputs)}"
        )
    spec = model.inputs[0]
    dims = list(declared_shape(model, spec))
    info = datatypes.get(spec.datatype)
    if info is None:
        raise InvalidRequest(f"input '{spec.name}' has datatype {spec.datatype!r}, which has no raw form")
    if info.variable:  # BYTES: the body is one element, since nothing says where elements would end
        if dims != [1]:
            raise InvalidRequest(
                f"a raw binary {spec.datatype} input must be declared with shape [1]; '{spec.name}' has {dims}"
            )
        array: npt.NDArray[Any] = np.empty(1, dtype=object)
        array[0] = bytes(data)
        return Tensor(spec.name, spec.datatype, [1], array)
    variable = [i for i, d in enumerate(dims) if d < 0]
    known = int(np.prod([d for d in dims if d >= 0], dtype=np.int64)) if dims else 1
    if len(variable) > 1:
        raise InvalidRequest(
            f"a raw binary request cannot fix the shape {dims} of input '{spec.name}': more than one dimension varies"
        )
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    count, rest = divmod(size, info.size)
    if rest or (variable and (known == 0 or count % known)) or (not variable and count != known):
        raise InvalidRequest(
            f"a raw binary body of {size} bytes does not fit input '{spec.name}' ({spec.datatype} {dims})"
        )
    if variable:
        dims[variable[0]] = count // known
    if count > max_elements:
        raise TooLarge(f"input '{spec.name}' has {count} elements, more than the {max_elements} allowed")
    return Tensor(spec.name, spec.datatype, dims, codec.from_raw(data, spec.datatype, dims, name=spec.name))
