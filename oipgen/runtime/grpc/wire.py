"""Protobuf messages beyond what protobuf offers, for the gRPC clients and server (and the REST forms of messages).

- Raw tensor fields as views: a large `raw_input_contents` or `raw_output_contents` is cut out of the serialized
  message as views of the received bytes (`split_field`), and written after the rest of the message from the
  tensors' own memory (`field_entries`), so tensor data is never copied into or out of a protobuf message. The
  bytes are what protobuf reads and writes: a parser reads repeated entries in order wherever they are.
- `with_defaults`: the REST JSON form of a message completed with the fields proto3 leaves out at their default,
  as Triton writes REST statistics and model configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

__all__ = ["ONE_BYTE_VARINTS", "field_entries", "read_varint", "split_field", "varint", "with_defaults"]

ONE_BYTE_VARINTS: Final = tuple(bytes((n,)) for n in range(0x80))
"""The varint of each integer below 128, by value: `ONE_BYTE_VARINTS[n] if n < 128 else varint(n)` writes one
without a call where it is written per request."""


def varint(value: int) -> bytes:
    """The base-128 varint of a non-negative integer."""
    if value < 0x80:
        return ONE_BYTE_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; ValueError (IndexError when truncated) if malformed."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def split_field(data: bytes, number: int) -> tuple[bytes, list[memoryview]]:
    """The top-level fields of a serialized message other than length-delimited field `number` (as bytes), and
    that field's entries as views of `data`. ValueError or IndexError when `data` is not well-formed."""
    view = memoryview(data)
    keep: list[memoryview] = []
    found: list[memoryview] = []
    pos, size = 0, len(data)
    while pos < size:
        start = pos
        key, pos = read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            pos = read_varint(data, pos)[1]
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = read_varint(data, pos)
            if key >> 3 == number:
                if pos + length > size:
                    raise ValueError("truncated field")
                found.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if pos > size:
            raise ValueError("truncated field")
        keep.append(view[start:pos])
    return b"".join(keep), found


def field_entries(number: int, entries: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """The serialized entries of length-delimited field `number` (tag, length, bytes each), to write after the
    rest of a message."""
    tag = varint(number << 3 | 2)
    parts: list[bytes | memoryview] = []
    for entry in entries:  # written per answer: small sizes' varints looked up, not made
        size = entry.nbytes if type(entry) is memoryview else len(entry)
        parts += (tag, ONE_BYTE_VARINTS[size] if size < 0x80 else varint(size), entry)
    return parts


def _repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6.31; `label` is deprecated there
    return bool(flag) if flag is not None else bool(field.label == field.LABEL_REPEATED)


def with_defaults(out: Any, message: Any) -> None:
    """Complete `out`, the REST form of `message` (or of each message of a repeated field), with the fields at
    their default: scalars, enums, lists and maps without presence, recursively through the message fields
    present. Oneof members that are not set stay out."""
    if isinstance(out, list):
        for item, entry in zip(out, message, strict=False):
            with_defaults(item, entry)
        return
    if not isinstance(out, dict):
        return
    for field in message.DESCRIPTOR.fields:
        name = field.name
        value = getattr(message, name)
        kind = field.message_type
        if kind is not None and kind.GetOptions().map_entry:
            entries = out.setdefault(name, {})
            if kind.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    if str(key) in entries:
                        with_defaults(entries[str(key)], item)
        elif _repeated(field):
            items = out.setdefault(name, [])
            if kind is not None:
                with_defaults(items, value)
        elif kind is not None:
            if name in out:
                with_defaults(out[name], value)
        elif field.containing_oneof is None and name not in out:
            if field.enum_type is not None:
                out[name] = field.enum_type.values_by_number[0].name
            elif field.type == field.TYPE_BYTES:
                out[name] = ""
            else:
                out[name] = value  # the default: 0, 0.0, False or ""
