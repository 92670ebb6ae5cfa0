"""One error model for both transports.

The data plane raises `OipError` with a kind; each transport maps the kind to its answer (REST: a status and the
body `{"error": message}`, `rest.handlers.HTTP_STATUS`; gRPC: a status code, `grpc.servicer.GRPC_CODE`). Anything
else a request raises becomes one of these through `failure`, the one place that classifies exceptions: a model's
own exception becomes MODEL_FAILURE (its message travels, its traceback never), a bug "internal server error".

Messages echo what the client sent (names, keys, values), and a client may send 60,000 characters of name:
`bounded` cuts every quoted value to `MAX_ECHO` characters and the whole message to `MAX_MESSAGE`. Every message
that leaves the server passes through it: `OipError` applies it, and `failure` makes every other exception an
`OipError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import re
from typing import Final

from ..codec import CodecError
from ..convert_base import ConvertError

log = logging.getLogger(__name__)


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


# Exceptions that mean the caller went away: the request's coroutine or generator was stopped, or its call cancelled.
_CANCELLED: Final = (asyncio.CancelledError, concurrent.futures.CancelledError, GeneratorExit)


def failure(exc: BaseException, doing: str = "") -> OipError:
    """`exc` as the protocol's error: an OipError as it is; a value the codec or the converters refuse (a request
    that does not decode, an answer that does not encode) INVALID_ARGUMENT; a cancellation CANCELLED; anything else
    MODEL_FAILURE with the message "internal server error (<its type>)". Such an unexpected exception is logged with
    its traceback when `doing` says what the server was doing ("answering a REST request"); the traceback never
    leaves the server."""
    if isinstance(exc, OipError):
        return exc
    if isinstance(exc, CodecError | ConvertError):
        return InvalidRequest(str(exc))
    if isinstance(exc, _CANCELLED):
        return Cancelled("the request was cancelled")
    if doing:
        log.error("unexpected error %s", doing, exc_info=exc)
    return ModelFailure(f"internal server error ({type(exc).__name__})")
