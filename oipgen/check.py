"""Cross-check the two halves of the API model: the REST document must say what the proto says.

Every RPC has a REST form or is declared gRPC-only; path parameters fill real request fields; every schema tied
to a message covers its fields (or declares them gRPC-only) and has no property the message lacks; field and
property types agree; the datatype table agrees with both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .api import INTEGER_KINDS, Api, Datatype, Field, Message, Operation, RestOperation, Schema, is_safe_identifier
from .load_openapi import _SCHEMA_REF
from .problems import Problems

_JSON_TYPES = {
    "bool": {"boolean"},
    "string": {"string"},
    "bytes": {"string", "object"},
    "double": {"number", "integer"},
    "float": {"number", "integer"},
    "enum": {"string"},
    **{k: {"integer"} for k in INTEGER_KINDS},
}


def _ref(node: Any) -> str | None:
    if isinstance(node, dict):
        parts = node.get("allOf")
        if isinstance(parts, list) and len(parts) == 1:  # a schema that is another one, described anew
            node = parts[0]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_SCHEMA_REF):
            return ref[len(_SCHEMA_REF):]
    return None


_DATA_FAMILIES = {"BoolTensorData": "bool", "IntegerTensorData": "integer", "NumberTensorData": "number",
                  "StringTensorData": "string"}


def _json_family(d: Datatype) -> str:
    """The JSON element type of a datatype's `data`, from its row of the table ("none": it has no JSON form)."""
    if not d.json:
        return "none"
    if d.numpy == "object":
        return "string"
    kind = d.numpy[1:2]
    return {"b": "bool", "i": "integer", "u": "integer", "f": "number"}.get(kind, "none")


def _types(node: dict[str, Any]) -> set[str]:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {str(x) for x in t}
    return set()


class _Checker:
    def __init__(self, api: Api, spec_dir: Path, problems: Problems) -> None:
        self.api = api
        self.problems = problems
        self.openapi_file = str(spec_dir / "openapi.yaml")
        self.datatypes_file = str(spec_dir / "datatypes.yaml")
        self.examples_dir = spec_dir / "examples"
        self.messages = {m.full_name: m for m in api.messages}
        self.schemas = {s.name: s for s in api.schemas}

    def rest(self, where: str, message: str) -> None:
        self.problems.add(self.openapi_file, where, message)

    def run(self) -> None:
        self.operations()
        self.rest_operations()
        for schema in self.api.schemas:
            self.schema(schema)
        self.datatypes()
        self.examples()
        self.extensions()

    # -- operations -------------------------------------------------------------------------------------------
    def rest_operations(self) -> None:
        rpc_names = {r.name for r in self.api.rpcs}
        for op in self.api.rest_operations:
            if op.name in rpc_names:
                self.rest("x-oip-rest-only", f"{op.name!r} is an RPC of service {self.api.service}, so it is not "
                                             "REST-only")
            if not op.rest:
                self.rest("x-oip-rest-only", f"{op.name!r} has no REST operation (x-oip-operation)")
            for ep in op.rest:
                for p in ep.params:
                    if not is_safe_identifier(p.field):
                        self.rest(f"paths/{ep.path}/{ep.method.lower()}",
                                  f"path parameter {p.name!r}: x-oip-field {p.field!r} is not a safe identifier")
                if ep.grpc_health:
                    self.rest(f"paths/{ep.path}/{ep.method.lower()}",
                              "x-oip-grpc-health marks an operation that has no gRPC form")

    def operations(self) -> None:
        rpc_names = {r.name for r in self.api.rpcs}
        grpc_only = self.api.openapi.get("x-oip-grpc-only") or {}
        for name in grpc_only:
            if name not in rpc_names:
                self.rest("x-oip-grpc-only", f"{name!r} is not an RPC of service {self.api.service}")
        for op in self.api.operations:
            rpc = op.rpc
            if not op.rest and op.grpc_only is None:
                self.rest("paths", f"RPC {rpc.name} has no REST operation (x-oip-rpc) and is not in x-oip-grpc-only")
            if op.rest and op.grpc_only is not None:
                self.rest("x-oip-grpc-only", f"RPC {rpc.name} is listed as gRPC-only but has REST operations")
            request = self.messages.get(rpc.request)
            response = self.messages.get(rpc.response)
            for ep in op.rest:
                where = f"paths/{ep.path}/{ep.method.lower()}"
                for p in ep.params:
                    f = request.field(p.field) if request else None
                    if f is None or f.kind not in {"string", *INTEGER_KINDS} or f.repeated or f.is_map:
                        self.rest(where, f"path parameter {p.name!r}: x-oip-field {p.field!r} is not a scalar "
                                         f"field of {rpc.request}")
                if ep.body is not None:
                    body = self.schemas.get(ep.body)
                    if body is not None and body.message != rpc.request:
                        self.rest(where, f"request body {ep.body} is tied to {body.message!r}, but {rpc.name} "
                                         f"takes {rpc.request}")
                if ep.response is not None:
                    resp = self.schemas.get(ep.response)
                    if resp is not None and resp.message != rpc.response:
                        self.rest(where, f"response {ep.response} is tied to {resp.message!r}, but {rpc.name} "
                                         f"returns {rpc.response}")
                elif response is not None and response.fields:
                    self.rest(where, f"the 200 response has no body, but {rpc.response} has fields")
                if ep.health is not None:
                    f = response.field(ep.health) if response else None
                    if f is None or f.kind != "bool" or f.repeated:
                        self.rest(where, f"x-oip-health names {ep.health!r}, not a bool field of {rpc.response}")
                if ep.grpc_health and (ep.health is None or rpc.client_streaming or rpc.server_streaming
                                       or (request is not None and request.fields)):
                    self.rest(where, "x-oip-grpc-health marks the server's own health: a unary RPC that takes no "
                                     "argument and answers a health boolean (x-oip-health)")
        marked = [op.rpc.name for op in self.api.operations if any(ep.grpc_health for ep in op.rest)]
        if len(marked) > 1:
            self.rest("paths", f"x-oip-grpc-health marks {len(marked)} operations ({', '.join(marked)}); the gRPC "
                               "health service answers from one")

    # -- schemas ----------------------------------------------------------------------------------------------
    def path_fields(self, schema: Schema) -> set[str]:
        """Request fields that REST carries in the path rather than in this body schema."""
        out: set[str] = set()
        for op in self.api.operations:
            for ep in op.rest:
                if ep.body == schema.name or (ep.body is None and op.rpc.request == schema.message):
                    out.update(p.field for p in ep.params)
        return out

    def schema(self, schema: Schema) -> None:
        where = f"components/schemas/{schema.name}"
        if schema.map_value is not None:
            self.map_value(schema, where)
        if schema.message is None:
            return
        message = self.messages.get(schema.message)
        if message is None:
            self.rest(where, f"x-oip-message {schema.message!r} is not a message of the proto")
            return
        if schema.unwrap is not None:
            self.unwrapped(schema, message, where)
            return
        covered: set[str] = set()
        for prop in schema.properties:
            if prop.field is None:
                continue
            field = message.field(prop.field)
            if field is None:
                self.rest(f"{where}/properties/{prop.name}",
                          f"no field {prop.field!r} in {message.full_name} (map it with x-oip-field, or mark it "
                          f"x-oip-rest-only)")
                continue
            covered.add(field.name)
            self.field_vs_property(field, prop.schema, f"{where}/properties/{prop.name}")
            if "x-oip-raw" in prop.schema:
                self.raw_field(message, field, str(prop.schema["x-oip-raw"]), schema, f"{where}/properties/{prop.name}")
        path = self.path_fields(schema)
        for f in message.fields:
            if f.name not in covered and f.name not in schema.grpc_only and f.name not in path:
                self.rest(where, f"field {f.name!r} of {message.full_name} has no property; add one or list it "
                                 f"in x-oip-grpc-only")
        for name in schema.grpc_only:
            if message.field(name) is None:
                self.rest(where, f"x-oip-grpc-only names {name!r}, which is not a field of {message.full_name}")

    def raw_field(self, message: Message, tensors: Field, raw: str, schema: Schema, where: str) -> None:
        field = message.field(raw)
        if field is None or field.kind != "bytes" or not field.repeated:
            self.rest(where, f"x-oip-raw names {raw!r}, which is not a repeated bytes field of {message.full_name}")
        elif raw not in schema.grpc_only:
            self.rest(where, f"x-oip-raw field {raw!r} must also be listed in the schema's x-oip-grpc-only")
        tensor = self.messages.get(tensors.type_name or "")
        if not tensors.repeated or tensor is None or tensor.field("contents") is None:
            self.rest(where, "x-oip-raw belongs on a list of tensors (messages with `contents`)")

    def unwrapped(self, schema: Schema, message: Message, where: str) -> None:
        field = message.field(schema.unwrap or "")
        if field is None:
            self.rest(where, f"x-oip-unwrap names {schema.unwrap!r}, not a field of {message.full_name}")
            return
        if field.repeated or field.is_map:
            if "array" not in _types(schema.raw):
                self.rest(where, f"unwrapping the repeated field {field.name!r} gives a JSON array")
                return
            self.value_vs_schema(field, schema.raw.get("items") or {}, f"{where}/items")
        else:
            self.value_vs_schema(field, schema.raw, where)

    def map_value(self, schema: Schema, where: str) -> None:
        value = self.messages.get(schema.map_value or "")
        if value is None:
            self.rest(where, f"x-oip-map-value {schema.map_value!r} is not a message of the proto")
            return
        if len(value.oneofs) != 1 or any(f.oneof is None or f.kind in {"message", "enum"} for f in value.fields):
            self.rest(where, f"x-oip-map-value {value.full_name} must hold exactly one oneof of scalar fields")
        if "object" not in _types(schema.raw):
            self.rest(where, "a parameters schema is a JSON object")

    def field_vs_property(self, field: Field, prop: dict[str, Any], where: str) -> None:
        if field.is_map:
            target = _ref(prop)
            if target is not None:
                s = self.schemas.get(target)
                if s is not None and s.map_value != field.type_name:
                    self.rest(where, f"{field.name!r} is a map of {field.type_name}; {target} must carry "
                                     f"x-oip-map-value: {field.type_name}")
                return
            if "object" not in _types(prop):
                self.rest(where, f"{field.name!r} is a map; its property must be a JSON object")
                return
            extra = prop.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                self.value_vs_schema(field, extra, f"{where}/additionalProperties")
            return
        if field.repeated:
            if field.type_name and field.type_name.endswith("InferTensorContents"):
                return
            if "array" not in _types(prop):
                self.rest(where, f"{field.name!r} is repeated; its property must be a JSON array")
                return
            self.value_vs_schema(field, prop.get("items") or {}, f"{where}/items")
            return
        self.value_vs_schema(field, prop, where)

    def value_vs_schema(self, field: Field, node: dict[str, Any], where: str) -> None:
        """One value of `field` (an element, for repeated and map fields) against a JSON schema node."""
        if field.kind == "message":
            if field.type_name and field.type_name.endswith("InferTensorContents"):
                if _ref(node) != "TensorData":
                    self.rest(where, f"{field.name!r} holds tensor contents; its property must be $ref TensorData")
                return
            target = _ref(node)
            s = self.schemas.get(target or "")
            if s is None:
                self.rest(where, f"{field.name!r} is a {field.type_name} message; expected a $ref to the schema "
                                 f"that carries x-oip-message: {field.type_name}")
            elif s.message != field.type_name and s.map_value is None:
                self.rest(where, f"{field.name!r} is a {field.type_name}, but {target} is tied to {s.message!r}")
            return
        referenced = self.schemas.get(_ref(node) or "")
        if referenced is not None:
            node = referenced.raw
        allowed = _JSON_TYPES.get(field.kind, set())
        found = _types(node)
        if found and not found & allowed:
            self.rest(where, f"{field.name!r} is {field.kind} in the proto but {sorted(found)} here")

    # -- datatypes --------------------------------------------------------------------------------------------
    def datatypes(self) -> None:
        names = [d.name for d in self.api.datatypes]
        schema = self.schemas.get("Datatype")
        if schema is None:
            self.rest("components/schemas", "no Datatype schema (the string enum of tensor datatypes)")
        else:
            enum = schema.raw.get("enum") or []
            if sorted(map(str, enum)) != sorted(names):
                self.rest("components/schemas/Datatype",
                          f"enum {sorted(map(str, enum))} differs from datatypes.yaml {sorted(names)}")
        self.data_by_datatype()
        contents = next((m for m in self.api.messages if m.name == "InferTensorContents"), None)
        dtype_enum = next((e for e in self.api.enums if e.full_name.endswith(".DataType")), None)
        for d in self.api.datatypes:
            where = f"datatypes/{d.name}"
            if d.contents is not None and (contents is None or contents.field(d.contents) is None):
                self.problems.add(self.datatypes_file, where, f"{d.contents!r} is not a field of InferTensorContents")
            if d.contents is None and d.json:
                self.problems.add(self.datatypes_file, where, "a datatype with no typed contents cannot be JSON")
            if dtype_enum is not None and d.model_config not in {v for v, _ in dtype_enum.values}:
                self.problems.add(self.datatypes_file, where, f"{d.model_config!r} is not a DataType value")

    # -- extensions -------------------------------------------------------------------------------------------
    def extensions(self) -> None:
        """Tags name the groups; an operation belongs to at most one extension, the same on all its REST forms;
        a reserved parameter key names the extension that reserves it."""
        declared = {t.name for t in self.api.tags}
        extensions = {t.name for t in self.api.tags if t.extension}
        for op in self.api.operations:
            owners: set[str] = set()
            for ep in op.rest:
                where = f"paths/{ep.path}/{ep.method.lower()}"
                for tag in ep.tags:
                    if tag not in declared:
                        self.rest(where, f"tag {tag!r} is not declared under `tags`")
                owners |= {t for t in ep.tags if t in extensions}
            if len(owners) > 1:
                self.rest(f"x-oip-rpc {op.rpc.name}", f"the REST forms of {op.rpc.name} name several extensions: "
                          f"{', '.join(sorted(owners))}")
        for schema in self.api.schemas:
            if schema.map_value is None:
                continue
            for prop in schema.properties:
                owner = prop.schema.get("x-oip-extension")
                if owner is not None and owner not in extensions:
                    self.rest(f"components/schemas/{schema.name}/properties/{prop.name}",
                              f"x-oip-extension {owner!r} is not an extension tag (`x-oip-extension: true`)")

    def data_by_datatype(self) -> None:
        """The `if datatype ... then data ...` rules of schemas marked `x-oip-data-by-datatype` give each datatype
        of the table the JSON element type its row implies, and no datatype twice."""
        for schema in self.api.schemas:
            if not schema.raw.get("x-oip-data-by-datatype"):
                continue
            where = f"components/schemas/{schema.name}/allOf"
            got: dict[str, str] = {}
            for rule in schema.raw.get("allOf") or []:
                condition = ((rule.get("if") or {}).get("properties") or {}).get("datatype")
                if condition is None:  # a rule about something else
                    continue
                names = condition.get("enum") or ([condition["const"]] if "const" in condition else [])
                then = rule.get("then") or {}
                data = (then.get("properties") or {}).get("data")
                family = _DATA_FAMILIES.get(_ref(data) or "") if data is not None else (
                    "none" if then.get("not") == {"required": ["data"]} else None)
                if family is None:
                    self.rest(where, f"rule for {names} must give data one of {sorted(_DATA_FAMILIES)} or forbid it")
                    continue
                for name in names:
                    if name in got:
                        self.rest(where, f"datatype {name} has two rules")
                    got[name] = family
            want = {d.name: _json_family(d) for d in self.api.datatypes}
            if got != want:
                wrong = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
                self.rest(where, "data element types differ from datatypes.yaml for "
                          + ", ".join(f"{n} (schema {got.get(n)}, table {want.get(n)})" for n in wrong))

    # -- examples ---------------------------------------------------------------------------------------------
    def examples(self) -> None:
        for ex in self.api.examples:
            file = str(self.examples_dir / f"{ex.name}.yaml")
            op: Operation | RestOperation
            try:
                op = self.api.operation(ex.operation)
            except KeyError:
                try:
                    op = self.api.rest_operation(ex.operation)
                except KeyError:
                    self.problems.add(file, "operation", f"{ex.operation!r} is neither an RPC of the service nor a "
                                                         "REST-only operation")
                    continue
                if ex.grpc is not None:
                    self.problems.add(file, "grpc", f"{ex.operation} is REST-only; the case cannot have a grpc part")
            if ex.rest is not None:
                method = str(ex.rest.get("method", "")).upper()
                path = str(ex.rest.get("path", ""))
                if not any(ep.method == method and _path_matches(ep.path, path) for ep in op.rest) and \
                        ex.rest.get("status", 200) < 400:
                    self.problems.add(file, "rest", f"{method} {path} is not a REST form of {ex.operation}")
                if "status" not in ex.rest:
                    self.problems.add(file, "rest", "the expected status is missing")
            if ex.grpc is not None and "code" not in ex.grpc:
                self.problems.add(file, "grpc", "the expected status code is missing")


def _path_matches(template: str, path: str) -> bool:
    pattern = re.sub(r"\\\{[^{}]*\\\}", "[^/]+", re.escape(template))
    return re.fullmatch(pattern, path) is not None


def check_api(api: Api, spec_dir: Path, problems: Problems) -> None:
    _Checker(api, spec_dir, problems).run()
