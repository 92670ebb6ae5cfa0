"""The generated numpy codecs: `oip.datatypes` (the datatype table) and `oip.codec` (JSON, raw, contents)."""

from __future__ import annotations

import json
import math
import re
import struct
import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import yaml
from conftest import ROOT
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from oip import codec, datatypes

SPEC = ROOT / "spec" / "datatypes.yaml"

ALL = [d.name for d in datatypes.DATATYPES]
FIXED = [d.name for d in datatypes.DATATYPES if not d.variable]
JSON_TYPES = [d.name for d in datatypes.DATATYPES if d.json]
NO_JSON = [d.name for d in datatypes.DATATYPES if not d.json]
CONTENTS_TYPES = [d.name for d in datatypes.DATATYPES if d.contents]
NO_CONTENTS = [d.name for d in datatypes.DATATYPES if not d.contents]
INTS = [d.name for d in datatypes.DATATYPES if d.dtype.kind in "iu"]
SHAPES = [[0], [2, 0], [1], [], [5], [2, 3], [2, 1, 3]]

BYTES_POOL = [b"", b"a", b"a\x00b", "h\u00e9llo \u2603".encode(), b"\x00", b"xyz" * 10]
NOT_UTF8 = [b"ok", b"\xff\xfe\x80", b"", b"a\x00"]


def info(datatype: str) -> datatypes.DatatypeInfo:
    return datatypes.BY_NAME[datatype]


def sample(datatype: str, shape: list[int]) -> np.ndarray[Any, Any]:
    """A deterministic tensor of `datatype` with the type's extremes, exactly representable in it."""
    row = info(datatype)
    count = math.prod(shape)
    if row.variable:
        out = np.empty(count, dtype=object)
        out[:] = [BYTES_POOL[i % len(BYTES_POOL)] for i in range(count)]
        return out.reshape(shape)
    if row.dtype.kind == "b":
        flags: np.ndarray[Any, Any] = np.arange(count) % 3 == 0
        return flags.reshape(shape)
    if row.dtype.kind in "iu":
        ii = np.iinfo(row.dtype)
        pool = [int(ii.min), int(ii.max), 0, 1, 2, int(ii.max) // 3] + ([-1] if ii.min < 0 else [])
        return np.array([pool[i % len(pool)] for i in range(count)], dtype=row.dtype).reshape(shape)
    pool_f = [0.5, -1.25, 3.0, 0.0, 1.0, 256.0, -0.0078125]
    floats = np.array([pool_f[i % len(pool_f)] for i in range(count)], dtype=np.float64)
    return floats.astype(row.dtype).reshape(shape)


def leaf_count(data: Any) -> int:
    return sum(leaf_count(item) for item in data) if isinstance(data, list | tuple) else 1


def assert_same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()
    if got.dtype == object:
        assert all(type(v) is bytes for v in got.reshape(-1).tolist())


def contents_message_class() -> Any:
    """An `InferTensorContents` message class (fields and numbers as in the protocol) in a private pool."""
    fdp = descriptor_pb2.FileDescriptorProto(name="codec_test.proto", package="codec_test", syntax="proto3")
    msg = fdp.message_type.add(name="InferTensorContents")
    kinds = descriptor_pb2.FieldDescriptorProto
    fields = [
        ("bool_contents", kinds.TYPE_BOOL),
        ("int_contents", kinds.TYPE_INT32),
        ("int64_contents", kinds.TYPE_INT64),
        ("uint_contents", kinds.TYPE_UINT32),
        ("uint64_contents", kinds.TYPE_UINT64),
        ("fp32_contents", kinds.TYPE_FLOAT),
        ("fp64_contents", kinds.TYPE_DOUBLE),
        ("bytes_contents", kinds.TYPE_BYTES),
    ]
    for number, (field, kind) in enumerate(fields, 1):
        msg.field.add(name=field, number=number, type=kind, label=kinds.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("codec_test.InferTensorContents"))


Contents = contents_message_class()


# --- the table ---------------------------------------------------------------------------------------------


def test_table_is_the_spec() -> None:
    rows = yaml.safe_load(SPEC.read_text())["datatypes"]
    assert [r["name"] for r in rows] == ALL
    for row in rows:
        got = info(row["name"])
        want_dtype = np.dtype(ml_dtypes.bfloat16) if row["numpy"] == "bfloat16" else np.dtype(row["numpy"])
        assert (got.size, got.dtype, got.contents, got.json, got.model_config) == (
            row["size"],
            want_dtype,
            row["contents"],
            row["json"],
            row["model_config"],
        )
        assert getattr(datatypes, row["name"]) is got
    assert tuple(ALL) == datatypes.NAMES
    assert datatypes.BY_MODEL_CONFIG["TYPE_STRING"].name == "BYTES"
    assert set(datatypes.CONTENTS_FIELDS) == {r["contents"] for r in rows if r["contents"]}


def test_fixed_sizes_match_dtypes() -> None:
    for row in datatypes.DATATYPES:
        if not row.variable:
            assert row.dtype.itemsize == row.size
            assert row.dtype.byteorder in "<|=", row.name


@pytest.mark.parametrize("datatype", FIXED)
def test_name_of_dtype_any_byte_order(datatype: str) -> None:
    dt = info(datatype).dtype
    assert datatypes.name_of_dtype(dt) == datatype
    assert codec.datatype_of(dt) == datatype
    assert codec.datatype_of(np.zeros(2, dtype=dt)) == datatype
    if dt.byteorder == "<":
        assert datatypes.name_of_dtype(dt.newbyteorder(">")) == datatype
    assert codec.dtype_of(datatype) == dt


@pytest.mark.parametrize(
    "value",
    [object, str, bytes, np.dtype("U3"), np.dtype("S5"), np.array(["a"]), np.array([b"a"], dtype=object)],
)
def test_strings_bytes_and_objects_are_bytes(value: Any) -> None:
    assert codec.datatype_of(value) == "BYTES"


def test_datatype_of_misc() -> None:
    assert codec.datatype_of(ml_dtypes.bfloat16) == "BF16"
    assert codec.datatype_of(np.float16) == "FP16"
    assert codec.datatype_of(bool) == "BOOL"
    assert codec.datatype_of(np.float32(1.5)) == "FP32"
    assert codec.datatype_of(np.dtype("int64")) == "INT64"
    assert codec.datatype_of(np.dtype(np.longlong)) == "INT64"
    assert codec.datatype_of(np.dtype(np.intc)) == "INT32"
    assert codec.dtype_of("BYTES") == np.dtype(object)
    assert datatypes.get("INT322") is None
    assert datatypes.name_of_dtype(np.complex128) is None
    with pytest.raises(codec.CodecError, match="complex128"):
        codec.datatype_of(np.zeros(1, dtype=np.complex128))
    with pytest.raises(codec.CodecError, match="not a numpy array or dtype: 'FP32'"):
        codec.datatype_of("FP32")
    with pytest.raises(codec.CodecError, match="datetime64"):
        codec.to_raw(np.zeros(1, dtype="datetime64[s]"))


def test_unknown_datatype_lists_valid_ones() -> None:
    with pytest.raises(codec.CodecError, match=r"'INT322'.*BOOL, UINT8.*BF16") as exc:
        codec.dtype_of("INT322")
    assert isinstance(exc.value, ValueError)
    with pytest.raises(codec.CodecError, match="unknown datatype"):
        codec.from_json([1], "int32", [1], name="x")
    with pytest.raises(codec.CodecError, match="unknown datatype"):
        codec.from_raw(b"", "STRING", [0])


# --- shapes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "count"),
    [([], 1), ([0], 0), ([2, 3], 6), ([2, 0, 10**12], 0), ((4,), 4), (np.array([3, 2]), 6), ([2.0, 3], 6)],
)
def test_element_count(shape: Any, count: int) -> None:
    assert codec.element_count(shape) == count


@pytest.mark.parametrize("shape", [[-1], [2, -3], [1.5], [True], ["2"], [None], "12", 3, [2**63], [2.0**63], None])
def test_element_count_rejects(shape: Any) -> None:
    with pytest.raises(codec.CodecError, match="shape"):
        codec.element_count(shape, name="IN")


@pytest.mark.parametrize("datatype", ALL)
def test_negative_dims_rejected_everywhere(datatype: str) -> None:
    with pytest.raises(codec.CodecError, match=r"tensor 'X': shape \[2, -1\] is invalid"):
        codec.from_raw(b"", datatype, [2, -1], name="X")
    if info(datatype).json:
        with pytest.raises(codec.CodecError, match="dimension 1 is -1"):
            codec.from_json([], datatype, [2, -1], name="X")
    if info(datatype).contents:
        with pytest.raises(codec.CodecError, match="dimension 1 is -1"):
            codec.from_contents([], datatype, [2, -1], name="X")


@pytest.mark.parametrize("datatype", ALL)
def test_huge_shape_fails_fast_without_allocating(datatype: str) -> None:
    row = info(datatype)
    shape = [1_000_000_000_000]
    calls: list[Any] = [lambda: codec.from_raw(b"\x00" * 12, datatype, shape, name="big")]
    if row.json:
        calls.append(lambda: codec.from_json([[1, 2], [3]], datatype, shape, name="big"))
    if row.contents:
        calls.append(lambda: codec.from_contents([1, 2, 3], datatype, shape, name="big"))
    for call in calls:
        tracemalloc.start()
        try:
            with pytest.raises(codec.CodecError, match="tensor 'big'"):
                call()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000


def test_empty_tensor_with_huge_dims() -> None:
    assert codec.from_json([], "FP32", [0, 10**12]).shape == (0, 10**12)
    with pytest.raises(codec.CodecError, match="too large") as raised:
        codec.from_raw(b"", "FP32", [0, 2**62, 2**62])
    with pytest.raises(codec.CodecError, match=r"^tensor 'E': shape \[0, 4611686018427387904\] is too large") as js:
        codec.from_json([], "FP32", [0, 2**62], name="E")
    for error in (raised.value, js.value):  # the protocol's words, not numpy's
        assert "arr.size" not in str(error) and "itemsize" not in str(error)


INTEGERS = [name for name in ALL if info(name).dtype.kind in "iu"]


@pytest.mark.parametrize("datatype", INTEGERS)
def test_json_integral_numbers_are_integers(datatype: str) -> None:
    """JSON has one number type: 1.0 is the integer 1 (clients generated from the OpenAPI document send it)."""
    low, high = int(np.iinfo(info(datatype).dtype).min), int(np.iinfo(info(datatype).dtype).max)
    ints = [0, 1, 7, max(low, -8), min(high, 100)]
    for data in ([float(v) for v in ints], [ints[0], *map(float, ints[1:])], [[float(v)] for v in ints]):
        got = codec.from_json(data, datatype, [5])
        assert_same(got, np.array(ints, dtype=info(datatype).dtype))
    many = [float(v % 100) for v in range(1000)]  # beyond the small-list path
    assert codec.from_json(many, datatype, [1000]).tolist() == [v % 100 for v in range(1000)]
    fraction = rf"^tensor 'I': {datatype} element 1 must be an integer, got number 0\.5$"
    with pytest.raises(codec.CodecError, match=fraction):
        codec.from_json([1.0, 0.5], datatype, [2], name="I")
    for value in (v for v in (float(high + 1), float(low - 1)) if not low <= v <= high):  # -2.0**63 is in INT64
        message = rf"^tensor 'I': {datatype} element 0 is out of range .*: {re.escape(str(value))}$"
        with pytest.raises(codec.CodecError, match=message):
            codec.from_json([value], datatype, [1], name="I")


def test_json_integral_numbers_beyond_float_precision() -> None:
    # numpy would read a mix of 1.0 and 2**53 + 1 as float64 and round the integer: each element keeps its value
    assert codec.from_json([1.0, 2**53 + 1], "INT64", [2]).tolist() == [1, 2**53 + 1]
    assert codec.from_json([1.0, 2**64 - 1], "UINT64", [2]).tolist() == [1, 2**64 - 1]
    assert codec.from_json([float(2**62)], "INT64", [1]).tolist() == [2**62]
    for datatype, value in (("INT64", 2.0**63), ("UINT64", 2.0**64), ("INT64", 1e300), ("UINT8", 300.0)):
        message = rf"{datatype} element 0 is out of range .*: {re.escape(str(value))}$"
        with pytest.raises(codec.CodecError, match=message):
            codec.from_json([value], datatype, [1])
    with pytest.raises(codec.CodecError, match=r"element 0 is out of range .*: 18446744073709551616$"):
        codec.from_json([2**64], "INT64", [1])
    with pytest.raises(codec.CodecError, match=r"BOOL element 0 must be a boolean .*got number 1\.0"):
        codec.from_json([1.0], "BOOL", [1])


# --- round trips -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_round_trip(datatype: str, shape: list[int]) -> None:
    array = sample(datatype, shape)
    data = codec.to_json(array)
    assert isinstance(data, list)
    assert len(data) == array.size
    wire = json.loads(json.dumps(data))  # JSON-ready: plain Python values only
    assert_same(codec.from_json(wire, datatype, shape), array)
    if datatype == "BYTES":
        nested: Any = np.array([v.decode() for v in array.reshape(-1).tolist()], dtype=object)
        nested = nested.reshape(shape).tolist()
    else:
        nested = array.tolist()
    assert_same(codec.from_json(nested, datatype, shape), array)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("datatype", ALL)
def test_raw_round_trip(datatype: str, shape: list[int]) -> None:
    array = sample(datatype, shape)
    raw = codec.to_raw(array)
    if not info(datatype).variable:
        assert len(raw) == array.size * info(datatype).size
        assert bytes(raw) == array.astype(info(datatype).dtype).tobytes()
    for buf in (bytes(raw), bytearray(raw), memoryview(bytes(raw))):
        assert_same(codec.from_raw(buf, datatype, shape), array)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("datatype", CONTENTS_TYPES)
def test_contents_round_trip(datatype: str, shape: list[int]) -> None:
    array = sample(datatype, shape)
    field, values = codec.to_contents(array)
    assert field == info(datatype).contents
    assert isinstance(values, list)
    message = Contents()
    getattr(message, field).extend(values)
    assert_same(codec.from_contents(getattr(message, field), datatype, shape), array)
    assert_same(codec.from_contents_message(message, datatype, shape), array)
    assert_same(codec.from_contents(values, datatype, shape), array)
    parsed = Contents.FromString(message.SerializeToString())
    assert_same(codec.from_contents(getattr(parsed, field), datatype, shape), array)


def test_raw_layout_is_little_endian_row_major() -> None:
    int16s = np.array([[1, 2], [3, 4]], dtype=np.int16)
    assert bytes(codec.to_raw(int16s)) == b"\x01\x00\x02\x00\x03\x00\x04\x00"
    assert bytes(codec.to_raw(np.array([True, False, True]))) == b"\x01\x00\x01"
    assert bytes(codec.to_raw(np.array([1.0], dtype=np.float32))) == struct.pack("<f", 1.0)
    assert bytes(codec.to_raw(np.array([1.0], dtype=ml_dtypes.bfloat16))) == b"\x80\x3f"
    assert bytes(codec.to_raw(np.array([1.0], dtype=np.float16))) == b"\x00\x3c"
    fortran = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert bytes(codec.to_raw(fortran)) == np.arange(6, dtype="<i4").tobytes()
    strided = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    assert bytes(codec.to_raw(strided)) == np.array([0, 2, 4, 6, 8, 10], dtype="<i8").tobytes()
    # Named with their datatype, as the server writes its answers (a small array of it is copied, not viewed).
    assert bytes(codec.to_raw(int16s, "INT16")) == b"\x01\x00\x02\x00\x03\x00\x04\x00"
    assert bytes(codec.to_raw(fortran, "INT32")) == np.arange(6, dtype="<i4").tobytes()
    assert bytes(codec.to_raw(strided, "INT64")) == np.array([0, 2, 4, 6, 8, 10], dtype="<i8").tobytes()


@pytest.mark.parametrize("datatype", [d for d in FIXED if info(d).size > 1])
def test_big_endian_arrays_encode_little_endian(datatype: str) -> None:
    array = sample(datatype, [2, 3])
    if array.dtype.byteorder not in "<=":
        pytest.skip("no byte order to swap")
    big = array.astype(array.dtype.newbyteorder(">"))
    assert codec.datatype_of(big) == datatype
    assert bytes(codec.to_raw(big)) == array.astype(info(datatype).dtype).tobytes()
    assert_same(codec.from_raw(codec.to_raw(big), datatype, [2, 3]), array)
    if info(datatype).json:
        assert codec.to_json(big) == codec.to_json(array)
    if info(datatype).contents:
        assert codec.to_contents(big) == codec.to_contents(array)


def test_from_raw_is_zero_copy() -> None:
    buf = bytearray(np.arange(6, dtype="<f4").tobytes())
    array = codec.from_raw(buf, "FP32", [2, 3])
    assert np.shares_memory(array, np.frombuffer(buf, dtype=np.uint8))
    buf[0:4] = struct.pack("<f", 42.0)
    assert array[0, 0] == 42.0
    frozen = codec.from_raw(bytes(buf), "FP32", [2, 3])
    assert not frozen.flags.writeable
    booleans = bytearray(b"\x01\x00")
    assert np.shares_memory(codec.from_raw(booleans, "BOOL", [2]), np.frombuffer(booleans, dtype=np.uint8))
    halves = bytearray(b"\x80\x3f\x00\x40")
    decoded = codec.from_raw(halves, "BF16", [2])
    assert decoded.dtype == ml_dtypes.bfloat16
    assert decoded.tolist() == [1.0, 2.0]
    assert np.shares_memory(decoded, np.frombuffer(halves, dtype=np.uint8))


def test_from_raw_accepts_unaligned_slices() -> None:
    body = b"JSONHEADER!" + np.array([1.5, -2.0], dtype="<f8").tobytes() + b"tail"
    view = memoryview(body)[11:27]
    assert codec.from_raw(view, "FP64", [2]).tolist() == [1.5, -2.0]


def test_to_raw_is_zero_copy_when_already_little_endian_contiguous() -> None:
    array = np.arange(10, dtype="<i4")
    raw = codec.to_raw(array)
    assert isinstance(raw, memoryview)
    assert np.shares_memory(np.frombuffer(raw, dtype=np.uint8), array)
    large = np.arange(1 << 15, dtype="<i4")
    assert np.shares_memory(np.frombuffer(codec.to_raw(large, "INT32"), dtype=np.uint8), large)


# --- BYTES -------------------------------------------------------------------------------------------------


def test_bytes_framing() -> None:
    array = np.array([b"", b"a\x00b", b"\xff"], dtype=object)
    raw = codec.to_raw(array)
    assert isinstance(raw, bytes)
    assert raw == b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00a\x00b" + b"\x01\x00\x00\x00\xff"
    decoded = codec.from_raw(raw, "BYTES", [3])
    assert decoded.dtype == object
    assert decoded.tolist() == [b"", b"a\x00b", b"\xff"]


@pytest.mark.parametrize(
    "array",
    [
        np.array(["h\u00e9", "", "a\x00"], dtype=object),
        np.array(["h\u00e9", "", "a\x00"]),  # numpy's U and S dtypes drop trailing NULs by themselves
        np.array([b"h\xc3\xa9", b"", b"a\x00"], dtype=object),
        np.array([b"h\xc3\xa9", b"", b"a\x00"]),
        np.array([np.str_("h\u00e9"), bytearray(b""), np.bytes_(b"a\x00")], dtype=object),
    ],
)
def test_bytes_encoders_accept_str_and_bytes(array: np.ndarray[Any, Any]) -> None:
    want = [b"h\xc3\xa9", b"", b"a\x00" if array.dtype == object else b"a"]
    assert codec.datatype_of(array) == "BYTES"
    assert codec.from_raw(codec.to_raw(array), "BYTES", [3]).tolist() == want
    assert codec.to_contents(array) == ("bytes_contents", want)
    assert codec.to_json(array) == [w.decode() for w in want]


def test_bytes_not_utf8_round_trips_binary_but_not_json() -> None:
    array = np.empty(len(NOT_UTF8), dtype=object)
    array[:] = NOT_UTF8
    assert codec.from_raw(codec.to_raw(array), "BYTES", [4]).tolist() == NOT_UTF8
    field, values = codec.to_contents(array)
    message = Contents()
    getattr(message, field).extend(values)
    assert codec.from_contents_message(message, "BYTES", [2, 2]).tolist() == [NOT_UTF8[:2], NOT_UTF8[2:]]
    with pytest.raises(codec.CodecError, match=r"tensor 'OUT': BYTES element 1 is not valid UTF-8.*binary"):
        codec.to_json(array, name="OUT")


def test_bytes_from_json() -> None:
    got = codec.from_json([["a", "\u0000"], ["\u00e9", ""]], "BYTES", [2, 2])
    assert got.tolist() == [[b"a", b"\x00"], ["\u00e9".encode(), b""]]
    assert got.dtype == object
    assert codec.from_json([["a"], ["b", "c"]], "BYTES", [3]).tolist() == [b"a", b"b", b"c"]  # ragged
    assert codec.from_json("solo", "BYTES", [1]).tolist() == [b"solo"]
    with pytest.raises(codec.CodecError, match="lone surrogate"):
        codec.from_json(["ok", "\ud800"], "BYTES", [2])


@pytest.mark.parametrize(
    ("raw", "shape", "message"),
    [
        (b"\x05\x00", [1], "needs at least 4 bytes"),
        (b"\x05\x00\x00\x00ab", [1], r"truncated: element 0 declares 5 bytes at offset 4, 2 remain"),
        (b"\x00\x00\x00\x00\x01\x00\x00", [2], "needs at least 8 bytes"),
        (
            b"\x01\x00\x00\x00a" + b"\x02\x00\x00",
            [2],
            "truncated: element 1 has no 4-byte length at offset 5",
        ),
        (b"\x01\x00\x00\x00a" + b"\x02\x00\x00\x00b", [2], "truncated: element 1 declares 2 bytes"),
        (b"\x01\x00\x00\x00ab", [1], "1 bytes left over after its 1 elements"),
        (b"\x00\x00\x00\x00" * 3, [2], "4 bytes left over"),
        (b"\x00", [0], "1 bytes left over"),
        (b"\xff\xff\xff\xff" + b"x" * 10, [1], "declares 4294967295 bytes"),
    ],
)
def test_bytes_raw_framing_errors(raw: bytes, shape: list[int], message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.from_raw(raw, "BYTES", shape, name="S")


def test_bytes_raw_empty_elements() -> None:
    assert codec.from_raw(b"", "BYTES", [0]).shape == (0,)
    assert codec.from_raw(b"", "BYTES", [2, 0]).shape == (2, 0)
    assert codec.from_raw(b"\x00" * 8, "BYTES", [1, 2]).tolist() == [[b"", b""]]


# --- JSON: forms and strictness ----------------------------------------------------------------------------


def test_nested_flat_and_ragged_are_the_same_tensor() -> None:
    want = np.array([[1, 2], [4, 5]], dtype=np.int32)
    for data in ([[1, 2], [4, 5]], [1, 2, 4, 5], [[1, 2, 4], [5]], [[[1]], [2, [4, 5]]], ([1, 2], (4, 5))):
        assert_same(codec.from_json(data, "INT32", [2, 2]), want)
    assert_same(codec.from_json([[1, 2], [4, 5]], "INT32", [4]), want.reshape(4))
    assert_same(codec.from_json([[1.5, 2], [4]], "FP32", [3]), np.array([1.5, 2, 4], dtype=np.float32))
    assert_same(codec.from_json([[True], [False, True]], "BOOL", [3]), np.array([True, False, True]))


def test_json_scalars_and_numpy_input() -> None:
    assert_same(codec.from_json(7, "INT64", []), np.array(7, dtype=np.int64))
    assert_same(codec.from_json([7], "INT64", [1]), np.array([7], dtype=np.int64))
    assert_same(codec.from_json(np.array([[1, 2]]), "UINT16", [2]), np.array([1, 2], dtype=np.uint16))
    assert_same(codec.from_json([], "BOOL", [0]), np.zeros(0, dtype=bool))
    assert_same(codec.from_json([[], []], "FP64", [2, 0]), np.zeros((2, 0)))


@pytest.mark.parametrize(
    ("data", "shape", "message"),
    [
        ([1, 2, 3], [2, 2], r"shape \[2, 2\] needs 4 elements, data has 3"),
        ([1, 2, 3, 4, 5], [2, 2], "needs 4 elements, data has 5"),
        ([[1, 2], [3, 4]], [3], "needs 3 elements, data has 4"),
        ([[1, 2], [3]], [2, 2], "needs 4 elements, data has 3"),
        ([], [1], "needs 1 elements, data has 0"),
        ([1], [0], "needs 0 elements, data has 1"),
    ],
)
@pytest.mark.parametrize("datatype", ["INT32", "FP32"])
def test_json_count_mismatch(datatype: str, data: Any, shape: list[int], message: str) -> None:
    with pytest.raises(codec.CodecError, match=f"^tensor 'IN': .*{message}"):
        codec.from_json(data, datatype, shape, name="IN")


def test_json_count_mismatch_other_types() -> None:
    with pytest.raises(codec.CodecError, match="needs 3 elements, data has 2"):
        codec.from_json(["a", "b"], "BYTES", [3])
    with pytest.raises(codec.CodecError, match="needs 1 elements, data has 2"):
        codec.from_json([True, False], "BOOL", [1])


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT32", ["1"], "INT32 element 0 must be an integer, got string '1'"),
        ("INT32", [1.5], "element 0 must be an integer, got number 1.5"),
        ("INT32", [1, 2.5], "element 1 must be an integer, got number 2.5"),
        ("INT32", [1.0, 0.5], "element 1 must be an integer, got number 0.5"),
        ("INT64", [[1.0, 2.0], [3.25]], "element 2 must be an integer, got number 3.25"),
        ("UINT8", [1.0] * 300 + [1e-9], "element 300 must be an integer, got number 1e-09"),
        ("INT64", [None], "got null"),
        ("INT32", [5, True], "element 1 must be an integer, got true"),
        ("INT32", [[0, 2], [True, 3]], "element 2 must be an integer, got true"),
        ("UINT8", [[1], [2, False]], "element 2 must be an integer, got false"),
        ("INT16", [{"a": 1}], "got object"),
        ("BOOL", [0, 1], "BOOL element 0 must be a boolean .*got integer 0"),
        ("BOOL", [True, 1], "BOOL element 1 must be a boolean"),
        ("BOOL", ["true"], "got string 'true'"),
        ("FP32", [True], "FP32 element 0 must be a number, got true"),
        ("FP32", [1.5, True], "FP32 element 1 must be a number, got true"),
        ("FP64", [[1.0], [False, 2.0]], "FP64 element 1 must be a number, got false"),
        ("FP64", [0.0, 1, 1.0, True], "FP64 element 3 must be a number, got true"),
        ("FP32", ["1.5"], "FP32 element 0 must be a number, got string '1.5'"),
        ("FP32", [None, 1.0], "got null"),
        ("BYTES", [1], "BYTES element 0 must be a string, got integer 1"),
        ("BYTES", ["a", 2.5], "BYTES element 1 must be a string, got number 2.5"),
        ("BYTES", [None], "got null"),
        ("BYTES", [True], "got true"),
    ],
)
def test_json_bad_elements(datatype: str, data: list[Any], message: str) -> None:
    shape = [leaf_count(data)]
    with pytest.raises(codec.CodecError, match=f"^tensor 'IN': .*{message}"):
        codec.from_json(data, datatype, shape, name="IN")


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("UINT8", [300], r"UINT8 element 0 is out of range \[0, 255\]: 300"),
        ("UINT8", [1, -1], r"element 1 is out of range \[0, 255\]: -1"),
        ("UINT32", [-1], "UINT32 element 0 is out of range"),
        ("UINT16", [65536], "out of range"),
        ("INT8", [128], "out of range"),
        ("INT8", [-129], "out of range"),
        ("INT32", [2**31], "out of range"),
        ("INT64", [2**63], r"out of range \[-9223372036854775808, 9223372036854775807\]"),
        ("INT64", [-1, 2**63], "element 1 is out of range"),
        ("UINT64", [2**64], "out of range"),
        ("UINT64", [-1, 2**63], "element 0 is out of range"),
        ("FP32", [1.0, 1e300], "FP32 element 1 is out of range"),
        ("FP32", [10**400], "out of range"),
    ],
)
def test_json_out_of_range(datatype: str, data: list[Any], message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.from_json(data, datatype, [len(data)], name="IN")


@pytest.mark.parametrize("datatype", INTS)
def test_json_integer_limits_are_accepted(datatype: str) -> None:
    ii = np.iinfo(info(datatype).dtype)
    got = codec.from_json([int(ii.min), int(ii.max)], datatype, [2])
    assert got.tolist() == [int(ii.min), int(ii.max)]
    assert got.dtype == info(datatype).dtype


def test_json_numbers_for_floats() -> None:
    assert_same(codec.from_json([1, 2, 0, 1], "FP32", [4]), np.array([1, 2, 0, 1], dtype=np.float32))
    assert_same(codec.from_json([10**30, 1.5], "FP64", [2]), np.array([1e30, 1.5]))
    assert_same(codec.from_json([2**64 - 1], "UINT64", [1]), np.array([2**64 - 1], dtype=np.uint64))
    special = codec.from_json([float("nan"), float("inf"), -float("inf")], "FP32", [3])
    assert np.isnan(special[0]) and special[1] == np.inf and special[2] == -np.inf
    out = codec.to_json(special)
    assert math.isnan(out[0]) and out[1:] == [math.inf, -math.inf]


def test_json_values_are_python_types() -> None:
    assert [type(v) for v in codec.to_json(np.array([1], dtype=np.uint8))] == [int]
    assert [type(v) for v in codec.to_json(np.array([1], dtype=np.float32))] == [float]
    assert [type(v) for v in codec.to_json(np.array([True]))] == [bool]
    assert codec.to_json(np.array([[1, 2], [3, 4]], dtype=np.int8)) == [1, 2, 3, 4]
    assert codec.to_json(np.array(5, dtype=np.int32)) == [5]


@pytest.mark.parametrize("datatype", NO_JSON)
def test_no_json_for_fp16_bf16(datatype: str) -> None:
    with pytest.raises(
        codec.CodecError, match=f"tensor 'T': receiving {datatype} data via JSON is not supported"
    ):
        codec.from_json([1.0], datatype, [1], name="T")
    with pytest.raises(codec.CodecError, match="use binary/raw"):
        codec.to_json(sample(datatype, [2]), name="T")
    with pytest.raises(codec.CodecError, match=r"sending .* via JSON is not supported"):
        codec.to_json(np.array([1.0]), datatype)


@pytest.mark.parametrize("datatype", NO_CONTENTS)
def test_no_typed_contents_for_fp16_bf16(datatype: str) -> None:
    with pytest.raises(codec.CodecError, match=f"{datatype} has no typed contents field; send it as raw"):
        codec.to_contents(sample(datatype, [2]))
    with pytest.raises(codec.CodecError, match="no typed contents"):
        codec.from_contents([1.0], datatype, [1])
    message = Contents()
    message.fp32_contents.append(1.0)
    with pytest.raises(codec.CodecError, match=r"unexpected fp32_contents .* must be sent as raw"):
        codec.from_contents_message(message, datatype, [1])
    with pytest.raises(codec.CodecError, match="no typed contents"):
        codec.from_contents_message(Contents(), datatype, [1])


def test_json_1m_floats_round_trip() -> None:
    # Speed is measured by `make bench-build`'s codec figures, never asserted here.
    data = json.loads(json.dumps(np.random.default_rng(0).random(1_000_000).tolist()))
    array = codec.from_json(data, "FP32", [1000, 1000])
    assert array.dtype == np.dtype("<f4") and array.shape == (1000, 1000)
    assert np.array_equal(array.ravel(), np.asarray(data, dtype=np.float32))


# --- raw: sizes and values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", FIXED)
def test_raw_size_mismatch(datatype: str) -> None:
    size = info(datatype).size
    for got in (0, 3 * size, 4 * size + 1, 5 * size):
        with pytest.raises(
            codec.CodecError, match=f"tensor 'R': raw data for shape \\[2, 2\\] must be {4 * size} "
        ):
            codec.from_raw(b"\x00" * got, datatype, [2, 2], name="R")


def test_raw_bool_bytes_must_be_0_or_1() -> None:
    assert codec.from_raw(b"\x00\x01", "BOOL", [2]).tolist() == [False, True]
    with pytest.raises(codec.CodecError, match="BOOL element 2 is byte 2"):
        codec.from_raw(b"\x00\x01\x02", "BOOL", [3])


def test_raw_rejects_non_buffers() -> None:
    with pytest.raises(codec.CodecError, match="bytes-like"):
        codec.from_raw([1, 2], "UINT8", [2])  # type: ignore[arg-type]


# --- encoding with an explicit datatype --------------------------------------------------------------------


def test_encode_with_explicit_datatype() -> None:
    assert bytes(codec.to_raw(np.array([1, 2]), "INT8")) == b"\x01\x02"
    assert bytes(codec.to_raw(np.array([1.5]), "FP32")) == struct.pack("<f", 1.5)
    assert bytes(codec.to_raw(np.array([1.0], dtype=np.float32), "BF16")) == b"\x80\x3f"
    assert bytes(codec.to_raw(np.array([3], dtype=np.uint8), "FP16")) == np.array([3], dtype="<f2").tobytes()
    assert codec.to_json(np.array([7], dtype=np.int64), "UINT8") == [7]
    assert codec.to_contents(np.array([1, 2], dtype=np.int64), "INT16") == ("int_contents", [1, 2])
    assert codec.to_raw(np.array(["x"]), "BYTES") == b"\x01\x00\x00\x00x"
    with pytest.raises(codec.CodecError, match=r"INT8 element 1 is out of range \[-128, 127\]: 300"):
        codec.to_raw(np.array([1, 300]), "INT8", name="O")
    # Whole floats to integers, bools to numbers, 0 and 1 to BOOL: no value changes meaning.
    assert bytes(codec.to_raw(np.array([1.0, -2.0]), "INT32")) == np.array([1, -2], "<i4").tobytes()
    assert codec.to_json(np.array([True, False]), "INT8") == [1, 0]
    assert codec.to_json(np.array([0, 1]), "BOOL") == [False, True]
    with pytest.raises(codec.CodecError, match=r"INT32 element 1 is not a whole number: 1\.5"):
        codec.to_raw(np.array([1.0, 1.5]), "INT32")
    with pytest.raises(codec.CodecError, match=r"INT64 element 0 is out of range .*: 9.2\d*e\+18"):
        codec.to_raw(np.array([2.0**63]), "INT64")
    with pytest.raises(codec.CodecError, match="a int64 array cannot be BYTES"):
        codec.to_raw(np.array([1]), "BYTES")
    with pytest.raises(codec.CodecError, match="BOOL element 1 is 2: values other than 0 and 1 cannot be BOOL"):
        codec.to_raw(np.array([1, 2]), "BOOL")
    with pytest.raises(codec.CodecError, match="a <U1 array cannot be INT32"):
        codec.to_raw(np.array(["a"]), "INT32")
    with pytest.raises(codec.CodecError, match="out of range"):
        codec.to_raw(np.array([1e300]), "FP32")
    with pytest.raises(codec.CodecError, match="values out of range for FP16"):
        codec.to_raw(np.array([70000]), "FP16")  # an integer that would become infinite
    with pytest.raises(codec.CodecError, match="BYTES element 1 must be bytes or str, got integer 3"):
        codec.to_raw(np.array([b"a", 3], dtype=object))


# --- typed contents ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "field", "values", "message"),
    [
        ("INT8", "int_contents", [1, 128], r"INT8 element 1 is out of range \[-128, 127\]: 128"),
        ("INT16", "int_contents", [-40000], "INT16 element 0 is out of range"),
        ("UINT8", "uint_contents", [256], "UINT8 element 0 is out of range"),
        ("UINT16", "uint_contents", [7, 70000], "UINT16 element 1 is out of range"),
    ],
)
def test_contents_narrowing_is_range_checked(
    datatype: str, field: str, values: list[int], message: str
) -> None:
    message_ = Contents()
    getattr(message_, field).extend(values)
    with pytest.raises(codec.CodecError, match=f"tensor 'C': {message}"):
        codec.from_contents(getattr(message_, field), datatype, [len(values)], name="C")
    with pytest.raises(codec.CodecError, match=message):
        codec.from_contents(values, datatype, [len(values)])


def test_contents_errors() -> None:
    message = Contents()
    message.uint_contents.extend([1, 2])
    with pytest.raises(
        codec.CodecError, match="unexpected uint_contents for datatype INT32: its data belongs in"
    ):
        codec.from_contents_message(message, "INT32", [2], name="C")
    with pytest.raises(codec.CodecError, match=r"needs 3 elements, uint_contents has 2"):
        codec.from_contents_message(message, "UINT32", [3], name="C")
    several = Contents()
    several.fp32_contents.append(1.0)
    several.int_contents.append(1)  # field 2, before uint_contents (4) on the wire and in ListFields()
    several.uint_contents.append(1)
    with pytest.raises(codec.CodecError, match="unexpected uint_contents for datatype FP32"):  # in table order
        codec.from_contents_message(several, "FP32", [1], name="C")
    with pytest.raises(codec.CodecError, match=r"INT32 element 0 must be an integer, got number 1\.5"):
        codec.from_contents([1.5], "INT32", [1])
    with pytest.raises(codec.CodecError, match="BOOL element 0 must be a boolean"):
        codec.from_contents([1], "BOOL", [1])
    with pytest.raises(codec.CodecError, match="BYTES element 0 must be a string, got integer 1"):
        codec.from_contents([1], "BYTES", [1])
    with pytest.raises(codec.CodecError, match="INT32 element 0 is not a whole number"):
        codec.from_contents(np.array([1.5]), "INT32", [1])
    with pytest.raises(codec.CodecError, match="must be an integer, got array"):
        codec.from_contents([[1, 2]], "INT32", [1])
    assert codec.from_contents(["\u00e9"], "BYTES", [1]).tolist() == [b"\xc3\xa9"]
    assert_same(codec.from_contents(np.array([1, 2]), "INT8", [2]), np.array([1, 2], dtype=np.int8))


def test_contents_64_bit_extremes() -> None:
    message = Contents()
    message.uint64_contents.extend([0, 2**64 - 1])
    message.int64_contents.extend([-(2**63), 2**63 - 1])
    assert codec.from_contents(message.uint64_contents, "UINT64", [2]).tolist() == [0, 2**64 - 1]
    assert codec.from_contents(message.int64_contents, "INT64", [2]).tolist() == [-(2**63), 2**63 - 1]
