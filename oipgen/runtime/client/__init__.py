"""Clients of the Open Inference Protocol, generated from the spec: REST and gRPC, sync and asyncio.

`RestClient`, `AsyncRestClient`, `GrpcClient` and `AsyncGrpcClient` have the same methods, one per operation of
the spec, with the same arguments and results; errors are the same `OipClientError` subclasses on both
transports. Inference takes numpy arrays (or lists) and returns an `InferResult`:

    with RestClient("http://127.0.0.1:8000") as client:
        result = client.infer("simple", {"INPUT0": a, "INPUT1": b})
        total = result.as_numpy("OUTPUT0")

The REST clients need httpx (the package's `rest` extra), the gRPC clients grpcio and protobuf (`grpc`); neither
needs gevent. Each transport's module (`client.rest`, `client.grpc`) is imported when one of its clients is first
asked for, so an installation with one transport's requirements works without the other's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors, tensors
from .errors import (
    AlreadyExists,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    OipClientError,
    PermissionDenied,
    ResponseError,
    ServerError,
    TooLarge,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from .tensors import InferRequest, InferResult, OutputMetadata, RequestedOutput, Tensor

if TYPE_CHECKING:
    from .grpc import AsyncGrpcClient, GrpcClient
    from .rest import AsyncRestClient, RestClient

__all__ = [
    "AlreadyExists",
    "AsyncGrpcClient",
    "AsyncRestClient",
    "DeadlineExceeded",
    "GrpcClient",
    "InferRequest",
    "InferResult",
    "InvalidArgument",
    "NotFound",
    "OipClientError",
    "OutputMetadata",
    "PermissionDenied",
    "RequestedOutput",
    "ResponseError",
    "RestClient",
    "ServerError",
    "Tensor",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "errors",
    "tensors",
]


# client -> (its module, the extra that installs what that module needs)
_TRANSPORTS: dict[str, tuple[str, str]] = {
    "RestClient": ("rest", "rest"),
    "AsyncRestClient": ("rest", "rest"),
    "GrpcClient": ("grpc", "grpc"),
    "AsyncGrpcClient": ("grpc", "grpc"),
}


def __getattr__(name: str) -> Any:
    """The clients, from their transport's module, imported on first use."""
    if name not in _TRANSPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, extra = _TRANSPORTS[name]
    try:
        loaded = importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:
        raise ImportError(
            f"{name} needs {exc.name or 'a module'} that is not installed (the package's `{extra}` extra): {exc}",
            name=exc.name,
        ) from exc
    return getattr(loaded, name)
