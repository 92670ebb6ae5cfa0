"""The one in-memory model of the API that every target reads.

The loaders in `oipgen.load` build it from `spec/`; `oipgen.check` verifies that its REST and gRPC halves agree.
Targets and templates only ever see these objects, never the spec files.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")

SCALAR_KINDS = frozenset(
    {"double", "float", "int64", "uint64", "int32", "uint32", "fixed64", "fixed32", "sfixed32", "sfixed64",
     "sint32", "sint64", "bool", "string", "bytes"}
)
INTEGER_KINDS = frozenset(
    {"int64", "uint64", "int32", "uint32", "fixed64", "fixed32", "sfixed32", "sfixed64", "sint32", "sint64"}
)


def snake_case(name: str) -> str:
    """`ModelStreamInfer` -> `model_stream_infer`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def camel_case(name: str) -> str:
    """`resnet-50_v2` -> `Resnet50V2`: the runs of ASCII letters and digits of a name, each capitalised, with
    `Model` in front when that would be empty or start with a digit (`3d` -> `Model3d`)."""
    name = "".join(w[:1].upper() + w[1:] for w in re.split(r"[^0-9A-Za-z]+", name) if w)
    return name if name[:1].isalpha() else "Model" + name


def is_safe_identifier(name: str) -> bool:
    """True for a name that can stand as a Python identifier in generated code."""
    return name.isidentifier() and name.isascii() and not keyword.iskeyword(name) and not name.startswith("__")


@dataclass(frozen=True)
class Datatype:
    """One row of the tensor datatype table (spec/datatypes.yaml)."""

    name: str
    size: int
    numpy: str
    contents: str | None
    json: bool
    model_config: str


@dataclass(frozen=True)
class Field:
    """A protobuf message field. For a map field, `kind`/`type_name` describe the value and `map_key` the key."""

    name: str
    number: int
    kind: str  # a scalar kind from SCALAR_KINDS, "message" or "enum"
    type_name: str | None  # full name of the message or enum type
    repeated: bool
    map_key: str | None
    oneof: str | None
    json_name: str
    doc: str

    @property
    def is_map(self) -> bool:
        return self.map_key is not None

    @property
    def is_message(self) -> bool:
        return self.kind == "message"


@dataclass(frozen=True)
class Message:
    full_name: str  # inference.ModelInferRequest.InferInputTensor
    py_path: str  # ModelInferRequest.InferInputTensor: the attribute path inside its _pb2 module
    module: str  # the _pb2 module that defines it, without the suffix: grpc_service
    fields: tuple[Field, ...]
    oneofs: tuple[str, ...]
    doc: str

    @property
    def name(self) -> str:
        return self.full_name.rsplit(".", 1)[-1]

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


@dataclass(frozen=True)
class Enum:
    full_name: str
    py_path: str
    module: str
    values: tuple[tuple[str, int], ...]
    doc: str


@dataclass(frozen=True)
class Rpc:
    name: str
    request: str  # full message names
    response: str
    client_streaming: bool
    server_streaming: bool
    doc: str

    @property
    def snake(self) -> str:
        return snake_case(self.name)


@dataclass(frozen=True)
class PathParam:
    name: str  # the template variable in the path: model_name
    field: str  # the request message field it fills: name


@dataclass(frozen=True)
class RestEndpoint:
    """One REST operation of the OpenAPI document."""

    operation_id: str
    method: str  # upper case: GET, POST
    path: str  # /v2/models/{model_name}/infer
    params: tuple[PathParam, ...]
    body: str | None  # component schema name of the request body
    body_required: bool
    response: str | None  # component schema name of the 200 body; None when it has no body
    health: str | None  # x-oip-health: the boolean response field whose `false` makes the REST status "not ready"
    summary: str
    description: str
    tags: tuple[str, ...] = ()

    events: bool = False  # the 200 answer is `text/event-stream`: one event per response, each a `response` body
    grpc_health: bool = False  # x-oip-grpc-health: the standard gRPC health service answers what this one does


@dataclass(frozen=True)
class Operation:
    """One operation of the protocol: an RPC and its REST forms (none when it is gRPC-only)."""

    rpc: Rpc
    rest: tuple[RestEndpoint, ...]
    grpc_only: str | None  # the reason, when there is no REST form

    @property
    def name(self) -> str:
        return self.rpc.snake


@dataclass(frozen=True)
class Tag:
    """A tag of the OpenAPI document: a group of operations. With `x-oip-extension: true` it is an extension,
    under the name servers report in their metadata; its operations belong to it."""

    name: str
    description: str
    extension: bool


@dataclass(frozen=True)
class RestOperation:
    """An operation that only REST has (`x-oip-operation`, listed in `x-oip-rest-only`): no RPC, no messages.

    Its bodies are plain JSON (`dict`) that the data plane reads; its path parameters fill keys of that request."""

    name: str  # Generate
    rest: tuple[RestEndpoint, ...]
    reason: str  # why it has no gRPC form

    @property
    def snake(self) -> str:
        return snake_case(self.name)

    @property
    def events(self) -> bool:
        return any(ep.events for ep in self.rest)


@dataclass(frozen=True)
class Property:
    """A property of a component schema, and the message field it stands for."""

    name: str
    field: str | None  # None for a REST-only property
    required: bool
    schema: dict[str, Any]


@dataclass(frozen=True)
class Schema:
    """A component schema of the OpenAPI document, with its x-oip ties to the proto."""

    name: str
    message: str | None  # x-oip-message
    unwrap: str | None  # x-oip-unwrap
    map_value: str | None  # x-oip-map-value
    grpc_only: tuple[str, ...]
    properties: tuple[Property, ...]
    raw: dict[str, Any]


@dataclass(frozen=True)
class ExampleModel:
    """A model that the golden cases run against (spec/examples/models.yaml)."""

    name: str
    behaviour: str
    platform: str
    versions: tuple[str, ...]
    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[dict[str, Any], ...]
    raw: dict[str, Any]


@dataclass(frozen=True)
class Example:
    """A golden case: a request and its expected answer, over REST and/or gRPC."""

    name: str
    summary: str
    source: str
    operation: str  # the RPC name
    rest: dict[str, Any] | None
    grpc: dict[str, Any] | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class SpecFile:
    path: str  # relative to the spec directory, with forward slashes
    sha256: str


@dataclass(frozen=True)
class Api:
    """Everything oipgen knows about the protocol, loaded from one spec directory."""

    proto_package: str  # inference
    service: str  # GRPCInferenceService
    service_module: str  # the _pb2 module (without the suffix) whose file defines the service: grpc_service
    files: tuple[SpecFile, ...]
    spec_hash: str
    datatypes: tuple[Datatype, ...]
    messages: tuple[Message, ...]
    enums: tuple[Enum, ...]
    rpcs: tuple[Rpc, ...]
    operations: tuple[Operation, ...]
    schemas: tuple[Schema, ...]
    examples: tuple[Example, ...]
    example_models: tuple[ExampleModel, ...]
    proto_files: tuple[str, ...]  # .proto file names, dependencies first
    descriptor_set: bytes  # serialized FileDescriptorSet of proto_files
    openapi: dict[str, Any]  # the OpenAPI document with its references resolved inside one document
    info: dict[str, Any] = field(default_factory=dict)
    tags: tuple[Tag, ...] = ()

    rest_operations: tuple[RestOperation, ...] = ()  # operations that only REST has

    def rest_operation(self, name: str) -> RestOperation:
        return _find(self.rest_operations, "name", name)

    def message(self, full_name: str) -> Message:
        return _find(self.messages, "full_name", full_name)

    def schema(self, name: str) -> Schema:
        return _find(self.schemas, "name", name)

    def datatype(self, name: str) -> Datatype:
        return _find(self.datatypes, "name", name)

    def operation(self, rpc_name: str) -> Operation:
        for op in self.operations:
            if op.rpc.name == rpc_name:
                return op
        raise KeyError(rpc_name)

    def endpoint_schemas(self) -> set[str]:
        """Schemas that are a whole REST body of some operation (as opposed to parts of one)."""
        endpoints = [ep for op in self.operations for ep in op.rest]
        endpoints += [ep for op in self.rest_operations for ep in op.rest]
        return {name for ep in endpoints for name in (ep.body, ep.response) if name}


def _find(items: tuple[_T, ...], attr: str, value: str) -> _T:
    for item in items:
        if getattr(item, attr) == value:
            return item
    raise KeyError(value)
