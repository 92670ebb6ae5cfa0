"""The Open Inference Protocol server: the model API, the model repository and the data plane.

Write a model by subclassing `Model` (see `model`), put it in a repository folder with a `model.toml` (see
`repository`) or `add` it to a `ModelRepository`, and serve it with `python -m <package> serve`. The data plane
(`DataPlane`) holds the protocol's semantics; the REST and gRPC transports (`server.rest`, `server.grpc`, imported
on demand) only decode requests and encode answers.
"""

from __future__ import annotations

from . import errors, types
from .core.dataplane import DataPlane
from .core.repository import ModelRepository, ModelState, ModelStatus
from .errors import ErrorKind, InvalidRequest, ModelFailure, NotFound, NotReady, OipError, TooLarge, Unimplemented
from .model import InferResult, Model, TensorSpec
from .settings import Settings
from .types import InferRequest, InferResponse, RequestedOutput, Tensor

__all__ = [
    "DataPlane",
    "ErrorKind",
    "InferRequest",
    "InferResponse",
    "InferResult",
    "InvalidRequest",
    "Model",
    "ModelFailure",
    "ModelRepository",
    "ModelState",
    "ModelStatus",
    "NotFound",
    "NotReady",
    "OipError",
    "RequestedOutput",
    "Settings",
    "Tensor",
    "TensorSpec",
    "TooLarge",
    "Unimplemented",
    "errors",
    "types",
]
