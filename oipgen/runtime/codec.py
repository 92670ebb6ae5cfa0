"""numpy codecs for tensor data: JSON `data`, raw little-endian bytes and gRPC typed contents.

Every decoder checks the shape first (non-negative integers) and computes the element count without allocating
by shape, so a request claiming a huge shape fails fast. Bad input raises `CodecError` (a `ValueError`) whose
message names the problem, prefixed with the tensor's name when the caller passes `name=`.

- JSON (`from_json`, `to_json`): nested or flat row-major lists. Strict per datatype: BOOL takes JSON
  booleans, integer types take in-range integral numbers (JSON has one number type, so `1.0` is the integer
  1; `0.5` and out-of-range values are refused), FP32/FP64 take numbers (not booleans), BYTES takes
  strings (UTF-8). FP16 and BF16 have no JSON form. NaN and infinities pass through as Python floats; the
  JSON writer decides.
- Raw (`from_raw`, `to_raw`): the gRPC `raw_*_contents` and REST binary form. Fixed-size types are
  little-endian and row-major; BOOL is one byte (0/1); BYTES is a 4-byte little-endian length then the
  bytes, per element. `from_raw` is zero-copy for fixed-size types: the array views the buffer, read-only
  when the buffer is.
- Typed contents (`from_contents`, `to_contents`): the `InferTensorContents` field the datatype table names.

Decoded BYTES tensors are object arrays of `bytes`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, Final, NoReturn, TypeAlias

import numpy as np
import numpy.typing as npt

from . import datatypes
from .datatypes import DatatypeInfo

__all__ = [
    "COPY_BELOW",
    "CodecError",
    "as_datatype",
    "datatype_info",
    "datatype_of",
    "describe",
    "dtype_of",
    "element_count",
    "from_contents",
    "from_contents_message",
    "from_json",
    "from_raw",
    "holds_bytes_only",
    "to_contents",
    "to_json",
    "to_raw",
]

Array: TypeAlias = npt.NDArray[Any]
Buffer: TypeAlias = bytes | bytearray | memoryview

_U32: Final = struct.Struct("<I")
_MAX_DIM: Final = 2**63 - 1  # shapes are int64 on the wire
_NESTED: Final = (list, tuple, np.ndarray)
_BOOLS: Final = (bool, np.bool_)
_INTS: Final = (int, np.integer)
_NUMBERS: Final = (int, float, np.integer, np.floating)
COPY_BELOW: Final = 1 << 16
"""Raw bytes below which `to_raw` copies an array already of its datatype rather than view it (a copy that small
costs less than making the view)."""


def _family(info: DatatypeInfo) -> str:
    kind = info.dtype.kind
    if info.variable:
        return "bytes"
    if kind == "b":
        return "bool"
    return "int" if kind in "iu" else "float"  # float16/32/64 and ml_dtypes' bfloat16 (kind "V")


_FAMILY: Final = {d.name: _family(d) for d in datatypes.DATATYPES}
_INT_RANGE: Final = {
    d.name: (int(np.iinfo(d.dtype).min), int(np.iinfo(d.dtype).max))
    for d in datatypes.DATATYPES
    if _FAMILY[d.name] == "int"
}
# The dtype each typed contents field holds on the wire: the widest datatype in it (int_contents: int32).
_CONTENTS_DTYPE: Final = {
    field: max((d.dtype for d in datatypes.DATATYPES if d.contents == field), key=lambda dt: dt.itemsize)
    for field in datatypes.CONTENTS_FIELDS
}


class CodecError(ValueError):
    """Tensor data that cannot be decoded or encoded; the message names the problem and the tensor."""


def _fail(name: str, message: str) -> NoReturn:
    raise CodecError(f"tensor '{name}': {message}" if name else message)


# --- datatypes and shapes ---------------------------------------------------------------------------------


def datatype_info(datatype: str, *, name: str = "") -> DatatypeInfo:
    """The table row of wire name `datatype`; CodecError listing the valid names when there is none."""
    info = datatypes.BY_NAME.get(datatype) if isinstance(datatype, str) else None
    if info is None:
        _fail(name, f"unknown datatype {datatype!r}; valid datatypes: {', '.join(datatypes.NAMES)}")
    return info


def dtype_of(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of decoded tensors of `datatype` (object for BYTES); CodecError when unknown."""
    return datatype_info(datatype).dtype


def datatype_of(array_or_dtype: Any) -> str:
    """The wire name for an array, numpy scalar or dtype-like (str, bytes, object: BYTES; bfloat16: BF16)."""
    if isinstance(array_or_dtype, np.ndarray | np.generic):
        dt = array_or_dtype.dtype
    else:
        try:
            dt = np.dtype(array_or_dtype)
        except TypeError:
            _fail("", f"not a numpy array or dtype: {array_or_dtype!r}")
    found = datatypes.name_of_dtype(dt)
    if found is None:
        _fail("", f"numpy dtype {dt} has no Open Inference Protocol datatype")
    return found


def _check_shape(shape: Any, name: str) -> tuple[tuple[int, ...], int]:
    """The shape as a tuple of ints and its element count, computed without allocating anything by shape."""
    if type(shape) is list:  # what JSON gives: told quickly when every dimension is a plain int in range
        count = 1
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= _MAX_DIM:
                break
            count *= dim
        else:
            return tuple(shape), count
    if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
        _fail(name, f"shape must be a list of integers, got {type(shape).__name__}")
    dims = list(shape)
    count = 1
    for i, dim in enumerate(dims):
        if isinstance(dim, float) and dim.is_integer():  # JSON has one number type: 16.0 is 16
            dim = int(dim)
        if isinstance(dim, _BOOLS) or not isinstance(dim, _INTS):
            _fail(name, f"shape {_shape_text(dims)} is invalid: dimension {i} is {dim!r}, not an integer")
        if not 0 <= dim <= _MAX_DIM:
            _fail(name, f"shape {_shape_text(dims)} is invalid: dimension {i} is {dim}, not in [0, 2**63)")
        count *= int(dim)
    return tuple(int(d) for d in dims), count


def element_count(shape: Sequence[int], *, name: str = "") -> int:
    """The number of elements of `shape` (1 for `[]`); CodecError unless it is a list of non-negative ints."""
    return _check_shape(shape, name)[1]


def _shape_text(dims: Iterable[Any]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def _count_error(name: str, dims: tuple[int, ...], count: int, got: int, where: str) -> NoReturn:
    _fail(name, f"shape {_shape_text(dims)} needs {count} elements, {where} has {got}")


def _reshape(array: Array, dims: tuple[int, ...], name: str) -> Array:
    try:
        return array.reshape(dims)
    except ValueError:  # an empty tensor whose other dimensions overflow numpy's limits
        _fail(
            name,
            f"shape {_shape_text(dims)} is too large: its non-zero dimensions times the element size exceed 2**63 "
            "bytes, even though the tensor is empty",
        )


_JSON_KINDS: Final = (
    (_INTS, "integer"),
    ((float, np.floating), "number"),
    ((str,), "string"),
    (_NESTED, "array"),
    ((dict,), "object"),
)


def describe(value: Any) -> str:
    """A value for an error message, named as JSON would name it."""
    if isinstance(value, _BOOLS):
        return "true" if value else "false"
    if value is None:
        return "null"
    kind = next((label for types, label in _JSON_KINDS if isinstance(value, types)), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:40] + '...' if len(text) > 43 else text}"


def _flatten(data: Any) -> list[Any]:
    """The leaves of nested lists, row-major; ragged nesting is fine (only the leaves count)."""
    if isinstance(data, np.ndarray):
        return data.ravel().tolist()
    items: list[Any] = data if isinstance(data, list) else list(data)
    while True:  # one level at a time, in C while every item of a level is a list or tuple
        types = set(map(type, items))
        if not any(issubclass(t, _NESTED) for t in types):
            return items
        if not all(t is list or t is tuple for t in types):
            break
        items = list(chain.from_iterable(items))
    leaves: list[Any] = []
    _flatten_into(items, leaves)
    return leaves


def _flatten_into(items: Iterable[Any], leaves: list[Any]) -> None:
    for item in items:
        if isinstance(item, np.ndarray):
            leaves.extend(item.ravel().tolist())
        elif isinstance(item, list | tuple):
            _flatten_into(item, leaves)
        else:
            leaves.append(item)


def _object_array(items: list[Any], dims: tuple[int, ...], name: str) -> Array:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out if len(dims) == 1 else _reshape(out, dims, name)  # one dimension: `items` is that long already


# --- JSON -------------------------------------------------------------------------------------------------


def from_json(data: Any, datatype: str, shape: Sequence[int], *, name: str = "") -> Array:
    """Decode JSON `data` (nested or flat row-major lists, as JSON parsers give them) to an array of `shape`.

    The element count must equal the product of the shape; ragged nesting with the right number of leaves is
    accepted. The result is a C-contiguous array of the datatype's dtype (new, unless `data` is one already).
    """
    info = datatype_info(datatype, name=name)
    dims, count = _check_shape(shape, name)
    if not info.json:
        _fail(name, f"receiving {info.name} data via JSON is not supported, use binary/raw tensor data")
    if not isinstance(data, _NESTED):
        data = [data]
    if info.variable:
        return _bytes_from_python(_flatten(data), dims, count, name, "data")
    if type(data) is list and 0 < len(data) == count <= _SMALL:
        small = _small_numbers(data, info)
        if small is not None:
            return _reshape(small, dims, name)
    source: Any = data
    try:
        array = np.asarray(data)
    except (ValueError, TypeError, OverflowError):  # ragged nesting: numpy refuses it, count the leaves
        source = _flatten(data)
        try:
            array = np.asarray(source)
        except (ValueError, TypeError, OverflowError):
            return _from_leaves(source, info, dims, count, name, "data")
    if array.size != count:
        _count_error(name, dims, count, array.size, "data")
    if count == 0:
        return _reshape(np.empty(0, dtype=info.dtype), dims, name)
    out = _fast_numbers(array, source, info)
    if out is None:  # something is wrong (or unusual, like integers beyond 64 bits): check element by element
        return _from_leaves(_flatten(source), info, dims, count, name, "data")
    return _reshape(out, dims, name)


_SMALL: Final = 256  # flat lists up to this length are checked in Python: cheaper than numpy's whole-array calls
_INT_ONLY: Final = frozenset({int})
_PLAIN_NUMBERS: Final = frozenset({int, float})
_FLOAT_MAX: Final = {
    d.name: float(np.finfo(d.dtype).max) for d in datatypes.DATATYPES if d.dtype.kind == "f" and d.dtype.itemsize >= 4
}


def _small_numbers(data: list[Any], info: DatatypeInfo) -> Array | None:
    """A short flat list of plain Python numbers in the datatype, or None when the general path must judge:
    integer datatypes take whole numbers in range, float32/float64 take ints and floats that cannot overflow
    (JSON has no NaN or infinity). Booleans, strings and nested lists go the general way."""
    family = _FAMILY[info.name]
    kinds = set(map(type, data))  # exact types: bool is not int here
    if family == "int":
        if kinds != _INT_ONLY:
            if not kinds <= _PLAIN_NUMBERS or not all(v.is_integer() for v in data if type(v) is float):
                return None
            data = list(map(int, data))  # whole numbers written with a fraction (1.0): exact as Python ints
        low, high = _INT_RANGE[info.name]
        if min(data) < low or max(data) > high:
            return None
        return np.array(data, dtype=info.dtype)
    limit = _FLOAT_MAX.get(info.name)
    if limit is not None:
        if not kinds <= _PLAIN_NUMBERS:
            return None
        if max(max(data), -min(data)) > limit:
            return None
        return np.array(data, dtype=info.dtype)
    return None


def _fast_numbers(array: Array, source: Any, info: DatatypeInfo) -> Array | None:
    """`array` (numpy's reading of `source`) in the datatype, or None when the slow path must judge."""
    kind = array.dtype.kind
    family = _FAMILY[info.name]
    if family == "bool":
        return array.astype(info.dtype, copy=False) if kind == "b" else None
    if family == "int":
        if kind not in "iuf":
            return None
        if kind == "f" and not _integral_floats(array):  # integral numbers written with a fraction (1.0)
            return None
        low, high = _INT_RANGE[info.name]
        if int(array.min()) < low or int(array.max()) > high:
            return None
    elif kind not in "iuf":
        return None
    if not isinstance(source, np.ndarray) and _has_bools(array, source):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        out = array.astype(info.dtype, copy=False)
    if family == "float" and kind == "f" and out.dtype.itemsize < array.dtype.itemsize and _overflowed(array, out):
        return None
    return out


_EXACT_FLOAT: Final = 2.0**53  # below it, float64 holds every integer exactly (numpy reads [1.0, 2**53 + 1] as floats)


def _integral_floats(array: Array) -> bool:
    """Whether every float is a whole number below 2**53 in magnitude, where float64 is exact; beyond it the
    slow path judges each element as the parser gave it."""
    low, high = float(array.min()), float(array.max())
    if not (low > -_EXACT_FLOAT and high < _EXACT_FLOAT):  # also NaN
        return False
    return bool((np.trunc(array) == array).all())


def _has_bools(array: Array, source: Any) -> bool:
    """Whether numpy read a boolean as 0 or 1: checks the type of the elements equal to 0 or 1, only those."""
    candidates = (array == 0) | (array == 1)
    if not candidates.any():
        return False
    if array.ndim == 1 and isinstance(source, list):
        leaves: Iterable[Any] = map(source.__getitem__, np.flatnonzero(candidates).tolist())
    else:
        leaves = np.array(source, dtype=object).reshape(-1)[candidates.reshape(-1)]
    types = set(map(type, leaves))
    return bool in types or np.bool_ in types


def _overflowed(wide: Array, narrow: Array) -> bool:
    """Whether narrowing floats turned a finite value into an infinity."""
    narrow_inf = np.isinf(narrow)
    return bool(narrow_inf.any()) and bool((narrow_inf & np.isfinite(wide)).any())


def _from_leaves(
    leaves: list[Any], info: DatatypeInfo, dims: tuple[int, ...], count: int, name: str, where: str
) -> Array:
    """The reference path: checks each element, naming the first bad one, then converts."""
    if len(leaves) != count:
        _count_error(name, dims, count, len(leaves), where)
    family = _FAMILY[info.name]
    values: list[Any]
    if family == "bool":
        for i, value in enumerate(leaves):
            if not isinstance(value, _BOOLS):
                _fail(name, f"BOOL element {i} must be a boolean (true/false), got {describe(value)}")
        values = leaves
    elif family == "int":
        low, high = _INT_RANGE[info.name]
        values = []
        for i, value in enumerate(leaves):
            if isinstance(value, _BOOLS) or not isinstance(value, _NUMBERS):
                _fail(name, f"{info.name} element {i} must be an integer, got {describe(value)}")
            number = value
            if not isinstance(value, _INTS):  # a JSON number with a fraction: fine when it is whole (1.0 is 1)
                if not float(value).is_integer():
                    _fail(name, f"{info.name} element {i} must be an integer, got {describe(value)}")
                number = int(value)
            if not low <= number <= high:
                _fail(name, f"{info.name} element {i} is out of range [{low}, {high}]: {value}")
            values.append(int(number))
    else:
        values = []
        for i, value in enumerate(leaves):
            if isinstance(value, _BOOLS) or not isinstance(value, _NUMBERS):
                _fail(name, f"{info.name} element {i} must be a number, got {describe(value)}")
            try:
                values.append(float(value))
            except OverflowError:
                _fail(name, f"{info.name} element {i} is out of range: {value}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.array(values, dtype=info.dtype).reshape(-1)
    if family == "float" and out.size:
        wide = np.array(values, dtype=np.float64)
        if _overflowed(wide, out):
            i = int(np.argmax(np.isinf(out) & np.isfinite(wide)))
            _fail(name, f"{info.name} element {i} is out of range: {values[i]}")
    return _reshape(out, dims, name)


def _bytes_from_python(leaves: list[Any], dims: tuple[int, ...], count: int, name: str, where: str) -> Array:
    """BYTES elements from strings (UTF-8 encoded) or bytes-like objects."""
    if len(leaves) != count:
        _count_error(name, dims, count, len(leaves), where)
    if leaves and type(leaves[0]) is bytes and set(map(type, leaves)) == {bytes}:  # from gRPC
        return _object_array(leaves, dims, name)
    try:
        return _object_array(list(map(str.encode, leaves)), dims, name)
    except (TypeError, UnicodeEncodeError):
        pass  # not all str (bytes from gRPC, or bad elements), or a lone surrogate: sorted out below
    items: list[bytes] = []
    for i, value in enumerate(leaves):
        if isinstance(value, str):
            try:
                items.append(value.encode())
            except UnicodeEncodeError:
                _fail(name, f"BYTES element {i} is not valid Unicode (a lone surrogate)")
        elif isinstance(value, bytes | bytearray | memoryview):
            items.append(bytes(value))
        else:
            _fail(name, f"BYTES element {i} must be a string, got {describe(value)}")
    return _object_array(items, dims, name)


def to_json(array: npt.ArrayLike, datatype: str | None = None, *, name: str = "") -> list[Any]:
    """Encode `array` as a flat row-major JSON-ready list (Python bools, ints, floats; BYTES as str).

    BYTES elements must be valid UTF-8 (CodecError otherwise: send them as binary data). FP16 and BF16 have no
    JSON form. With `datatype`, the array is first converted to it (see `to_raw`).
    """
    arr, info = _prepare(array, datatype, name)
    if not info.json:
        _fail(name, f"sending {info.name} data via JSON is not supported, use binary/raw tensor data")
    items: list[Any] = arr.ravel().tolist()  # ravel: the same flat list as reshape(-1), at half the call's cost
    if not info.variable or arr.dtype.kind == "U":
        return items
    try:
        return list(map(bytes.decode, items))
    except (TypeError, UnicodeDecodeError):
        pass  # str elements, or bytes that are not UTF-8: the loop below sorts them out
    out: list[Any] = []
    for i, value in enumerate(items):
        if isinstance(value, str):
            out.append(value)
            continue
        try:
            out.append(_as_bytes(value, i, name).decode())
        except UnicodeDecodeError:
            _fail(name, f"BYTES element {i} is not valid UTF-8, so it cannot be JSON; send it as binary data")
    return out


# --- raw bytes --------------------------------------------------------------------------------------------


def from_raw(buf: Buffer, datatype: str, shape: Sequence[int], *, name: str = "") -> Array:
    """Decode raw little-endian row-major bytes (gRPC `raw_*_contents`, REST binary data) to an array.

    Fixed-size types are zero-copy: the array is a view of `buf`, read-only when `buf` is (`bytes`: copy the
    array to modify it), possibly unaligned. The size must be exactly count x element size. BOOL bytes must
    be 0 or 1. BYTES is a 4-byte little-endian length and the bytes per element, exactly `count` of them and
    nothing after; the result is an object array of `bytes`.
    """
    info = datatype_info(datatype, name=name)
    dims, count = _check_shape(shape, name)
    try:
        view = memoryview(buf)
    except TypeError:
        _fail(name, f"raw data must be bytes-like, got {type(buf).__name__}")
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if info.variable:
        return _bytes_from_raw(view, dims, count, name)
    expected = count * info.size
    if view.nbytes != expected:
        _fail(
            name,
            f"raw data for shape {_shape_text(dims)} must be {expected} bytes "
            f"({count} {info.name} elements of {info.size} bytes), got {view.nbytes}",
        )
    if _FAMILY[info.name] == "bool":
        octets = np.frombuffer(view, dtype=np.uint8)
        if octets.size and int(octets.max()) > 1:
            i = int(np.argmax(octets > 1))
            _fail(name, f"BOOL element {i} is byte {int(octets[i])}; raw BOOL bytes must be 0 or 1")
        return _reshape(octets.view(info.dtype), dims, name)
    return _reshape(np.frombuffer(view, dtype=info.dtype), dims, name)


def _bytes_from_raw(view: memoryview, dims: tuple[int, ...], count: int, name: str) -> Array:
    size = view.nbytes
    if count * _U32.size > size:  # also bounds the allocation below by the buffer, not by the shape
        _fail(
            name,
            f"BYTES raw data for shape {_shape_text(dims)} needs at least {count * _U32.size} bytes "
            f"(a 4-byte length per element), got {size}",
        )
    raw = view.obj if isinstance(view.obj, bytes) and len(view.obj) == size else view.tobytes()
    unpack = _U32.unpack_from
    items: list[bytes] = []
    append = items.append
    pos = 0
    i = 0
    try:
        for i in range(count):
            (length,) = unpack(raw, pos)
            pos += 4
            end = pos + length
            if end > size:
                _fail(
                    name,
                    f"BYTES raw data is truncated: element {i} declares {length} bytes at offset {pos}, "
                    f"{size - pos} remain",
                )
            append(raw[pos:end])
            pos = end
    except struct.error:  # fewer than 4 bytes left for a length
        _fail(name, f"BYTES raw data is truncated: element {i} has no 4-byte length at offset {pos}")
    if pos != size:
        _fail(name, f"BYTES raw data has {size - pos} bytes left over after its {count} elements")
    return _object_array(items, dims, name)


def to_raw(array: npt.ArrayLike, datatype: str | None = None, *, name: str = "") -> bytes | memoryview:
    """Encode `array` as raw little-endian row-major bytes.

    Fixed-size types return a byte `memoryview` that aliases `array` when it already is little-endian and
    C-contiguous (no copy; call `bytes()` on it where bytes are required, as in protobuf fields), except that a
    small array already of the datatype's dtype returns its bytes. BYTES
    returns `bytes` framed as a 4-byte LE length and the bytes per element; elements may be bytes, str
    (UTF-8), np.bytes_ or np.str_. With `datatype`, the array is first converted to it where no value changes
    meaning (see `as_datatype`); anything else is a CodecError.
    """
    if type(array) is np.ndarray and type(datatype) is str:  # an answer's usual array: of its datatype already
        known = datatypes.BY_NAME.get(datatype)
        if known is not None and array.dtype == known.dtype:
            if array.dtype.kind == "O":  # a model's usual text answer
                return _bytes_to_raw(array, name)
            if array.nbytes < COPY_BELOW:
                return array.tobytes()  # small: a copy costs less than making the view
    arr, info = _prepare(array, datatype, name)
    if info.variable:
        return _bytes_to_raw(arr, name)
    if arr is array and datatype is not None and arr.nbytes < COPY_BELOW:
        return arr.tobytes()  # small and of its datatype already: a copy costs less than making the view
    flat = np.ascontiguousarray(arr).reshape(-1)
    return flat.view(np.uint8).data


def _bytes_to_raw(arr: Array, name: str) -> bytes:
    items: list[Any] = arr.ravel().tolist()
    for item in items:  # measured: cheaper than sorting out the types first, for what nearly every array holds
        if type(item) is not bytes:  # str, np.bytes_, anything else: checked and encoded
            items = _bytes_list(arr, name)
            break
    out = bytearray()
    pack = _U32.pack
    try:
        for item in items:  # measured: faster than joining a list of parts
            out += pack(len(item))
            out += item
    except struct.error:
        _fail(name, f"a BYTES element of {len(item)} bytes is longer than a raw element can be (4 GiB)")
    return bytes(out)


def _as_bytes(value: Any, index: int, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            _fail(name, f"BYTES element {index} is not valid Unicode (a lone surrogate)")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    _fail(name, f"BYTES element {index} must be bytes or str, got {describe(value)}")


def _bytes_list(arr: Array, name: str) -> list[bytes]:
    """The elements of a BYTES array as bytes, row-major."""
    items: list[Any] = arr.ravel().tolist()
    types = set(map(type, items))
    if types <= {bytes}:
        return items
    if arr.dtype.kind == "U" or types <= {str}:
        try:
            return list(map(str.encode, items))
        except UnicodeEncodeError:
            pass
    return [_as_bytes(value, i, name) for i, value in enumerate(items)]


def _prepare(array: npt.ArrayLike, datatype: str | None, name: str) -> tuple[Array, DatatypeInfo]:
    """`array` as an ndarray of `datatype` (default: its own), and that datatype's row."""
    if type(array) is np.ndarray and type(datatype) is str:  # an answer's usual array: already of its datatype
        known = datatypes.BY_NAME.get(datatype)
        if known is not None and array.dtype == known.dtype:
            return array, known
    arr = np.asarray(array)
    if datatype is None:
        found = datatypes.name_of_dtype(arr.dtype)
        if found is None:
            _fail(name, f"numpy dtype {arr.dtype} has no Open Inference Protocol datatype")
        info = datatype_info(found, name=name)
    else:
        info = datatype_info(datatype, name=name)
    return _coerce(arr, info, name), info


def holds_bytes_only(array: Array) -> bool:
    """Whether `array` is an object array whose elements are all `bytes`: BYTES as every way decodes it, which
    needs no converting."""
    if array.dtype.kind != "O":
        return False
    for item in array.ravel().tolist():  # noqa: SIM110 (a loop: cheaper than all() or a set of the types)
        if type(item) is not bytes:
            return False
    return True


def as_datatype(array: npt.ArrayLike, datatype: str, *, name: str = "") -> Array:
    """`array` in the numpy dtype of `datatype` (BYTES: an object array of `bytes`, str elements encoded as
    UTF-8), converted only where no value changes meaning; CodecError otherwise.

    This is the one place where arrays become datatypes: the clients convert inputs with it (through `to_raw`,
    `to_json` and `to_contents`), the server what a model returns. Allowed: the same type in another byte order;
    safe casts (bool to numbers, narrower to wider); integers to other integers when every value fits; whole
    floats to integers when every value fits; integers and floats to any float type (rounded to the nearest
    value; finite values that would become infinite fail); numbers that are all 0 or 1 to BOOL; bytes, str and
    object arrays to BYTES.
    """
    info = datatype_info(datatype, name=name)
    arr = _coerce(np.asarray(array), info, name)
    if not info.variable:
        return arr
    if holds_bytes_only(arr):
        return arr
    items = _bytes_list(arr, name)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(arr.shape)


def _first(bad: Array, flat: Array) -> tuple[int, Any]:
    i = int(np.argmax(bad))
    return i, flat[i]


def _coerce(arr: Array, info: DatatypeInfo, name: str) -> Array:
    """`arr` in the dtype of `info` as `as_datatype` converts it, except that BYTES arrays of bytes, str or
    objects are returned as they are (their elements are checked as they are encoded)."""
    dt = arr.dtype
    if dt == info.dtype:
        return arr
    target = _FAMILY[info.name]
    if target == "bytes":
        if dt.kind in "OSU":
            return arr
        _fail(name, f"a {dt} array cannot be {info.name} (an array of bytes or str)")
    source_name = datatypes.name_of_dtype(dt)
    source = _FAMILY.get(source_name) if source_name is not None else None
    if source is None or source == "bytes":
        _fail(name, f"a {dt} array cannot be {info.name}")
    if source_name == info.name or np.can_cast(dt, info.dtype, "safe"):
        return arr.astype(info.dtype)  # another byte order or spelling of the type, or a safe cast
    flat = arr.reshape(-1)
    if target == "int":  # from a wider integer type or from floats
        if source == "float":
            bad = ~(np.isfinite(flat) & (flat == np.trunc(flat)))
            if bad.any():
                i, value = _first(bad, flat)
                _fail(name, f"{info.name} element {i} is not a whole number: {value}")
        low, high = _INT_RANGE[info.name]
        # Floats compare against the first value past the range: float(2**63 - 1) rounds up to 2**63.
        bad = (flat < low) | ((flat >= float(high) + 1) if source == "float" else (flat > high))
        if bad.any():
            i, value = _first(bad, flat)
            _fail(name, f"{info.name} element {i} is out of range [{low}, {high}]: {value}")
        return arr.astype(info.dtype)
    if target == "float":  # from integers or floats, rounded
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(info.dtype)
        if _overflowed(arr.astype(np.float64), out.astype(np.float64)):
            _fail(name, f"values out of range for {info.name}")
        return out
    if target == "bool":  # from numbers that are all 0 or 1
        bad = (flat != 0) & (flat != 1)
        if bad.any():
            i, value = _first(bad, flat)
            _fail(name, f"{info.name} element {i} is {value}: values other than 0 and 1 cannot be {info.name}")
        return arr.astype(info.dtype)
    _fail(name, f"a {dt} array cannot be {info.name}")


# --- gRPC typed contents ----------------------------------------------------------------------------------


def from_contents(
    values: Sequence[Any] | Array, datatype: str, shape: Sequence[int], *, name: str = ""
) -> Array:
    """Decode the typed `InferTensorContents` field of `datatype`: a protobuf repeated field, list or array.

    Values of types narrower than their field (INT8 in int_contents...) are range-checked. The count must
    equal the product of the shape. FP16 and BF16 have no typed field (raw only).
    """
    info = datatype_info(datatype, name=name)
    dims, count = _check_shape(shape, name)
    field = info.contents
    if field is None:
        _fail(name, f"{info.name} has no typed contents field; send it as raw contents")
    got = values.size if isinstance(values, np.ndarray) else len(values)
    if got != count:
        _count_error(name, dims, count, got, field)
    if info.variable:
        return _bytes_from_python(_flatten(values), dims, count, name, field)
    if isinstance(values, list | tuple):  # Python values: checked like JSON
        try:
            array = np.asarray(values)
        except (ValueError, TypeError, OverflowError):
            array = np.asarray(values, dtype=object)
        out = _fast_numbers(array, values, info) if array.ndim == 1 and count else None
        if count == 0:
            out = np.empty(0, dtype=info.dtype)
        if out is None:
            return _from_leaves(list(values), info, dims, count, name, field)
        return _reshape(out, dims, name)
    if isinstance(values, np.ndarray):
        wide = values.reshape(-1)
    else:  # a protobuf repeated field: typed by the field already
        wide = np.fromiter(values, dtype=_CONTENTS_DTYPE[field], count=count)
    return _reshape(_coerce(wide, info, name), dims, name)


def from_contents_message(contents: Any, datatype: str, shape: Sequence[int], *, name: str = "") -> Array:
    """Decode an `InferTensorContents` message: the datatype's field holds the data, the others are empty."""
    info = datatype_info(datatype, name=name)
    values: Any = None
    stray: list[str] = []
    for field, given in contents.ListFields():  # the fields holding values: one call, not a lookup per field
        if field.name == info.contents:
            values = given
        else:
            stray.append(field.name)
    if stray:
        first = next((f for f in datatypes.CONTENTS_FIELDS if f in stray), stray[0])  # in table order
        expected = f"belongs in {info.contents}" if info.contents else "must be sent as raw contents"
        _fail(name, f"unexpected {first} for datatype {info.name}: its data {expected}")
    if info.contents is None:
        _fail(name, f"{info.name} has no typed contents field; send it as raw contents")
    return from_contents(getattr(contents, info.contents) if values is None else values, datatype, shape, name=name)


def to_contents(
    array: npt.ArrayLike, datatype: str | None = None, *, name: str = ""
) -> tuple[str, list[Any]]:
    """The `InferTensorContents` field name for `array`'s datatype and its values as a flat row-major list.

    Fill a message with `getattr(contents, field).extend(values)`. FP16 and BF16 have no typed field.
    """
    arr, info = _prepare(array, datatype, name)
    if info.contents is None:
        _fail(name, f"{info.name} has no typed contents field; send it as raw contents")
    if info.variable:
        return info.contents, _bytes_list(arr, name)
    return info.contents, arr.ravel().tolist()
