"""Helpers shared by the REST and gRPC clients: request bodies, headers, answers."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, TypeAlias, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from .. import bodies
from .errors import InvalidArgument, ResponseError, ServerError

Headers: TypeAlias = Mapping[str, str]
"""HTTP headers (REST) or call metadata (gRPC, keys lower-cased)."""

_B = TypeVar("_B", bound=BaseModel)


def body(kind: type[_B], values: Mapping[str, Any]) -> _B:
    """A request body from a method's arguments (None: absent), validated by its model."""
    try:
        return kind.model_validate({key: value for key, value in values.items() if value is not None})
    except ValidationError as exc:
        raise InvalidArgument(f"invalid arguments for {kind.__name__}: {exc}") from None


def b64(value: bytes | None) -> dict[str, str] | None:
    """Bytes as the protocol's JSON form, `{"b64": "<base64>"}`."""
    if value is None:
        return None
    return {"b64": base64.b64encode(bytes(value)).decode("ascii")}


def given(**arguments: str) -> str:
    """The arguments that were given, for an error message."""
    named = [f"{key}={value!r}" for key, value in arguments.items() if value]
    return ", ".join(named) or "none"


def merge(first: Headers | None, second: Headers | None) -> Headers | None:
    """Headers of `first`, overridden by `second`."""
    if not first:
        return second
    if not second:
        return first
    return {**first, **second}


# --- answers --------------------------------------------------------------------------------------------------


def validated(kind: type[_B], body: Any) -> _B:
    """An answer's pydantic model; ResponseError when the answer does not fit it."""
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        raise ResponseError(f"the server's answer is not a valid {kind.__name__}: {exc}") from None


def validated_list(adapter: TypeAdapter[list[_B]], body: Any) -> list[_B]:
    """An answer that is a list of pydantic models; ResponseError when it does not fit."""
    try:
        return adapter.validate_python(body)
    except ValidationError as exc:
        raise ResponseError(f"the server's answer is not valid: {exc}") from None


def read_answer(schema: str, body: Any, rest_only: Mapping[str, Any]) -> Any:
    """The answer `body` of `schema` (a REST body, or the converter's form of a gRPC reply) checked against its
    schema, with the fields it leaves out at their default (as Triton writes REST statistics and
    configurations), so that an answer reads the same whichever transport and server gave it; REST-only
    properties keep the answer's value when it has one, else the value in `rest_only`."""
    try:
        return bodies.read(schema, body, rest_only)
    except ValueError as exc:
        raise ResponseError(f"the server's answer is not a valid {schema}: {exc}") from None


class EventReader:
    """Server-sent events, line by line (the lines of a `text/event-stream` body, without their line ends):
    `feed` returns the data of the event that a blank line completes, else None. Comments and fields other than
    `data` are skipped; an event cut off by the end of the body is dropped, as the format says."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


def event_answer(data: str, status: int) -> dict[str, Any]:
    """One event of a generate stream as a JSON object; an `{"error": ...}` event raises ServerError."""
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ResponseError(f"an event of the server's stream is not JSON: {exc}", status=status) from None
    if not isinstance(answer, dict):
        raise ResponseError(f"an event of the server's stream is not a JSON object: {data[:200]}", status=status)
    error = answer.get("error")
    if isinstance(error, str) and len(answer) == 1:
        raise ServerError(error, status=status)
    return answer
