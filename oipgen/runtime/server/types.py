"""The data plane's own request and response forms for inference: tensors as numpy arrays.

Both transports decode into these (REST from JSON or binary data, gRPC from typed or raw contents) and encode
from them, so tensor elements never pass through pydantic or protobuf lists on the way to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt


@dataclass(slots=True)
class Tensor:
    """A named tensor. `data` holds the elements (an object array of `bytes` for BYTES)."""

    name: str
    datatype: str
    shape: list[int]
    data: npt.NDArray[Any] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # empty: the server picks (the highest ready version)
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: every output of the model
    # A raw binary request's body (REST `Inference-Header-Content-Length: 0`): the data of the model's only input,
    # whose shape the data plane takes from the model's declaration; `inputs` is empty then.
    raw_input: bytes | memoryview | None = None
    # The caller's trace context as received (W3C `traceparent`, `tracestate`), or None.
    trace: dict[str, str] | None = None
    transport: str = ""  # rest or grpc: which transport received it (for traces and logs)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[Tensor] = field(default_factory=list)  # in answer order, each with its data

