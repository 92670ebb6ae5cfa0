"""REST bodies by schema, without protobuf: the rules that complete and read answers by a schema's plan (its
binding to its protobuf message). `bodies.py` (rendered from the spec) holds the bindings (`BINDINGS`), the
parameter maps' cases (`PARAMS`, `PARAM_SCHEMAS`) and the module-level `complete` and `read` over them.

- `Bodies.complete(schema, body)` fills in the properties an answer may leave out because they hold their proto3
  default (scalars, enums, lists and maps without presence), recursively through the nested messages present;
  oneof members that are not set stay out. Both servers and clients of both transports complete answers alike.
- `Bodies.read(schema, body, rest_only)` checks a REST answer against its schema's plan (JSON types, integer
  ranges, enum names, base64), keeps only the properties the schema ties to its message (plus `rest_only`), lists
  maps in key order, and completes it: the body a gRPC answer converts to.

Errors are `ValueError`s naming the property.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Binding", "Bodies", "Field", "ParamCases"]


@dataclass(frozen=True)
class Field:
    prop: str
    field: str
    # scalar | scalars | enum | enums | bytes | message | messages | message_map | scalar_map | params | tensor
    kind: str
    schema: str | None
    required: bool
    oneof: str | None
    value: str | None = None  # the JSON type of a scalar (or element, or map value); None for messages
    default: Any = None  # the proto3 default in REST form
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Binding:
    message: str  # the protobuf message's full name
    unwrap: str | None
    unwrap_kind: str | None
    item_schema: str | None
    fields: tuple[Field, ...]
    raw: tuple[str, str] | None


@dataclass(frozen=True)
class ParamCases:
    oneof: str
    cases: Mapping[str, str]


_RANGES: Final[dict[str, tuple[int, int]]] = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}



class Bodies:
    """The bodies of one spec: `bindings` by schema name, the value message of each parameter map (`params`, its
    oneof and the field of each JSON type) and the parameter-map schemas with the value message each holds."""

    def __init__(
        self, bindings: Mapping[str, Binding], params: Mapping[str, ParamCases], param_schemas: Mapping[str, str]
    ) -> None:
        self.bindings = bindings
        self.params = params
        self.param_schemas = param_schemas

    def complete(self, schema: str, body: Any) -> Any:
        """Fill in, in place, the properties of `body` (the REST form of `schema`) that hold their default; `body`."""
        b = self.bindings[schema]
        if b.unwrap is None:
            self._complete(b, body)
        elif b.unwrap_kind == "message":
            self._complete(self.bindings[b.item_schema or ""], body)
        else:
            for item in body:
                self._complete(self.bindings[b.item_schema or ""], item)
        return body


    def _complete(self, b: Binding, out: Any) -> None:
        if not isinstance(out, dict):
            return
        for f in b.fields:
            kind = f.kind
            if kind in ("scalar", "enum", "bytes"):
                if f.oneof is None and f.prop not in out:
                    out[f.prop] = f.default
            elif kind in ("scalars", "enums"):
                out.setdefault(f.prop, [])
            elif kind in ("scalar_map", "params"):
                out.setdefault(f.prop, {})
            elif kind == "message":
                if f.prop in out:
                    self._complete(self.bindings[f.schema or ""], out[f.prop])
            elif kind == "messages":
                for item in out.setdefault(f.prop, []):
                    self._complete(self.bindings[f.schema or ""], item)
            elif kind == "message_map":
                for item in out.setdefault(f.prop, {}).values():
                    self._complete(self.bindings[f.schema or ""], item)


    def read(self, schema: str, body: Any, rest_only: Mapping[str, Any] | None = None) -> Any:
        """The answer `body` of `schema` checked, reduced to its schema's properties and completed (see the module's
        documentation). `rest_only` gives the properties only REST has, where the answer leaves them out."""
        b = self.bindings[schema]
        if b.unwrap is not None:
            item = self.bindings[b.item_schema or ""]
            if b.unwrap_kind == "message":
                return self.complete(schema, self._read(item, body, schema))
            entries = [self._read(item, entry, schema) for entry in _list(body, schema)]
            if b.unwrap_kind == "message_map":  # a map on the wire, listed in key order; the key is each entry's name
                entries.sort(key=lambda entry: str(entry.get("name", "")))
            return self.complete(schema, entries)
        out = self._read(b, body, schema)
        for key, value in (rest_only or {}).items():
            out[key] = body.get(key, value)
        return self.complete(schema, out)


    def _read(self, b: Binding, body: Any, where: str) -> dict[str, Any]:
        if not isinstance(body, Mapping):
            raise ValueError(f"{where}: expected a JSON object, not {type(body).__name__}")
        out: dict[str, Any] = {}
        oneofs: dict[str, str] = {}
        for f in b.fields:
            value = body.get(f.prop)
            if value is None:
                continue
            at = f"{where}.{f.prop}"
            kind = f.kind
            if kind in ("scalar", "enum", "bytes"):
                out[f.prop] = _scalar(f, value, at)
                if f.oneof is not None:  # a oneof holds one member: the last one set, as protobuf does
                    previous = oneofs.get(f.oneof)
                    if previous is not None:
                        del out[previous]
                    oneofs[f.oneof] = f.prop
            elif kind in ("scalars", "enums"):
                out[f.prop] = [_scalar(f, item, at) for item in _list(value, at)]
            elif kind == "message":
                out[f.prop] = self._read(self.bindings[f.schema or ""], value, at)
            elif kind == "messages":
                out[f.prop] = [self._read(self.bindings[f.schema or ""], item, at) for item in _list(value, at)]
            elif kind == "message_map":
                entries = _map(value, at)
                item_binding = self.bindings[f.schema or ""]
                out[f.prop] = {key: self._read(item_binding, entries[key], f"{at}.{key}") for key in sorted(entries)}
            elif kind == "scalar_map":
                entries = _map(value, at)
                out[f.prop] = {key: _scalar(f, entries[key], f"{at}.{key}") for key in sorted(entries)}
            elif kind == "params":
                entries = _map(value, at)
                allowed = self.params[self.param_schemas[f.schema or ""]].cases
                out[f.prop] = {key: _param(entries[key], allowed, f"{at}.{key}") for key in sorted(entries)
                               if entries[key] is not None}
            else:  # tensor data: as it came
                out[f.prop] = value
        return out


def _scalar(f: Field, value: Any, at: str) -> Any:
    kind = f.value
    if kind == "enum":
        if not isinstance(value, str) or value not in f.enum:
            raise ValueError(f"{at}: {value!r} is not one of {', '.join(f.enum)}")
        return value
    if kind == "bytes":
        if isinstance(value, Mapping):  # {"b64": "..."}, as some REST bodies wrap binary values
            value = value.get("b64", "")
        try:
            return base64.b64encode(base64.b64decode(str(value), validate=True)).decode("ascii")
        except (ValueError, binascii.Error):
            raise ValueError(f"{at}: not valid base64") from None
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "str":
        ok = isinstance(value, str)
    elif kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        low, high = _RANGES[kind or ""]
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if not ok:
        raise ValueError(f"{at}: {value!r} is not a valid {kind}")
    return value


def _param(value: Any, allowed: Mapping[str, str], at: str) -> Any:
    if isinstance(value, float) and "float" not in allowed and value.is_integer():
        value = int(value)  # JSON has one number type: where no double fits, an integral 2.0 is the integer 2
    kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(value))
    if kind == "int":
        if _RANGES["int64"][0] <= value <= _RANGES["int64"][1] and "int" in allowed:
            return value
        if 0 <= value <= _RANGES["uint64"][1] and "uint" in allowed:
            return value
        raise ValueError(f"{at}: integer {value} is out of range")
    if kind is None or kind not in allowed:
        raise ValueError(
            f"{at}: a {type(value).__name__} value has no form here (allowed: {', '.join(sorted(allowed))})"
        )
    return value


def _list(value: Any, at: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{at}: expected a JSON array, not {type(value).__name__}")
    return value


def _map(value: Any, at: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{at}: expected a JSON object, not {type(value).__name__}")
    return value
