"""REST binary tensor data framing (Triton's binary tensor data extension), for the clients and the server alike.

A body is either JSON alone, or a JSON header of `Inference-Header-Content-Length` bytes followed by the binary
data of the tensors whose parameters carry `binary_data_size`, in the order the header lists them. Requests ask for
outputs as binary data with the `binary_data` output parameter, or with the `binary_data_output` request parameter
for the outputs they do not list. `split` cuts a received body in two, `BinaryData` hands out each tensor's bytes
(views, never copies), `join` writes a body. Malformed framing raises `FramingError` (a `ValueError`) whose
message names the problem; a server answers it as a bad request, a client as a bad response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from . import extensions

__all__ = [
    "BINARY_DATA",
    "BINARY_DATA_OUTPUT",
    "BINARY_DATA_SIZE",
    "BINARY_TYPE",
    "HEADER_LENGTH",
    "JSON_TYPE",
    "BinaryData",
    "FramingError",
    "join",
    "join_raw",
    "size_of",
    "split",
]

HEADER_LENGTH: Final = "Inference-Header-Content-Length"
"""The header giving the byte length of the JSON part of a body with binary data."""
BINARY_DATA_SIZE: Final = extensions.BINARY_DATA_SIZE
"""Tensor parameter: the tensor's data is this many bytes of the binary part."""
BINARY_DATA: Final = extensions.BINARY_DATA
"""Requested-output parameter (bool): answer this output as binary data."""
BINARY_DATA_OUTPUT: Final = extensions.BINARY_DATA_OUTPUT
"""Request parameter (bool): answer the outputs the request does not list as binary data."""
JSON_TYPE: Final = "application/json"
BINARY_TYPE: Final = "application/octet-stream"


class FramingError(ValueError):
    """A body whose binary framing is wrong; the message says how."""


def size_of(chunk: bytes | memoryview) -> int:
    """The byte length of a chunk of tensor data."""
    return chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)


def split(body: bytes | memoryview, header_length: str | None) -> tuple[bytes | memoryview, memoryview | None]:
    """The JSON part of `body` and its binary part (None without an `Inference-Header-Content-Length`)."""
    if header_length is None:
        return body, None
    try:
        length = int(header_length)
    except ValueError:
        raise FramingError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < length <= len(body):
        raise FramingError(f"{HEADER_LENGTH} {length} is out of range for a body of {len(body)} bytes")
    view = memoryview(body)
    return view[:length], view[length:]


class BinaryData:
    """The binary part of a body, handed out tensor by tensor in order (`take`), as views of the body."""

    __slots__ = ("_data", "_offset")

    def __init__(self, data: memoryview | None) -> None:
        self._data = data
        self._offset = 0

    def take(self, size: Any, where: str) -> memoryview:
        """The next `size` bytes, for `where` (the tensor, for messages): `size` is a tensor's
        `binary_data_size`; FramingError when it is not a size or more than what remains."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FramingError(f"{where}: '{BINARY_DATA_SIZE}' must be a non-negative integer, got {size!r}")
        data = self._data
        if data is None:
            raise FramingError(f"{where} has {BINARY_DATA_SIZE} but the body has no {HEADER_LENGTH} header")
        start = self._offset
        remaining = len(data) - start
        if size > remaining:
            raise FramingError(
                f"unexpected size for {where}: expecting {size} more bytes of binary data, {remaining} remain"
            )
        self._offset = start + size
        return data[start:start + size]

    def finish(self) -> None:
        """FramingError when bytes are left after the last tensor."""
        if self._data is not None and self._offset != len(self._data):
            raise FramingError(
                f"unexpected additional binary data: {len(self._data) - self._offset} bytes after the last tensor"
            )


def join(header: bytes, chunks: Sequence[bytes | memoryview]) -> tuple[bytes, dict[str, str]]:
    """A body of the JSON `header` followed by the binary `chunks`, and its headers (`Content-Type`, and
    `Inference-Header-Content-Length` when there is binary data)."""
    if not chunks:
        return header, {"Content-Type": JSON_TYPE}
    return b"".join([header, *chunks]), headers(header)


def headers(header: bytes) -> dict[str, str]:
    """The headers of a body of the JSON `header` followed by binary data."""
    return {"Content-Type": BINARY_TYPE, HEADER_LENGTH: str(len(header))}


def join_raw(header: bytes, chunks: Sequence[bytes | memoryview]) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """`join`, with the headers as an ASGI server sends them (lower-case names and values as latin-1 bytes)."""
    if not chunks:
        return header, _RAW_JSON
    return b"".join([header, *chunks]), [_RAW_BINARY, (_RAW_HEADER_LENGTH, str(len(header)).encode("latin-1"))]


_RAW_JSON: Final = [(b"content-type", JSON_TYPE.encode("latin-1"))]  # never changed: its readers copy it
_RAW_BINARY: Final = (b"content-type", BINARY_TYPE.encode("latin-1"))
_RAW_HEADER_LENGTH: Final = HEADER_LENGTH.lower().encode("latin-1")
