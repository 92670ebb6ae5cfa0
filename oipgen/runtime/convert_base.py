"""Convert between the REST form of the protocol (JSON bodies) and its gRPC form (protobuf messages), by the
field-by-field plan of each schema (`bodies_base.Binding`): the converter's rules. `convert.py` (rendered from the
spec) holds the message of each schema, the request of each operation and the typed forms per schema, over one
`Converter`.

Tensor data goes through `codec` as numpy arrays: JSON `data` becomes typed `contents` (or `raw_*_contents` with
`raw=True`) and back.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, MutableSequence
from typing import Any

from google.protobuf.message import Message

from . import codec
from .bodies_base import Binding, ParamCases

__all__ = ["INT64_MAX", "INT64_MIN", "UINT64_MAX", "ConvertError", "Converter", "dump"]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1


class ConvertError(ValueError):
    """A value that has no form on the other side (a parameter of the wrong type, tensor data that does not decode)."""


class Converter:
    """The conversions of one spec: the message of each schema (`messages`), each operation's request message and
    body schema (`requests`), and the REST bodies' plan (`bindings`, `params`, `param_schemas`, as in `bodies`)."""

    def __init__(
        self,
        messages: Mapping[str, type[Message]],
        requests: Mapping[str, tuple[type[Message], str | None]],
        bindings: Mapping[str, Binding],
        params: Mapping[str, ParamCases],
        param_schemas: Mapping[str, str],
    ) -> None:
        self.messages = messages
        self.requests = requests
        self.bindings = bindings
        self.params = params
        self.param_schemas = param_schemas

    def rest_to_proto(
        self,
        schema: str, body: Any, *, raw: bool = False, path: Mapping[str, Any] | None = None, strict: bool = False
    ) -> Message:
        """Build the protobuf message for the REST body `body` of `schema`.

        `path` fills request fields that REST carries in the URL (`{"model_name": "simple"}`); with `raw=True`
        tensor data goes into the message's `raw_*_contents` instead of typed `contents`. A JSON null stands for an
        absent field, or with `strict=True` (a server reading a request) is a ConvertError: no field takes null.
        """
        b = self.bindings[schema]
        msg = self.messages[schema]()
        if b.unwrap is not None:
            self._fill_unwrapped(b, body, msg, raw, strict)
        else:
            if not isinstance(body, Mapping):
                raise ConvertError(f"{schema}: expected a JSON object")
            self._fill(b, body, msg, raw, None, strict)
        for name, value in (path or {}).items():
            if value is not None:
                setattr(msg, name, value)
        return msg

    def request_to_proto(
        self,
        operation: str, body: Any = None, *, raw: bool = False, path: Mapping[str, Any] | None = None,
        strict: bool = False,
    ) -> Message:
        """The request message of `operation` (a key of `REQUESTS`) from its REST form: the fields its path fills and
        its JSON body (None: the request has none; an operation without a body schema takes none). `strict`: see
        `rest_to_proto`."""
        message_type, schema = self.requests[operation]
        if schema is not None:
            return self.rest_to_proto(schema, {} if body is None else body, raw=raw, path=path, strict=strict)
        if body is not None:
            raise ConvertError(f"{operation} takes no request body")
        msg = message_type()
        for name, value in (path or {}).items():
            if name not in msg.DESCRIPTOR.fields_by_name:
                raise ConvertError(f"{operation}: {name!r} is not a field of {msg.DESCRIPTOR.full_name}")
            if value is not None:
                setattr(msg, name, value)
        return msg

    def _fill_unwrapped(self, b: Binding, body: Any, msg: Message, raw: bool, strict: bool) -> None:
        item = self.bindings[b.item_schema or ""]
        target = getattr(msg, b.unwrap or "")
        if b.unwrap_kind == "message":
            target.SetInParent()
            self._fill(item, body, target, raw, None, strict)
        elif b.unwrap_kind == "messages":
            for entry in body:
                self._fill(item, entry, target.add(), raw, None, strict)
        else:  # message_map: REST lists the map's values, each carrying its key as `name`
            for entry in body:
                self._fill(item, entry, target[entry["name"]], raw, None, strict)

    def _fill(
        self,
        b: Binding, body: Mapping[str, Any], msg: Message, raw: bool, raw_out: MutableSequence[bytes] | None,
        strict: bool = False,
    ) -> None:
        for f in b.fields:
            value = body.get(f.prop)
            if value is None:
                if strict and f.prop in body:
                    raise ConvertError(f"'{f.prop}' is null; leave the field out instead")
                continue
            kind = f.kind
            if kind == "scalar":
                if strict and isinstance(getattr(msg, f.field), bool) is not isinstance(value, bool):
                    raise ConvertError(f"'{f.prop}' must be a boolean" if isinstance(getattr(msg, f.field), bool)
                                       else f"'{f.prop}' must not be a boolean")
                try:
                    setattr(msg, f.field, value)
                except TypeError:
                    if not (isinstance(value, float) and value.is_integer()):
                        raise
                    setattr(msg, f.field, int(value))  # JSON has one number type: 16.0 is the integer 16
            elif kind == "scalars":
                getattr(msg, f.field).extend(value)
            elif kind == "enum":
                setattr(msg, f.field, _enum_number(msg, f.field, value))
            elif kind == "enums":
                getattr(msg, f.field).extend(_enum_number(msg, f.field, v) for v in value)
            elif kind == "bytes":
                setattr(msg, f.field, _b64decode(value, f.prop))
            elif kind == "message":
                sub = getattr(msg, f.field)
                sub.SetInParent()
                self._fill(self.bindings[f.schema or ""], value, sub, raw, None, strict)
            elif kind == "messages":
                nested = self.bindings[f.schema or ""]
                sink = getattr(msg, b.raw[1]) if raw and b.raw is not None and b.raw[0] == f.prop else None
                container = getattr(msg, f.field)
                for entry in value:
                    self._fill(nested, entry, container.add(), raw, sink, strict)
            elif kind == "message_map":
                nested = self.bindings[f.schema or ""]
                container = getattr(msg, f.field)
                for key, entry in value.items():
                    self._fill(nested, entry, container[key], raw, None, strict)
            elif kind == "scalar_map":
                getattr(msg, f.field).update(value)
            elif kind == "params":
                _fill_params(self.params[self.param_schemas[f.schema or ""]], value, getattr(msg, f.field), strict)
            elif kind == "tensor":
                name = str(body.get("name", ""))
                try:
                    array = codec.from_json(value, str(body.get("datatype")), body.get("shape") or (), name=name)
                    if raw_out is not None:
                        raw_out.append(bytes(codec.to_raw(array)))
                    else:
                        field, values = codec.to_contents(array, str(body.get("datatype")))
                        getattr(getattr(msg, f.field), field).extend(values)
                except codec.CodecError as e:
                    raise ConvertError(str(e)) from e

    def params_to_proto(self, message: str, params: Mapping[str, Any], target: Any) -> None:
        """Fill `target`, a protobuf map of `message` values (a parameters map such as `map<string, InferParameter>`),
        from JSON scalars; ConvertError names a value that has no form there."""
        _fill_params(self.params[message], params, target)

    def params_from_proto(self, message: str, entries: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON scalars of a protobuf map of `message` values; entries with no case set are left out."""
        cases = self.params[message]
        out: dict[str, Any] = {}
        for key in entries:  # one pass, by keys and lookups (a protobuf map's items() costs more)
            value = _param_value(cases, entries[key])
            if value is not None:
                out[key] = value
        return out

    def proto_to_rest(self, schema: str, message: Message, **rest_only: Any) -> Any:
        """The REST body of `schema` for `message`, as plain JSON values.

        Fields at their proto3 default are left out unless the schema requires them; `rest_only` supplies the
        properties that only REST has (the model name of a model-ready answer, say).
        """
        b = self.bindings[schema]
        if b.unwrap is not None:
            item = self.bindings[b.item_schema or ""]
            source = getattr(message, b.unwrap)
            if b.unwrap_kind == "message":
                return self._read(item, source, None)
            if b.unwrap_kind == "messages":
                return [self._read(item, entry, None) for entry in source]
            return [self._read(item, source[key], None) for key in sorted(source)]
        out = self._read(b, message, None)
        out.update(rest_only)
        return out

    def _read(self, b: Binding, msg: Any, raw_in: list[bytes] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in b.fields:
            kind = f.kind
            if kind in ("scalar", "enum", "bytes"):
                if f.oneof is not None and msg.WhichOneof(f.oneof) != f.field:
                    continue
                value = getattr(msg, f.field)
                if not value and not f.required and f.oneof is None:
                    continue
                if kind == "enum":
                    value = _enum_type(msg, f.field).values_by_number[value].name
                elif kind == "bytes":
                    value = base64.b64encode(value).decode("ascii")
                out[f.prop] = value
            elif kind in ("scalars", "enums"):
                values = getattr(msg, f.field)
                if values or f.required:
                    if kind == "enums":
                        names = _enum_type(msg, f.field).values_by_number
                        out[f.prop] = [names[v].name for v in values]
                    else:
                        out[f.prop] = list(values)
            elif kind == "message":
                if msg.HasField(f.field):
                    out[f.prop] = self._read(self.bindings[f.schema or ""], getattr(msg, f.field), None)
                elif f.required:
                    out[f.prop] = {}
            elif kind == "messages":
                entries = getattr(msg, f.field)
                if entries or f.required:
                    nested = self.bindings[f.schema or ""]
                    source = list(getattr(msg, b.raw[1])) if b.raw is not None and b.raw[0] == f.prop else None
                    out[f.prop] = [self._read(nested, entry, source) for entry in entries]
            elif kind == "message_map":
                entries = getattr(msg, f.field)
                if entries or f.required:
                    nested = self.bindings[f.schema or ""]
                    out[f.prop] = {key: self._read(nested, entries[key], None) for key in sorted(entries)}
            elif kind == "scalar_map":
                entries = getattr(msg, f.field)
                if entries or f.required:
                    out[f.prop] = {key: entries[key] for key in sorted(entries)}
            elif kind == "params":
                entries = getattr(msg, f.field)
                if entries or f.required:
                    cases = self.params[self.param_schemas[f.schema or ""]]
                    out[f.prop] = {key: _param_value(cases, entries[key]) for key in sorted(entries)}
            elif kind == "tensor":
                data = _read_tensor(msg, f.field, raw_in)
                if data is not None:
                    out[f.prop] = data
        return out


def _fill_params(cases: ParamCases, params: Mapping[str, Any], target: Any, strict: bool = False) -> None:
    for key, value in params.items():
        if value is None:
            if strict:
                raise ConvertError(f"parameter '{key}' is null; parameter values are booleans, numbers or strings")
            continue
        entry = target[key]
        c = cases.cases
        if isinstance(value, float) and "float" not in c and value.is_integer():
            value = int(value)  # JSON has one number type: where no double fits, an integral 2.0 is the integer 2
        if isinstance(value, bool) and "bool" in c:
            setattr(entry, c["bool"], value)
        elif isinstance(value, int) and not isinstance(value, bool):
            if INT64_MIN <= value <= INT64_MAX and "int" in c:
                setattr(entry, c["int"], value)
            elif 0 <= value <= UINT64_MAX and "uint" in c:
                setattr(entry, c["uint"], value)
            else:
                del target[key]
                raise ConvertError(f"parameter {key!r}: integer {value} is out of range")
        elif isinstance(value, float) and "float" in c:
            setattr(entry, c["float"], value)
        elif isinstance(value, str) and "str" in c:
            setattr(entry, c["str"], value)
        else:
            del target[key]
            raise ConvertError(
                f"parameter {key!r}: a {type(value).__name__} value has no form here "
                f"(allowed: {', '.join(sorted(c))})"
            )


def _enum_type(msg: Message, field: str) -> Any:
    enum = msg.DESCRIPTOR.fields_by_name[field].enum_type
    assert enum is not None, field
    return enum


def _enum_number(msg: Message, field: str, name: Any) -> int:
    enum = _enum_type(msg, field)
    value = enum.values_by_name.get(str(name))
    if value is None:
        raise ConvertError(f"{field}: {name!r} is not one of {', '.join(enum.values_by_name)}")
    return int(value.number)


def _b64decode(value: Any, prop: str) -> bytes:
    if isinstance(value, Mapping):  # {"b64": "..."}, as some REST bodies wrap binary values
        value = value.get("b64", "")
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as e:
        raise ConvertError(f"{prop}: not valid base64") from e


def _param_value(cases: ParamCases, entry: Any) -> Any:
    which = entry.WhichOneof(cases.oneof)
    if which is None:
        return None
    value = getattr(entry, which)
    return base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value


def _read_tensor(msg: Any, field: str, raw_in: list[bytes] | None) -> list[Any] | None:
    datatype, shape, name = msg.datatype, list(msg.shape), msg.name
    try:
        if msg.HasField(field):
            contents = getattr(msg, field)
            which = [f.name for f, _ in contents.ListFields()]
            if len(which) > 1:
                raise ConvertError(f"tensor {name!r}: contents set in more than one field: {', '.join(which)}")
            values = getattr(contents, which[0]) if which else []
            return codec.to_json(codec.from_contents(values, datatype, shape, name=name), datatype)
        if raw_in:
            return codec.to_json(codec.from_raw(raw_in.pop(0), datatype, shape, name=name), datatype)
    except codec.CodecError as e:
        raise ConvertError(str(e)) from e
    return None


def dump(model: Any) -> Any:
    if isinstance(model, list):
        return [dump(m) for m in model]
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
