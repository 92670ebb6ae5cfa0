"""How each REST schema maps onto its protobuf message, field by field: the plan the converters are rendered from.

Derived only from the API model (which `oipgen.check` has already verified), so the converters, the server and
the client all share one reading of the x-oip ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import INTEGER_KINDS, Api, Field, Schema, snake_case

_SCHEMA_REF = "#/components/schemas/"


@dataclass(frozen=True)
class FieldBinding:
    prop: str  # JSON property
    field: str  # proto field
    # scalar | scalars | enum | enums | bytes | message | messages | message_map | scalar_map | params | tensor
    kind: str
    schema: str | None  # the schema of a nested message (message kinds) or of the parameter map (params)
    required: bool
    oneof: str | None
    # The JSON type of a scalar (or of each element or map value): int32 | uint32 | int64 | uint64 | float | bool |
    # str | bytes | enum; None for messages.
    value: str | None = None
    default: Any = None  # the proto3 default in REST form (scalar, enum and bytes kinds), filled in when absent
    enum: tuple[str, ...] = ()  # the enum's value names (enum kinds)


@dataclass(frozen=True)
class ParamCases:
    """The oneof of a parameter value message, case by JSON type."""

    message: str
    oneof: str
    cases: tuple[tuple[str, str], ...]  # (bool | int | uint | float | str | bytes, field)


@dataclass(frozen=True)
class Binding:
    schema: str
    message: str  # full proto name
    py_message: str  # module_pb2.Path
    unwrap: str | None
    unwrap_kind: str | None  # message | messages | message_map
    item_schema: str | None  # the schema of the unwrapped message(s)
    fields: tuple[FieldBinding, ...]
    raw: tuple[str, str] | None  # (property of the tensors, repeated bytes field that may carry their data)
    py_type: str  # annotation of the model side, relative to the `models` module

    @property
    def snake(self) -> str:
        return snake_case(self.schema)


def _ref(node: Any) -> str | None:
    if isinstance(node, dict):
        parts = node.get("allOf")
        if isinstance(parts, list) and len(parts) == 1:
            node = parts[0]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_SCHEMA_REF):
            return ref[len(_SCHEMA_REF):]
    return None


def _kind(api: Api, field: Field, prop: dict[str, Any]) -> tuple[str, str | None]:
    schemas = {s.name: s for s in api.schemas}
    if field.type_name and field.type_name.endswith("InferTensorContents"):
        return "tensor", None
    if field.is_map:
        target = _ref(prop)
        if target is not None and schemas[target].map_value is not None:
            return "params", target
        if field.kind == "message":
            return "message_map", _ref(prop.get("additionalProperties"))
        return "scalar_map", None
    if field.kind == "message":
        return ("messages", _ref(prop.get("items"))) if field.repeated else ("message", _ref(prop))
    if field.kind == "enum":
        return ("enums" if field.repeated else "enum"), None
    if field.kind == "bytes" and not field.repeated:
        return "bytes", None
    return ("scalars" if field.repeated else "scalar"), None


_VALUES = {"double": "float", "float": "float", "bool": "bool", "string": "str", "bytes": "bytes", "enum": "enum",
           "int32": "int32", "sint32": "int32", "sfixed32": "int32", "uint32": "uint32", "fixed32": "uint32",
           "int64": "int64", "sint64": "int64", "sfixed64": "int64", "uint64": "uint64", "fixed64": "uint64"}
_DEFAULTS: dict[str, Any] = {"float": 0.0, "bool": False, "str": "", "bytes": ""}


def _value(api: Api, field: Field) -> tuple[str | None, Any, tuple[str, ...]]:
    """The JSON type of `field`'s values, its default in REST form and, for an enum, its value names."""
    if field.kind == "message":
        return None, None, ()
    value = _VALUES[field.kind]
    if value == "enum":
        enum = next(e for e in api.enums if e.full_name == field.type_name)
        names = tuple(name for name, _ in enum.values)
        first = next(name for name, number in enum.values if number == 0)
        return value, first, names
    return value, _DEFAULTS.get(value, 0), ()


def param_cases(api: Api, message: str) -> ParamCases:
    m = api.message(message)
    by_kind = {"bool": "bool", "string": "str", "bytes": "bytes", "double": "float", "float": "float",
               "uint64": "uint", "uint32": "uint"}
    cases: list[tuple[str, str]] = []
    for f in m.fields:
        kind = by_kind.get(f.kind) or ("int" if f.kind in INTEGER_KINDS else None)
        if kind is not None and kind not in {k for k, _ in cases}:
            cases.append((kind, f.name))
    return ParamCases(message, m.oneofs[0], tuple(cases))


def _py_message(api: Api, full_name: str) -> str:
    m = api.message(full_name)
    return f"{m.module}_pb2.{m.py_path}"


def bind(api: Api, schema: Schema) -> Binding | None:
    if schema.message is None or schema.map_value is not None:
        return None
    message = api.message(schema.message)
    py_type = f"models.{schema.name}"
    if schema.unwrap is not None:
        field = message.field(schema.unwrap)
        assert field is not None
        if field.is_map:
            kind, item = "message_map", _ref(schema.raw.get("items") or {})
        elif field.repeated:
            kind, item = "messages", _ref(schema.raw.get("items") or {})
        else:
            kind, item = "message", _ref(schema.raw)
        if kind != "message":
            py_type = f"list[models.{item}]"
        return Binding(schema.name, message.full_name, _py_message(api, message.full_name), schema.unwrap, kind,
                       item, (), None, py_type)
    fields = []
    raw = None
    for prop in schema.properties:
        if prop.field is None:
            continue
        field = message.field(prop.field)
        assert field is not None
        kind, nested = _kind(api, field, prop.schema)
        value, default, enum = _value(api, field)
        fields.append(FieldBinding(prop.name, field.name, kind, nested, prop.required, field.oneof, value, default,
                                   enum))
        raw_field = prop.schema.get("x-oip-raw")
        if isinstance(raw_field, str):
            raw = (prop.name, raw_field)
    return Binding(schema.name, message.full_name, _py_message(api, message.full_name), None, None, None,
                   tuple(fields), raw, py_type)


def bindings(api: Api) -> tuple[Binding, ...]:
    return tuple(b for b in (bind(api, s) for s in api.schemas) if b is not None)


def all_param_cases(api: Api) -> tuple[ParamCases, ...]:
    names = sorted({s.map_value for s in api.schemas if s.map_value})
    return tuple(param_cases(api, n) for n in names)
