"""REST request bodies: read whole (bounded by `Settings.max_request_bytes`, inflated when gzip or deflate),
headers read from the ASGI scope, JSON parsed with errors that say what was wrong."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, overload

import orjson
from starlette.requests import Request

from ... import framing
from ..errors import InvalidRequest, TooLarge

__all__ = ["HEADER_LENGTH", "header", "header_value", "json_kind", "parse_json", "read_body"]


@overload
async def read_body(request: Request, limit: int) -> bytes: ...
@overload
async def read_body(request: Request, limit: int, *, view: Literal[True]) -> bytes | memoryview: ...
async def read_body(request: Request, limit: int, *, view: bool = False) -> bytes | memoryview:
    """The whole request body, refused (413) as soon as it is known to exceed `limit` bytes. With `view`, a large
    uncompressed body of a declared size is received into one buffer of that size as it arrives, and returned as a
    read-only view of it: the body is held once, never as its pieces and their concatenation at the same time."""
    declared = header(request, b"content-length")
    size = None
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest(f"invalid Content-Length {declared!r}") from None
        if size > limit:
            raise TooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    encoding = (header(request, b"content-encoding") or "").strip().lower()
    identity = encoding in ("", "identity")
    buffer = bytearray(size) if view and identity and size is not None and size >= _ONE_BUFFER_FROM else None
    chunks: list[bytes] = []
    total = 0
    receive = request.receive  # the ASGI messages themselves: Request.stream's generator costs more per request
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # Gone, or closed by the HTTP layer for pausing too long: nobody reads the answer.
            raise InvalidRequest("the connection closed before the request body arrived")
        chunk = message.get("body", b"")
        if chunk:
            end = total + len(chunk)
            if end > limit or (buffer is not None and end > len(buffer)):
                raise TooLarge(f"request body exceeds the limit of {limit} bytes")
            if buffer is not None:
                buffer[total:end] = chunk
            else:
                chunks.append(chunk)
            total = end
        if not message.get("more_body", False):
            break
    if buffer is not None:
        return memoryview(buffer).toreadonly()[:total]
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if identity:
        return body
    if encoding in ("gzip", "deflate"):
        return await asyncio.to_thread(_inflate, body, encoding, limit)  # off the loop: it can take a while
    raise InvalidRequest(f"unsupported Content-Encoding {encoding!r}; send gzip, deflate or identity")


_ONE_BUFFER_FROM: Final = 1 << 16  # declared body bytes from which `read_body(view=True)` fills one buffer
HEADER_LENGTH: Final = framing.HEADER_LENGTH.lower().encode("latin-1")


def header(request: Request, name: bytes) -> str | None:
    """The value of the request's header `name` (lowercase, as ASGI gives header names), None when it has none.
    Read from the ASGI scope: Starlette's `Headers.get` raises and catches a KeyError for each absent header, and the
    inference path asks for three that are mostly absent."""
    return header_value(request.scope["headers"], name)


def header_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The value of header `name` (lowercase) in `headers` (name and value pairs, names lowercase), None when absent."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


# Inflating a compressed body: in chunks of _INFLATE_CHUNK, keeping at most _INFLATE_KEEP inflated bytes while the
# size is unknown. A body that inflates beyond that is first only counted (its output dropped chunk by chunk), so a
# body that inflates beyond the limit is refused having held at most _INFLATE_KEEP + _INFLATE_CHUNK bytes; one
# within the limit is inflated again in one call with its exact size as the output buffer's (CPython then hands
# that buffer over as the bytes object: the peak is the body's size, not twice it).
_INFLATE_CHUNK: Final = 1024 * 1024
_INFLATE_KEEP: Final = 16 * 1024 * 1024


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed body, inflated to at most `limit` bytes; memory bounded as said above."""
    wbits = zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS
    kept: list[bytes] | None = []
    size = 0
    for chunk in _inflated_chunks(body, wbits, encoding):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body inflates beyond the limit of {limit} bytes")
        if kept is not None:
            kept.append(chunk)
            if size > _INFLATE_KEEP:
                kept = None  # too large to keep twice: count the rest, then inflate again into one buffer
    if kept is not None:
        return kept[0] if len(kept) == 1 else b"".join(kept)
    return zlib.decompress(body, wbits, size)  # valid and `size` bytes long: the first pass said so


def _inflated_chunks(body: bytes, wbits: int, encoding: str) -> Iterator[bytes]:
    """The inflated body, _INFLATE_CHUNK bytes at a time; 400 if it is not valid or is truncated."""
    inflater = zlib.decompressobj(wbits)
    pending = body
    try:
        while True:
            chunk = inflater.decompress(pending, _INFLATE_CHUNK)
            pending = inflater.unconsumed_tail
            if chunk:
                yield chunk
            if inflater.eof or (not chunk and not pending):
                break
    except zlib.error as exc:
        raise InvalidRequest(f"request body is not valid {encoding} data: {exc}") from None
    if not inflater.eof:
        raise InvalidRequest(f"request body is truncated {encoding} data")


def parse_json(data: bytes | memoryview, what: str, *, unique_keys: bool = False) -> Any:
    """`data` as JSON, the one dialect of every REST body: RFC 8259 as orjson reads it (no NaN or Infinity, no
    number that overflows a double, no lone surrogate, valid UTF-8, nesting at most 1024 deep); InvalidRequest
    naming `what` otherwise. With `unique_keys`, an object in which a key appears twice is refused too."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
    if unique_keys and isinstance(doc, dict | list):
        _refuse_repeated_keys(data, what)
    return doc


def _refuse_repeated_keys(data: bytes | memoryview, what: str) -> None:
    """InvalidRequest if an object of `data` (valid JSON: orjson read it) repeats a key. orjson keeps the last of
    repeated keys without saying so; the standard library's parser shows every key, and reads any text orjson
    does (it is the more lenient of the two), so it only looks for repeats here."""
    try:
        _PAIRS.decode(str(data, "utf-8", "surrogatepass"))  # the text as json.loads reads it, without a copy first
    except _RepeatedKey as exc:
        raise InvalidRequest(f"key '{exc.key}' appears more than once in {what}") from None
    except RecursionError:  # deeper than this thread's stack allows, within orjson's 1024 levels
        raise InvalidRequest(f"{what} is nested too deeply") from None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(items: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)


# Made once: json.loads with a hook makes a decoder per call, half the cost of a small generate body's check.
_PAIRS: Final = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"

