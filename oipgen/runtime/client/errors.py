"""The client's errors: one hierarchy for both transports.

Every error the clients raise is an `OipClientError`. It carries the server's message (`message`), the HTTP
status (`status`, REST) or the gRPC status code (`code`, gRPC), whichever transport answered, and its class says
what kind of failure it is, the same class over REST and gRPC:

| class              | REST status        | gRPC code                                   |
|--------------------|--------------------|---------------------------------------------|
| InvalidArgument    | 400, 422           | INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE |
| AlreadyExists      | 409                | ALREADY_EXISTS (an InvalidArgument: servers answer 400 over REST) |
| NotFound           | 404                | NOT_FOUND                                   |
| Unavailable        | 502, 503, no connection | UNAVAILABLE                            |
| Unimplemented      | 405, 501           | UNIMPLEMENTED                               |
| ServerError        | 500, other 5xx     | INTERNAL, UNKNOWN, DATA_LOSS                |
| TooLarge           | 413                | RESOURCE_EXHAUSTED                          |
| DeadlineExceeded   | 408, 504, timeouts | DEADLINE_EXCEEDED                           |
| Unauthenticated    | 401                | UNAUTHENTICATED                             |
| PermissionDenied   | 403                | PERMISSION_DENIED                           |
| ResponseError      | an answer that does not follow the protocol (undecodable body, bad tensor data) |

A server configured to answer "not ready" with 400 (as Triton and MLServer do) gives InvalidArgument over REST.
Errors found before anything is sent (a tensor that cannot be encoded, an argument of the wrong type) are
InvalidArgument with neither `status` nor `code`.

This module does not import grpc, so the REST client works where grpcio is not installed: gRPC codes are mapped
by their names, and `code` is the `grpc.StatusCode` the gRPC client received.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    import grpc

__all__ = [
    "AlreadyExists",
    "DeadlineExceeded",
    "InvalidArgument",
    "NotFound",
    "OipClientError",
    "PermissionDenied",
    "ResponseError",
    "ServerError",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "from_grpc",
    "from_http",
]


class OipClientError(Exception):
    """A request that did not succeed.

    `message` is the server's own message (the `error` of a REST error body, the details of a gRPC status) or,
    for failures without an answer, what went wrong. `status` is the HTTP status when a REST server answered,
    `code` the `grpc.StatusCode` when a gRPC server answered; the other one is None.
    """

    def __init__(self, message: str, *, status: int | None = None, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        where = f"HTTP {self.status}" if self.status is not None else (self.code.name if self.code else "")
        return f"[{where}] {self.message}" if where else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status!r}, code={self.code!r})"


class InvalidArgument(OipClientError):
    """The request is invalid: bad tensors, shapes, datatypes or parameters (400 / INVALID_ARGUMENT)."""


class AlreadyExists(InvalidArgument):
    """The thing to create exists already, a shared memory region say (409 / ALREADY_EXISTS; Triton and this
    package's server answer 400 over REST, which is InvalidArgument)."""


class NotFound(OipClientError):
    """Unknown model, version or region (404 / NOT_FOUND)."""


class Unavailable(OipClientError):
    """The server or the model is not ready, or cannot be reached (503 / UNAVAILABLE)."""


class Unimplemented(OipClientError):
    """The server does not implement this operation (501, 405 / UNIMPLEMENTED)."""


class ServerError(OipClientError):
    """The server or the model failed (500 / INTERNAL)."""


class TooLarge(OipClientError):
    """The request is larger than the server accepts (413 / RESOURCE_EXHAUSTED)."""


class DeadlineExceeded(OipClientError):
    """The request timed out (a client timeout, 504 / DEADLINE_EXCEEDED)."""


class Unauthenticated(OipClientError):
    """The server wants credentials (401 / UNAUTHENTICATED)."""


class PermissionDenied(OipClientError):
    """The credentials do not allow this request (403 / PERMISSION_DENIED)."""


class ResponseError(OipClientError):
    """The server's answer does not follow the protocol, so the client cannot read it."""


HTTP_ERRORS: Final[dict[int, type[OipClientError]]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    405: Unimplemented,
    408: DeadlineExceeded,
    409: AlreadyExists,
    413: TooLarge,
    422: InvalidArgument,
    429: Unavailable,
    500: ServerError,
    501: Unimplemented,
    502: Unavailable,
    503: Unavailable,
    504: DeadlineExceeded,
}
"""HTTP status -> error class; other 4xx statuses give OipClientError, other 5xx ServerError."""

GRPC_ERRORS: Final[dict[str, type[OipClientError]]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "FAILED_PRECONDITION": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "ALREADY_EXISTS": AlreadyExists,
    "NOT_FOUND": NotFound,
    "UNAVAILABLE": Unavailable,
    "UNIMPLEMENTED": Unimplemented,
    "INTERNAL": ServerError,
    "UNKNOWN": ServerError,
    "DATA_LOSS": ServerError,
    "RESOURCE_EXHAUSTED": TooLarge,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
}
"""gRPC status code name (`grpc.StatusCode.NAME.name`) -> error class; other codes give OipClientError."""


def http_message(status: int, content: bytes) -> str:
    """The server's message in an error answer: `{"error": ...}` as the protocol says, FastAPI's `{"detail":
    ...}`, or the body's text."""
    try:
        body: Any = orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if value is not None and key == "detail":
                return orjson.dumps(value).decode()
    text = content.decode("utf-8", "replace").strip()
    return text[:2000] if text else f"HTTP {status} with no message"


def from_http(status: int, content: bytes) -> OipClientError:
    """The error for a REST answer with status `status` (not 2xx) and body `content`."""
    kind = HTTP_ERRORS.get(status) or (ServerError if status >= 500 else OipClientError)
    return kind(http_message(status, content), status=status)


def from_grpc(error: grpc.RpcError) -> OipClientError:
    """The error for a failed gRPC call (`grpc.RpcError`, `grpc.aio.AioRpcError`)."""
    code_of = getattr(error, "code", None)
    details_of = getattr(error, "details", None)
    code = code_of() if callable(code_of) else None
    details = details_of() if callable(details_of) else None
    loaded = sys.modules.get("grpc")  # a gRPC error means grpc is imported; this module never imports it
    if loaded is None or not isinstance(code, loaded.StatusCode):
        return OipClientError(str(error) or type(error).__name__)
    kind = GRPC_ERRORS.get(code.name, OipClientError)
    return kind(str(details) if details else code.name, code=code)
