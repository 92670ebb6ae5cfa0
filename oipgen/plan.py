"""The plan: what each operation needs from the templates, decided once, in Python, from the API model.

Templates iterate over the plan instead of testing names, and print what it decided; no template works out a fact
the plan holds: whether an operation is inference (its request carries tensors whose data may travel raw,
`x-oip-raw`), whether it streams, which extension owns it (the tag with `x-oip-extension: true` on its REST forms),
its REST forms (`EndpointPlan`: which bodies list every field at its default, `x-oip-print-defaults`; which
properties of the answer only REST has; each path variable's argument name and whether every form has it), and
the parameter keys the extensions reserve (`x-oip-extension` on a property of a parameter map). The extension list
is the spec's tags, in their order; the protobuf modules are the spec's proto files, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import Api, Operation, PathParam, RestEndpoint, RestOperation, Rpc
from .bindings import bindings


@dataclass(frozen=True)
class Extension:
    """An extension the spec declares: the operations it owns and the parameter keys it reserves."""

    name: str
    description: str
    operations: tuple[str, ...]  # snake names of the operations it owns
    parameters: tuple[str, ...]  # reserved parameter keys, in first-declared order


@dataclass(frozen=True)
class ParameterKey:
    """A parameter key an extension reserves, and the parameter maps (schemas) that declare it."""

    name: str  # binary_data_size
    constant: str  # BINARY_DATA_SIZE: the name of its constant in the generated `extensions` module
    extension: str
    schemas: tuple[str, ...]


@dataclass(frozen=True)
class PathArg:
    """A path variable of a REST form, as the operation's client method takes it."""

    name: str  # the variable in the path: model_name
    field: str  # the request field it fills: name
    arg: str  # the method's argument: `model_name` -> `model`, `region_name` -> `region`, `*_version` -> `version`
    required: bool  # every REST form of the operation has it (otherwise it picks the form that has it)


@dataclass(frozen=True)
class EndpointPlan:
    """One REST form of an operation as the templates need it."""

    endpoint: RestEndpoint
    params: tuple[PathArg, ...]  # its path variables, in path order
    print_defaults: bool  # the 200 body lists every field, defaults included (x-oip-print-defaults)
    rest_only: tuple[str, ...]  # the 200 body's properties that only REST has (filled from the path field so named)

    @property
    def method(self) -> str:
        return self.endpoint.method

    @property
    def path(self) -> str:
        return self.endpoint.path

    @property
    def body(self) -> str | None:
        return self.endpoint.body

    @property
    def body_required(self) -> bool:
        return self.endpoint.body_required

    @property
    def response(self) -> str | None:
        return self.endpoint.response

    @property
    def health(self) -> str | None:
        return self.endpoint.health

    @property
    def events(self) -> bool:
        return self.endpoint.events

    @property
    def summary(self) -> str:
        return self.endpoint.summary


@dataclass(frozen=True)
class OperationPlan:
    """One operation as the templates need it."""

    operation: Operation
    extension: str | None  # the extension that owns it; None for the core protocol
    inference: bool  # its request is the inference request: it travels as numpy tensors in the server
    streaming: bool
    method: str  # the client method: the operation's name, without `model_` for inference (`infer`)
    request: str  # the request message as `<module>.<Path>`, the module without `_pb2`
    response: str  # the response message, likewise
    body: str | None  # the REST request body's schema (the first REST form that has one)
    response_schema: str | None  # the REST 200 body's schema (the first REST form that has one)
    health: str | None  # the boolean of the answer that makes a REST health answer "not ready"
    print_defaults: bool  # the REST answer lists every field, defaults included (x-oip-print-defaults)
    # For a streaming inference: the response wrapper's field holding the inference response, and its error text.
    stream_response_field: str | None
    stream_error_field: str | None
    endpoints: tuple[EndpointPlan, ...]  # its REST forms (none: gRPC only)
    widest: EndpointPlan | None  # the REST form with the most path variables: the client method's arguments
    rest_only: tuple[str, ...]  # the properties of `response_schema` that only REST has

    @property
    def name(self) -> str:
        return self.operation.name

    @property
    def rpc(self) -> Rpc:
        return self.operation.rpc

    @property
    def rest(self) -> tuple[RestEndpoint, ...]:
        return self.operation.rest

    @property
    def grpc_only(self) -> str | None:
        return self.operation.grpc_only


@dataclass(frozen=True)
class RestOnlyPlan:
    """An operation that only REST has, as the templates need it."""

    operation: RestOperation
    endpoints: tuple[EndpointPlan, ...]
    widest: EndpointPlan

    @property
    def name(self) -> str:
        return self.operation.name

    @property
    def snake(self) -> str:
        return self.operation.snake

    @property
    def events(self) -> bool:
        return self.operation.events

    @property
    def reason(self) -> str:
        return self.operation.reason


@dataclass(frozen=True)
class Plan:
    operations: tuple[OperationPlan, ...]
    rest_operations: tuple[RestOnlyPlan, ...]  # the operations that only REST has
    proto_modules: tuple[str, ...]  # the protobuf modules of the spec's proto files, without `_pb2`
    extensions: tuple[Extension, ...]
    parameters: tuple[ParameterKey, ...]
    infer_request: str  # full message names of the unary inference RPC
    infer_response: str
    infer_rpc: str  # its name
    # The operation the standard gRPC health service answers from (x-oip-grpc-health): the server's readiness.
    grpc_health: OperationPlan | None = None

    def operation(self, name: str) -> OperationPlan:
        for op in self.operations:
            if op.name == name:
                return op
        raise KeyError(name)

    @property
    def inference(self) -> tuple[OperationPlan, ...]:
        return tuple(op for op in self.operations if op.inference)


def _py(api: Api, full_name: str) -> str:
    m = api.message(full_name)
    return f"{m.module}.{m.py_path}"


def _first(values: list[str | None]) -> str | None:
    return next((v for v in values if v), None)


def _arg(param: PathParam) -> str:
    """The client method's argument for a path variable: `model_name` -> `model`, `*_version` -> `version`."""
    if param.name.endswith("_version"):
        return "version"
    return param.name.removesuffix("_name") if param.name.endswith("_name") else param.name


def _rest_only(api: Api, schema: str | None) -> tuple[str, ...]:
    return tuple(p.name for p in api.schema(schema).properties if p.field is None) if schema else ()


def _endpoints(api: Api, rest: tuple[RestEndpoint, ...]) -> tuple[tuple[EndpointPlan, ...], EndpointPlan | None]:
    """The REST forms of an operation, and the one with the most path variables (the first such)."""
    everywhere = set.intersection(*({p.name for p in ep.params} for ep in rest)) if rest else set()
    endpoints = tuple(
        EndpointPlan(
            endpoint=ep,
            params=tuple(PathArg(p.name, p.field, _arg(p), p.name in everywhere) for p in ep.params),
            print_defaults=bool(ep.response and api.schema(ep.response).raw.get("x-oip-print-defaults")),
            rest_only=_rest_only(api, ep.response),
        )
        for ep in rest
    )
    widest = max(endpoints, key=lambda ep: len(ep.params), default=None)  # max keeps the first of equals
    return endpoints, widest


def make_plan(api: Api) -> Plan:
    """The plan of `api` (already checked by `oipgen.check`)."""
    extension_names = [t.name for t in api.tags if t.extension]
    raw_messages = {b.message for b in bindings(api) if b.raw is not None}
    # The inference request: the request of an RPC whose message carries tensors that may travel raw.
    infer_requests = [r for r in api.rpcs if r.request in raw_messages]
    unary = [r for r in infer_requests if not (r.client_streaming or r.server_streaming)]
    if not unary:
        raise ValueError("the spec has no unary RPC whose request carries raw tensors (x-oip-raw): no inference")
    infer = unary[0]

    operations: list[OperationPlan] = []
    for op in api.operations:
        rpc = op.rpc
        inference = rpc.request == infer.request
        streaming = rpc.client_streaming or rpc.server_streaming
        owners = [t for ep in op.rest for t in ep.tags if t in extension_names]
        response_schema = _first([ep.response for ep in op.rest])
        endpoints, widest = _endpoints(api, op.rest)
        stream_field = error_field = None
        if inference and rpc.response != infer.response:
            wrapper = api.message(rpc.response)
            stream_field = next(f.name for f in wrapper.fields if f.type_name == infer.response)
            error_field = next(f.name for f in wrapper.fields if f.kind == "string")
        operations.append(OperationPlan(
            operation=op,
            extension=owners[0] if owners else None,
            inference=inference,
            streaming=streaming,
            method=op.name.removeprefix("model_") if inference else op.name,
            request=_py(api, rpc.request),
            response=_py(api, rpc.response),
            body=_first([ep.body for ep in op.rest]),
            response_schema=response_schema,
            health=_first([ep.health for ep in op.rest]),
            print_defaults=any(ep.print_defaults for ep in endpoints),
            stream_response_field=stream_field,
            stream_error_field=error_field,
            endpoints=endpoints,
            widest=widest,
            rest_only=_rest_only(api, response_schema),
        ))
    rest_operations = []
    for rest_op in api.rest_operations:
        endpoints, widest = _endpoints(api, rest_op.rest)
        if widest is None:
            raise ValueError(f"the REST-only operation {rest_op.name} has no REST form")
        rest_operations.append(RestOnlyPlan(rest_op, endpoints, widest))

    keys: dict[str, tuple[str, list[str]]] = {}
    for schema in api.schemas:
        if schema.map_value is None:
            continue
        for prop in schema.properties:
            owner = prop.schema.get("x-oip-extension")
            if isinstance(owner, str):
                keys.setdefault(prop.name, (owner, []))[1].append(schema.name)
    parameters = tuple(
        ParameterKey(name, name.upper(), owner, tuple(where)) for name, (owner, where) in keys.items()
    )
    extensions = tuple(
        Extension(
            name=tag.name,
            description=tag.description,
            operations=tuple(op.name for op in operations if op.extension == tag.name),
            parameters=tuple(p.name for p in parameters if p.extension == tag.name),
        )
        for tag in api.tags if tag.extension
    )
    proto_modules = tuple(dict.fromkeys(name.removesuffix(".proto") for name in api.proto_files))
    grpc_health = next((op for op in operations if any(ep.grpc_health for ep in op.rest)), None)
    return Plan(tuple(operations), tuple(rest_operations), proto_modules, extensions, parameters, infer.request,
                infer.response, infer.name, grpc_health)
