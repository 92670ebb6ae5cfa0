"""Load the OpenAPI document of a spec: operations, component schemas and their x-oip ties to the proto."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .api import PathParam, Property, RestEndpoint, Schema, Tag, is_safe_identifier
from .problems import Problems

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_PATH_VARIABLE = re.compile(r"\{([^{}]*)\}")
_SCHEMA_REF = "#/components/schemas/"
_JSON = "application/json"
_EVENTS = "text/event-stream"  # server-sent events: allowed for the answer of a REST-only operation


@dataclass(frozen=True)
class OpenApiSet:
    doc: dict[str, Any]
    schemas: tuple[Schema, ...]
    endpoints: tuple[tuple[str, RestEndpoint], ...]  # (x-oip-rpc, endpoint)
    grpc_only: dict[str, str]
    tags: tuple[Tag, ...]
    rest_endpoints: tuple[tuple[str, RestEndpoint], ...] = ()  # (x-oip-operation, endpoint): REST-only operations
    rest_only: dict[str, str] | None = None  # x-oip-rest-only: REST-only operation -> why it has no gRPC form


class _Reader:
    """Walks the document, resolving local references and reporting problems against the file."""

    def __init__(self, file: str, doc: dict[str, Any], problems: Problems) -> None:
        self.file = file
        self.doc = doc
        self.problems = problems

    def problem(self, where: str, message: str) -> None:
        self.problems.add(self.file, where, message)

    def resolve(self, node: Any, where: str) -> Any:
        """Follow `$ref` until a node without one; None (and a problem) when a reference dangles."""
        seen: set[str] = set()
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                self.problem(where, f"only references inside the document are supported, not {ref!r}")
                return None
            if ref in seen:
                self.problem(where, f"circular reference {ref!r}")
                return None
            seen.add(ref)
            target: Any = self.doc
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    self.problem(where, f"dangling reference {ref!r}")
                    return None
                target = target[part]
            node = target
        return node

    def check_refs(self, node: Any, where: str) -> None:
        """Report every dangling reference anywhere in the document."""
        if isinstance(node, dict):
            if "$ref" in node:
                self.resolve({"$ref": node["$ref"]}, where)
            for key, value in node.items():
                self.check_refs(value, f"{where}/{key}" if where else str(key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                self.check_refs(value, f"{where}/{i}")

    def schema_name(self, media: Any, where: str, kinds: tuple[str, ...] = (_JSON,)) -> str | None:
        """The component name behind `content: application/json: schema: $ref` (or another media type of
        `kinds`)."""
        if not isinstance(media, dict):
            return None
        content = media.get("content")
        if not content:
            return None
        kind = next((k for k in kinds if isinstance(content, dict) and k in content), None)
        if kind is None:
            self.problem(where, f"only {' or '.join(kinds)} bodies are described here")
            return None
        schema = (content[kind] or {}).get("schema")
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not ref.startswith(_SCHEMA_REF):
            self.problem(where, "a body schema must be a $ref to #/components/schemas/<Name>")
            return None
        name = ref[len(_SCHEMA_REF):]
        if self.resolve(schema, where) is None:
            return None
        return name


def load_openapi(file: str, doc: Any, problems: Problems) -> OpenApiSet | None:
    if not isinstance(doc, dict):
        problems.add(file, "", "not a YAML mapping")
        return None
    r = _Reader(file, doc, problems)
    version = str(doc.get("openapi", ""))
    if not version.startswith("3.1"):
        r.problem("openapi", f"expected an OpenAPI 3.1 document, found {version or 'no version'!r}")
    r.check_refs(doc, "")
    schemas = _schemas(r)
    endpoints = _endpoints(r)
    grpc_only = doc.get("x-oip-grpc-only") or {}
    if not isinstance(grpc_only, dict) or not all(isinstance(v, str) for v in grpc_only.values()):
        r.problem("x-oip-grpc-only", "must map RPC names to the reason they have no REST form")
        grpc_only = {}
    rest_only = doc.get("x-oip-rest-only") or {}
    if not isinstance(rest_only, dict) or not all(isinstance(v, str) for v in rest_only.values()):
        r.problem("x-oip-rest-only", "must map REST-only operation names to the reason they have no gRPC form")
        rest_only = {}
    for name in rest_only:
        if not is_safe_identifier(str(name)):
            r.problem("x-oip-rest-only", f"operation name {name!r} is not a safe Python identifier")
    by_rpc = tuple((name, found.endpoint) for name, found in endpoints if not found.rest_only)
    by_operation = tuple((name, found.endpoint) for name, found in endpoints if found.rest_only)
    reasons = {str(k): str(v) for k, v in rest_only.items()}
    return OpenApiSet(doc, schemas, by_rpc, dict(grpc_only), _tags(r), by_operation, reasons)


def _tags(r: _Reader) -> tuple[Tag, ...]:
    out: list[Tag] = []
    for i, raw in enumerate(r.doc.get("tags") or []):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            r.problem(f"tags/{i}", "a tag needs a name")
            continue
        extension = raw.get("x-oip-extension", False)
        if not isinstance(extension, bool):
            r.problem(f"tags/{i}", "x-oip-extension must be true or false")
            extension = False
        if extension and not is_safe_identifier(raw["name"]):
            r.problem(f"tags/{i}", f"extension name {raw['name']!r} is not a safe Python identifier")
            extension = False
        out.append(Tag(raw["name"], str(raw.get("description", "")).strip(), extension))
    return tuple(out)


def _schemas(r: _Reader) -> tuple[Schema, ...]:
    components = (r.doc.get("components") or {}).get("schemas") or {}
    out: list[Schema] = []
    for name, raw in components.items():
        where = f"components/schemas/{name}"
        if not isinstance(name, str) or not is_safe_identifier(name):
            r.problem(where, f"schema name {name!r} is not a safe Python identifier")
            continue
        if not isinstance(raw, dict):
            r.problem(where, "a schema must be a mapping")
            continue
        required = set(raw.get("required") or [])
        props: list[Property] = []
        for pname, pschema in (raw.get("properties") or {}).items():
            if not is_safe_identifier(str(pname)):
                r.problem(f"{where}/properties/{pname}", "property name is not a safe Python identifier")
                continue
            pschema = pschema if isinstance(pschema, dict) else {}
            rest_only = bool(pschema.get("x-oip-rest-only"))
            field = None if rest_only else str(pschema.get("x-oip-field", pname))
            props.append(Property(str(pname), field, pname in required, pschema))
        grpc_only = raw.get("x-oip-grpc-only") or []
        if not isinstance(grpc_only, list):
            r.problem(where, "x-oip-grpc-only must be a list of field names")
            grpc_only = []
        out.append(
            Schema(
                name=name,
                message=raw.get("x-oip-message"),
                unwrap=raw.get("x-oip-unwrap"),
                map_value=raw.get("x-oip-map-value"),
                grpc_only=tuple(str(g) for g in grpc_only),
                properties=tuple(props),
                raw=raw,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Found:
    endpoint: RestEndpoint
    rest_only: bool  # named by x-oip-operation rather than x-oip-rpc


def _endpoints(r: _Reader) -> tuple[tuple[str, _Found], ...]:
    out: list[tuple[str, _Found]] = []
    seen_ids: set[str] = set()
    paths = r.doc.get("paths") or {}
    if not isinstance(paths, dict) or not paths:
        r.problem("paths", "the document has no paths")
        return ()
    for path, item in paths.items():
        item = r.resolve(item, f"paths/{path}")
        if not isinstance(item, dict):
            continue
        variables = _PATH_VARIABLE.findall(path)
        for var in variables:
            if not is_safe_identifier(var):
                r.problem(f"paths/{path}", f"path variable {var!r} is not a safe Python identifier")
        shared = item.get("parameters") or []
        for method in HTTP_METHODS:
            op = item.get(method)
            if op is None:
                continue
            where = f"paths/{path}/{method}"
            if not isinstance(op, dict):
                r.problem(where, "an operation must be a mapping")
                continue
            op_id = op.get("operationId")
            if not isinstance(op_id, str) or not is_safe_identifier(op_id):
                r.problem(where, f"operationId {op_id!r} is not a safe Python identifier")
                continue
            if op_id in seen_ids:
                r.problem(where, f"operationId {op_id!r} is used twice")
            seen_ids.add(op_id)
            rpc, operation = op.get("x-oip-rpc"), op.get("x-oip-operation")
            if isinstance(rpc, str) == isinstance(operation, str):
                r.problem(where, "every REST operation names its RPC (x-oip-rpc), or, when it has no gRPC form, "
                                 "its REST-only operation (x-oip-operation listed in x-oip-rest-only); not both")
                continue
            params = _path_params(r, where, variables, [*shared, *(op.get("parameters") or [])])
            body = r.resolve(op.get("requestBody"), where + "/requestBody")
            body_name = r.schema_name(body, where + "/requestBody") if body else None
            responses = op.get("responses") or {}
            ok = r.resolve(responses.get("200") or responses.get(200), where + "/responses/200")
            if ok is None:
                r.problem(where, "no 200 response is described")
            kinds = (_JSON,) if isinstance(rpc, str) else (_JSON, _EVENTS)
            response_name = r.schema_name(ok, where + "/responses/200", kinds) if ok else None
            events = isinstance(ok, dict) and _EVENTS in (ok.get("content") or {})
            grpc_health = op.get("x-oip-grpc-health", False)
            if not isinstance(grpc_health, bool):
                r.problem(where, "x-oip-grpc-health must be true or false")
                grpc_health = False
            out.append(
                (
                    str(rpc if isinstance(rpc, str) else operation),
                    _Found(RestEndpoint(
                        operation_id=op_id,
                        method=method.upper(),
                        path=path,
                        params=params,
                        body=body_name,
                        body_required=bool(body and body.get("required")),
                        response=response_name,
                        health=op.get("x-oip-health") if isinstance(op.get("x-oip-health"), str) else None,
                        summary=str(op.get("summary", "")),
                        description=str(op.get("description", "")),
                        tags=tuple(str(t) for t in op.get("tags") or ()),
                        events=events,
                        grpc_health=grpc_health,
                    ), not isinstance(rpc, str)),
                )
            )
    return tuple(out)


def _path_params(r: _Reader, where: str, variables: list[str], declared: list[Any]) -> tuple[PathParam, ...]:
    by_name: dict[str, dict[str, Any]] = {}
    for p in declared:
        p = r.resolve(p, where + "/parameters")
        if isinstance(p, dict) and p.get("in") == "path":
            by_name[str(p.get("name"))] = p
    params: list[PathParam] = []
    for var in variables:
        p = by_name.get(var)
        if p is None:
            r.problem(where, f"path variable {{{var}}} is not declared as a path parameter")
            continue
        field = p.get("x-oip-field")
        if not isinstance(field, str):
            r.problem(where, f"path parameter {var!r} has no x-oip-field naming the request field it fills")
            continue
        params.append(PathParam(var, field))
    for name in by_name:
        if name not in variables:
            r.problem(where, f"path parameter {name!r} does not appear in the path")
    return tuple(params)
