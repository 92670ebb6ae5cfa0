"""One error model for both transports.

The data plane raises `OipError` with a kind; REST maps the kind to a status and the body `{"error": message}`,
gRPC to a status code. A model's own exception becomes MODEL_FAILURE: its message travels, its traceback never.

Messages echo what the client sent (names, keys, values), and a client may send 60,000 characters of name:
`bounded` cuts every quoted value to `MAX_ECHO` characters and the whole message to `MAX_MESSAGE`. Every message
that leaves the server passes through it: `OipError` applies it, and each transport applies it to the few
errors that are not `OipError`s (codec and converter errors, the framework's own).
"""

from __future__ import annotations

import enum
import re
from typing import Final

import grpc


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    NOT_READY = "not_ready"
    UNIMPLEMENTED = "unimplemented"
    MODEL_FAILURE = "model_failure"
    TOO_LARGE = "too_large"
    ALREADY_EXISTS = "already_exists"
    CANCELLED = "cancelled"
    EXHAUSTED = "exhausted"  # a server-wide limit is reached (shared memory regions, mapped bytes)


HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.NOT_READY: 503,  # Settings.not_ready_status may make it 400, as Triton and MLServer answer
    ErrorKind.UNIMPLEMENTED: 501,
    ErrorKind.MODEL_FAILURE: 500,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.ALREADY_EXISTS: 400,  # as Triton (a shared memory region registered twice)
    ErrorKind.CANCELLED: 499,  # the caller went away; recorded, never sent
    ErrorKind.EXHAUSTED: 429,
}

GRPC_CODE: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.MODEL_FAILURE: grpc.StatusCode.INTERNAL,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


MAX_ECHO: Final = 200
"""The most characters of one echoed value (a quoted name, key or value) in an error message."""
MAX_MESSAGE: Final = 1000
"""The most characters of an error message."""
# Quoted runs longer than a clipped value can be (so that bounding a bounded message changes nothing).
_QUOTED: Final = re.compile(rf"'[^'\n]{{{MAX_ECHO + 41},}}'|\"[^\"\n]{{{MAX_ECHO + 41},}}\"")


def clip(value: object, limit: int = MAX_ECHO) -> str:
    """`value` as text of at most about `limit` characters: longer text keeps its start and says how long it was."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def bounded(message: str) -> str:
    """`message` with every long quoted value clipped to `MAX_ECHO` characters, and the whole to `MAX_MESSAGE`;
    bounding a bounded message changes nothing."""
    if len(message) <= MAX_ECHO:
        return message
    message = _QUOTED.sub(lambda m: m[0][0] + clip(m[0][1:-1]) + m[0][-1], message)
    return message if len(message) <= MAX_MESSAGE + 40 else clip(message, MAX_MESSAGE)


class OipError(Exception):
    """An answer other than success: `kind` says which, `message` says why (for a person, `bounded`)."""

    kind: ErrorKind = ErrorKind.INVALID_ARGUMENT

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        message = bounded(message)
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind


class InvalidRequest(OipError):
    kind = ErrorKind.INVALID_ARGUMENT


class NotFound(OipError):
    kind = ErrorKind.NOT_FOUND


class NotReady(OipError):
    kind = ErrorKind.NOT_READY


class Unimplemented(OipError):
    kind = ErrorKind.UNIMPLEMENTED


class ModelFailure(OipError):
    kind = ErrorKind.MODEL_FAILURE


class TooLarge(OipError):
    kind = ErrorKind.TOO_LARGE


class AlreadyExists(OipError):
    kind = ErrorKind.ALREADY_EXISTS


class Cancelled(OipError):
    kind = ErrorKind.CANCELLED


class Exhausted(OipError):
    kind = ErrorKind.EXHAUSTED
