"""Clients of the Open Inference Protocol, generated from the spec: REST and gRPC, sync and asyncio.

`RestClient`, `AsyncRestClient`, `GrpcClient` and `AsyncGrpcClient` have the same methods, one per operation of
the spec, with the same arguments and results; errors are the same `OipClientError` subclasses on both
transports. Inference takes numpy arrays (or lists) and returns an `InferResult`:

    with RestClient("http://127.0.0.1:8000") as client:
        result = client.infer("simple", {"INPUT0": a, "INPUT1": b})
        total = result.as_numpy("OUTPUT0")

The REST clients need httpx and orjson, the gRPC clients grpcio and protobuf; neither needs gevent.
"""

from __future__ import annotations

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
from .grpc import AsyncGrpcClient, GrpcClient
from .rest import AsyncRestClient, RestClient
from .tensors import InferRequest, InferResult, OutputMetadata, RequestedOutput, Tensor

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
