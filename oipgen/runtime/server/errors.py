"""One error model for both transports.

The data plane raises `OipError` with a kind; REST maps the kind to a status and the body `{"error": message}`,
gRPC to a status code. A model's own exception becomes MODEL_FAILURE: its message travels, its traceback never.
"""

from __future__ import annotations

import enum

import grpc


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    NOT_READY = "not_ready"
    UNIMPLEMENTED = "unimplemented"
    MODEL_FAILURE = "model_failure"
    TOO_LARGE = "too_large"
    ALREADY_EXISTS = "already_exists"


HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.NOT_READY: 503,  # Settings.not_ready_status may make it 400, as Triton and MLServer answer
    ErrorKind.UNIMPLEMENTED: 501,
    ErrorKind.MODEL_FAILURE: 500,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.ALREADY_EXISTS: 400,  # as Triton (a shared memory region registered twice)
}

GRPC_CODE: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.MODEL_FAILURE: grpc.StatusCode.INTERNAL,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
}


class OipError(Exception):
    """An answer other than success: `kind` says which, `message` says why (for a person)."""

    kind: ErrorKind = ErrorKind.INVALID_ARGUMENT

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
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
