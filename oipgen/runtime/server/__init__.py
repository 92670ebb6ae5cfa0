"""The Open Inference Protocol server: the model API, the model repository, the data plane and both transports.

Write a model by subclassing `Model` (see `model`), put it in a repository folder with a `model.toml` (see
`core.repository`) or `add` it to a `ModelRepository`, and serve it with `python -m <package> serve`. The data
plane (`DataPlane`) holds the protocol's semantics; the REST and gRPC transports (`create_app`,
`create_grpc_server`, `Servicer`) only decode requests and encode answers; `Observer`s are told about every
inference. `Assembly` builds them all over a repository, and `serve` (a coroutine) serves them as
`python -m <package> serve` does; both take the data plane's class (`DataPlane` or a subclass of one's own).

The package is laid out by concern, each folder saying in its `__init__` what it owns and which of its modules
are rendered from the spec. From the top down, each imports only those below it:

- `process`: the command line, one server process (the composition root and its life), the supervisor of
  `--workers N` and their control plane;
- `rest`, `grpc`: the transports;
- `core`: the protocol's semantics (data plane, inference pipeline, checks, batching, streams, repository...);
- `model` (the model API) and `observe` (the observers of inference: statistics, metrics, tracing; logs);
- `errors`, `types`, `settings`: the vocabulary every part shares.

The transports (and `Assembly`) import on first use: `import <package>.server` does not import FastAPI or grpcio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors, types
from .core.dataplane import DataPlane
from .core.repository import ModelRepository, ModelState, ModelStatus
from .errors import ErrorKind, InvalidRequest, ModelFailure, NotFound, NotReady, OipError, TooLarge, Unimplemented
from .model import InferResult, Model, TensorSpec
from .observe.events import Observer
from .settings import Settings
from .types import InferRequest, InferResponse, RequestedOutput, Tensor

if TYPE_CHECKING:
    from .grpc import Servicer, create_grpc_server
    from .process.serve import Assembly, serve
    from .rest import create_app

__all__ = [
    "Assembly",
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
    "Observer",
    "OipError",
    "RequestedOutput",
    "Servicer",
    "Settings",
    "Tensor",
    "TensorSpec",
    "TooLarge",
    "Unimplemented",
    "create_app",
    "create_grpc_server",
    "errors",
    "serve",
    "types",
]

# The transports' names, by the module that holds them: imported when first asked for.
_ON_DEMAND = {"create_app": "rest", "create_grpc_server": "grpc", "Servicer": "grpc", "Assembly": "process.serve",
              "serve": "process.serve"}


def __getattr__(name: str) -> Any:
    module = _ON_DEMAND.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
