"""`oipgen breaking`: the changes between two specs that break existing clients or servers, REST and gRPC together.

gRPC follows buf's WIRE and WIRE_JSON rule sets (plus the deletions buf files under FILE/PACKAGE that still break a
peer: services, RPCs, messages, enums), compared on the descriptor sets protoc produced for each spec. REST compares
the two OpenAPI documents, following `$ref`s as it walks: operations, path parameters, request bodies (a client's
old request must still be accepted) and responses (a client must still find what it read before).
"""

from __future__ import annotations

import base64
import binascii
import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError

from .api import Api

_F = descriptor_pb2.FieldDescriptorProto
_TYPE_NAMES = {v: k.removeprefix("TYPE_").lower() for k, v in _F.Type.items()}
# Scalar types that read each other's values both in the binary and in the JSON encoding (buf's
# FIELD_WIRE_JSON_COMPATIBLE_TYPE); every other change of a scalar type breaks one of the two.
_JSON_COMPATIBLE = (frozenset({"int32", "uint32"}), frozenset({"int64", "uint64"}),
                    frozenset({"fixed32", "sfixed32"}), frozenset({"fixed64", "sfixed64"}))
_HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@dataclass(frozen=True, order=True)
class Break:
    """One breaking change: where it is, the rule it breaks and why that breaks a peer."""

    where: str
    rule: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}: {self.why}"


def compare(old: Api, new: Api) -> list[Break]:
    """Every change from `old` to `new` that breaks a client or server built on `old`, sorted."""
    found = grpc_breaks(_descriptor_set(old), _descriptor_set(new))
    found += rest_breaks(old.openapi, new.openapi)
    return sorted(set(found))


def _descriptor_set(api: Api) -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(api.descriptor_set)


# -- gRPC ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Msg:
    proto: descriptor_pb2.DescriptorProto
    file: descriptor_pb2.FileDescriptorProto


@dataclass(frozen=True)
class _EnumT:
    proto: descriptor_pb2.EnumDescriptorProto
    file: descriptor_pb2.FileDescriptorProto


class _Protos:
    """The messages, enums and services of a descriptor set, by name relative to the package."""

    def __init__(self, fds: descriptor_pb2.FileDescriptorSet) -> None:
        self.messages: dict[str, _Msg] = {}
        self.enums: dict[str, _EnumT] = {}
        self.services: dict[str, tuple[descriptor_pb2.ServiceDescriptorProto, descriptor_pb2.FileDescriptorProto]] = {}
        self.packages = sorted({f.package for f in fds.file})
        for file in fds.file:
            for m in file.message_type:
                self._message(m, file, "")
            for e in file.enum_type:
                self.enums[e.name] = _EnumT(e, file)
            for s in file.service:
                self.services[s.name] = (s, file)

    def _message(self, m: descriptor_pb2.DescriptorProto, file: descriptor_pb2.FileDescriptorProto,
                 prefix: str) -> None:
        name = f"{prefix}{m.name}"
        self.messages[name] = _Msg(m, file)
        for nested in m.nested_type:
            self._message(nested, file, f"{name}.")
        for e in m.enum_type:
            self.enums[f"{name}.{e.name}"] = _EnumT(e, file)

    def relative(self, type_name: str, package: str) -> str:
        name = type_name.lstrip(".")
        return name.removeprefix(f"{package}.") if package else name

    def is_map(self, f: descriptor_pb2.FieldDescriptorProto, package: str) -> bool:
        entry = self.messages.get(self.relative(f.type_name, package)) if f.type == _F.TYPE_MESSAGE else None
        return bool(entry and entry.proto.options.map_entry)


def _reserved(numbers: Any, value: int, inclusive_end: bool) -> bool:
    return any(r.start <= value < r.end + (1 if inclusive_end else 0) for r in numbers)


def _json_format(file: descriptor_pb2.FileDescriptorProto) -> str:
    return "best-effort" if file.syntax in ("", "proto2") else "supported"


def grpc_breaks(old_fds: descriptor_pb2.FileDescriptorSet, new_fds: descriptor_pb2.FileDescriptorSet) -> list[Break]:
    old, new = _Protos(old_fds), _Protos(new_fds)
    out: list[Break] = []
    old_pkg = old.packages[0] if old.packages else ""
    new_pkg = new.packages[0] if new.packages else ""
    if old.packages != new.packages:
        out.append(Break(f"gRPC package {old_pkg}", "FILE_SAME_PACKAGE",
                         f"package changed to {new_pkg!r}: every message name and RPC path (/{old_pkg}.Service/Method) "
                         "changes, so old peers address nothing that exists"))
    _services(old, new, old_pkg, new_pkg, out)
    deleted: set[str] = set()
    for name, om in old.messages.items():
        if om.proto.options.map_entry:
            continue
        nm = new.messages.get(name)
        if nm is None:
            deleted.add(name)
            if name.rpartition(".")[0] in deleted:
                continue  # inside a deleted message: reported with it
            out.append(Break(f"gRPC message {old_pkg}.{name}", "MESSAGE_NO_DELETE",
                             "message deleted: the RPCs and fields that carried it can no longer be described"))
            continue
        _message(old, new, old_pkg, new_pkg, name, om, nm, out)
    for name, oe in old.enums.items():
        ne = new.enums.get(name)
        if ne is None:
            if name.rpartition(".")[0] in deleted:
                continue
            out.append(Break(f"gRPC enum {old_pkg}.{name}", "ENUM_NO_DELETE",
                             "enum deleted: the fields that carried it can no longer be described"))
            continue
        _enum(f"gRPC enum {new_pkg}.{name}", oe, ne, out)
    return out


def _services(old: _Protos, new: _Protos, old_pkg: str, new_pkg: str, out: list[Break]) -> None:
    for sname, (os_, _) in old.services.items():
        found = new.services.get(sname)
        if found is None:
            out.append(Break(f"gRPC service {old_pkg}.{sname}", "SERVICE_NO_DELETE",
                             f"service deleted: every call to /{old_pkg}.{sname}/... now fails with UNIMPLEMENTED"))
            continue
        ns = found[0]
        new_methods = {m.name: m for m in ns.method}
        for om in os_.method:
            where = f"gRPC rpc {new_pkg}.{sname}.{om.name}"
            nm = new_methods.get(om.name)
            if nm is None:
                out.append(Break(where, "RPC_NO_DELETE",
                                 f"RPC deleted: calls to /{old_pkg}.{sname}/{om.name} now fail with UNIMPLEMENTED"))
                continue
            for rule, attr, what in (("RPC_SAME_REQUEST_TYPE", "input_type", "request"),
                                     ("RPC_SAME_RESPONSE_TYPE", "output_type", "response")):
                was = old.relative(getattr(om, attr), old_pkg)
                now = new.relative(getattr(nm, attr), new_pkg)
                if was != now:
                    out.append(Break(where, rule, f"{what} type changed from {was} to {now}: the peers "
                                                  f"decode each other's {what}s as the wrong message"))
            for rule, attr, side in (("RPC_SAME_CLIENT_STREAMING", "client_streaming", "client"),
                                     ("RPC_SAME_SERVER_STREAMING", "server_streaming", "server")):
                if getattr(om, attr) != getattr(nm, attr):
                    kind = "streaming" if getattr(nm, attr) else "unary"
                    out.append(Break(where, rule, f"the {side} side became {kind}: the call shape differs, so "
                                                  "old stubs fail against the new service"))
            if om.options.idempotency_level != nm.options.idempotency_level:
                out.append(Break(where, "RPC_SAME_IDEMPOTENCY_LEVEL",
                                 "idempotency_level changed: the HTTP method of the call (GET or POST) changes for "
                                 "clients that use it"))


def _field_kind(protos: _Protos, f: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    """The cardinality as the JSON form sees it: map, repeated, required or optional (presence does not count)."""
    if protos.is_map(f, package):
        return "map"
    if f.label == _F.LABEL_REPEATED:
        return "repeated"
    return "required" if f.label == _F.LABEL_REQUIRED else "optional"


def _field_type(protos: _Protos, f: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_ENUM, _F.TYPE_GROUP):
        if protos.is_map(f, package):
            entry = protos.messages[protos.relative(f.type_name, package)].proto
            key, value = entry.field[0], entry.field[1]
            return f"map<{_field_type(protos, key, package)}, {_field_type(protos, value, package)}>"
        return protos.relative(f.type_name, package)
    return _TYPE_NAMES[f.type]


def _real_oneof(m: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto) -> str | None:
    if f.HasField("oneof_index") and not f.proto3_optional:
        return m.oneof_decl[f.oneof_index].name
    return None


def _message(old: _Protos, new: _Protos, old_pkg: str, new_pkg: str, name: str, om: _Msg, nm: _Msg,
             out: list[Break]) -> None:
    where = f"gRPC message {new_pkg}.{name}"
    o, n = om.proto, nm.proto
    if _json_format(om.file) != _json_format(nm.file):
        out.append(Break(where, "MESSAGE_SAME_JSON_FORMAT", f"JSON support changed from {_json_format(om.file)} "
                                                            f"to {_json_format(nm.file)} (file syntax changed)"))
    if o.options.message_set_wire_format != n.options.message_set_wire_format:
        out.append(Break(where, "MESSAGE_SAME_MESSAGE_SET_WIRE_FORMAT", "message_set_wire_format changed: the "
                                                                        "binary encoding of the whole message changes"))
    _reserved_kept(where, "RESERVED_MESSAGE_NO_DELETE", o.reserved_range, n.reserved_range, False,
                   o.reserved_name, n.reserved_name, out)
    old_required = {f.name for f in o.field if f.label == _F.LABEL_REQUIRED}
    new_required = {f.name for f in n.field if f.label == _F.LABEL_REQUIRED}
    for fname in sorted(old_required ^ new_required):
        change = "added" if fname in new_required else "deleted"
        out.append(Break(where, "MESSAGE_SAME_REQUIRED_FIELDS",
                         f"required field {fname!r} {change}: messages from the other version fail to parse"))
    new_by_number = {f.number: f for f in n.field}
    new_by_name = {f.name: f for f in n.field}
    for of in o.field:
        fwhere = f"{where} field {of.number} {of.name!r}"
        nf = new_by_number.get(of.number)
        if nf is None:
            moved = new_by_name.get(of.name)
            number_kept = _reserved(n.reserved_range, of.number, False)
            name_kept = of.name in n.reserved_name
            if moved is not None:
                out.append(Break(fwhere, "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED",
                                 f"renumbered from {of.number} to {moved.number}: old peers write and read the "
                                 "value under the old number, which the new version ignores"))
            elif not number_kept:
                out.append(Break(fwhere, "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED",
                                 "deleted without reserving its number: a later field may reuse it and misread old "
                                 "data"))
            elif not name_kept:
                out.append(Break(fwhere, "FIELD_NO_DELETE_UNLESS_NAME_RESERVED",
                                 "deleted without reserving its name: a later field may reuse the JSON name and "
                                 "misread old JSON"))
            continue
        _field(old, new, old_pkg, new_pkg, fwhere, om, nm, of, nf, out)


def _field(old: _Protos, new: _Protos, old_pkg: str, new_pkg: str, where: str, om: _Msg, nm: _Msg,
           of: descriptor_pb2.FieldDescriptorProto, nf: descriptor_pb2.FieldDescriptorProto,
           out: list[Break]) -> None:
    if of.name != nf.name:
        out.append(Break(where, "FIELD_SAME_NAME", f"renamed to {nf.name!r}: the JSON encoding may name the field "
                                                   "by its proto name, which old peers no longer find"))
    if of.json_name != nf.json_name:
        out.append(Break(where, "FIELD_SAME_JSON_NAME", f"JSON name changed from {of.json_name!r} to "
                                                        f"{nf.json_name!r}: the JSON of old peers is not understood"))
    was_kind, now_kind = _field_kind(old, of, old_pkg), _field_kind(new, nf, new_pkg)
    if was_kind != now_kind:
        out.append(Break(where, "FIELD_WIRE_JSON_COMPATIBLE_CARDINALITY",
                         f"cardinality changed from {was_kind} to {now_kind}: the binary or JSON form of the value "
                         "differs"))
    was, now = _field_type(old, of, old_pkg), _field_type(new, nf, new_pkg)
    if was != now and not _compatible_types(old, new, old_pkg, new_pkg, of, nf):
        out.append(Break(where, "FIELD_WIRE_JSON_COMPATIBLE_TYPE",
                         f"type changed from {was} to {now}: old and new peers cannot read each other's value"))
    was_oneof, now_oneof = _real_oneof(om.proto, of), _real_oneof(nm.proto, nf)
    if was_oneof != now_oneof:
        where_to = f"into oneof {now_oneof!r}" if now_oneof else "out of its oneof"
        out.append(Break(where, "FIELD_SAME_ONEOF", f"moved {where_to} (was {was_oneof or 'none'}): setting "
                                                    "it now clears, or no longer clears, the other members"))
    if of.default_value != nf.default_value:
        out.append(Break(where, "FIELD_SAME_DEFAULT", f"default changed from {of.default_value!r} to "
                                                      f"{nf.default_value!r}: an absent value reads differently"))
    if (of.type == nf.type == _F.TYPE_STRING and om.file.syntax != nm.file.syntax
            and "proto3" in (om.file.syntax, nm.file.syntax)):
        out.append(Break(where, "FIELD_SAME_UTF8_VALIDATION", "UTF-8 validation changed with the file syntax: "
                                                              "values one side accepts the other rejects"))


def _compatible_types(old: _Protos, new: _Protos, old_pkg: str, new_pkg: str,
                      of: descriptor_pb2.FieldDescriptorProto, nf: descriptor_pb2.FieldDescriptorProto) -> bool:
    was, now = _TYPE_NAMES[of.type], _TYPE_NAMES[nf.type]
    if was == now == "enum":
        oe, ne = old.enums.get(old.relative(of.type_name, old_pkg)), new.enums.get(new.relative(nf.type_name, new_pkg))
        if oe is None or ne is None or oe.proto.name != ne.proto.name:
            return False
        new_values = {(v.name, v.number) for v in ne.proto.value}
        return all((v.name, v.number) in new_values for v in oe.proto.value)
    return any(was in group and now in group for group in _JSON_COMPATIBLE)


def _enum(where: str, oe: _EnumT, ne: _EnumT, out: list[Break]) -> None:
    o, n = oe.proto, ne.proto
    if _json_format(oe.file) != _json_format(ne.file):
        out.append(Break(where, "ENUM_SAME_JSON_FORMAT", f"JSON support changed from {_json_format(oe.file)} to "
                                                         f"{_json_format(ne.file)} (file syntax changed)"))
    _reserved_kept(where, "RESERVED_ENUM_NO_DELETE", o.reserved_range, n.reserved_range, True,
                   o.reserved_name, n.reserved_name, out)
    new_names: dict[int, set[str]] = {}
    for v in n.value:
        new_names.setdefault(v.number, set()).add(v.name)
    new_numbers = {v.name: v.number for v in n.value}
    old_names: dict[int, set[str]] = {}
    for v in o.value:
        old_names.setdefault(v.number, set()).add(v.name)
    for number, names in sorted(old_names.items()):
        label = "/".join(sorted(names))
        vwhere = f"{where} value {label} = {number}"
        if number not in new_names:
            moved = sorted(name for name in names if name in new_numbers)
            if moved:
                out.append(Break(vwhere, "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED",
                                 f"renumbered to {new_numbers[moved[0]]}: the binary form of {moved[0]} changes, "
                                 f"old peers' {number} is unknown to the new version"))
            elif not _reserved(n.reserved_range, number, True):
                out.append(Break(vwhere, "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED",
                                 "deleted without reserving its number: old peers still send it"))
            elif not all(name in n.reserved_name for name in names):
                out.append(Break(vwhere, "ENUM_VALUE_NO_DELETE_UNLESS_NAME_RESERVED",
                                 "deleted without reserving its name: old peers still send it in JSON"))
            continue
        lost = names - new_names[number]
        if lost:
            out.append(Break(vwhere, "ENUM_VALUE_SAME_NAME",
                             f"renamed to {'/'.join(sorted(new_names[number]))}: JSON carries the name, which old "
                             "peers no longer understand"))


def _reserved_kept(where: str, rule: str, old_ranges: Any, new_ranges: Any, inclusive_end: bool,
                   old_names: Any, new_names: Any, out: list[Break]) -> None:
    for r in old_ranges:
        end = r.end if inclusive_end else r.end - 1
        if not all(_reserved(new_ranges, n, inclusive_end) for n in range(r.start, end + 1)):
            span = str(r.start) if end == r.start else f"{r.start} to {end}"
            out.append(Break(where, rule, f"reserved number(s) {span} no longer reserved: a new member may reuse "
                                          "them and misread old data"))
    for name in sorted(set(old_names) - set(new_names)):
        out.append(Break(where, rule, f"reserved name {name!r} no longer reserved: a new member may reuse it and "
                                      "misread old JSON"))


# -- what a build records, and the proto-level view ----------------------------------------------------------------
def recorded_descriptors(api: Api) -> str:
    """The spec's descriptors as a build records them in its manifest: the FileDescriptorSet without source
    info (comments and positions change no wire), serialized deterministically, in base64. The next build
    compares its own with these (`build_breaks`)."""
    fds = _descriptor_set(api)
    for file in fds.file:
        file.ClearField("source_code_info")
    return base64.b64encode(fds.SerializeToString(deterministic=True)).decode("ascii")


def read_recorded(text: object) -> descriptor_pb2.FileDescriptorSet:
    """The descriptors a manifest recorded; ValueError when they are not a consistent descriptor set (the
    manifest is repository content: protobuf's own pool checks every reference before anything reads them)."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError) as e:
        raise ValueError(str(e) or type(e).__name__) from None
    pool = descriptor_pool.DescriptorPool()
    for file in fds.file:
        try:
            pool.Add(file)
        except Exception as e:  # protobuf raises TypeError or others, by implementation
            raise ValueError(str(e).splitlines()[0][:200] if str(e) else type(e).__name__) from None
    return fds


def build_breaks(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[Break]:
    """The gRPC wire breaks from the descriptors a previous build recorded in its manifest to those of this
    build's manifest, by the rules of `oipgen breaking`. None recorded (no previous build, or one of an older
    oipgen): nothing to compare. ValueError: the record is unreadable."""
    if previous is None or "descriptors" not in previous:
        return []
    return sorted(set(grpc_breaks(read_recorded(previous["descriptors"]), read_recorded(current["descriptors"]))))


def proto_view(fds: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """The descriptors at the proto level, one line per message, field, reserved range or name, enum value and RPC,
    in declaration order, naming what the wire rules above compare (numbers, types, cardinality, oneofs, JSON
    names, defaults): `message inference.ModelMetadataResponse field platform = 3: string`."""
    protos = _Protos(fds)
    package = protos.packages[0] if protos.packages else ""
    prefix = f"{package}." if package else ""
    out: list[str] = []
    for name, m in protos.messages.items():
        if m.proto.options.map_entry:
            continue
        where = f"message {prefix}{name}"
        out.append(where + (" (message_set_wire_format)" if m.proto.options.message_set_wire_format else ""))
        for f in m.proto.field:
            kind = _field_kind(protos, f, package)
            label = "" if kind in ("map", "optional") else f"{kind} "
            notes = [f"oneof {oneof}" for oneof in [_real_oneof(m.proto, f)] if oneof]
            notes += ["optional"] if f.proto3_optional else []
            notes += [f"json {f.json_name!r}"] if f.json_name and f.json_name != _json_name(f.name) else []
            notes += [f"default {f.default_value!r}"] if f.HasField("default_value") else []
            extra = f" ({', '.join(notes)})" if notes else ""
            out.append(f"{where} field {f.name} = {f.number}: {label}{_field_type(protos, f, package)}{extra}")
        out += _reserved_lines(where, m.proto.reserved_range, m.proto.reserved_name, inclusive_end=False)
    for name, e in protos.enums.items():
        where = f"enum {prefix}{name}"
        out.append(where)
        out += [f"{where} value {v.name} = {v.number}" for v in e.proto.value]
        out += _reserved_lines(where, e.proto.reserved_range, e.proto.reserved_name, inclusive_end=True)
    for sname, (service, _) in protos.services.items():
        for rpc in service.method:
            request = ("stream " if rpc.client_streaming else "") + protos.relative(rpc.input_type, package)
            response = ("stream " if rpc.server_streaming else "") + protos.relative(rpc.output_type, package)
            level = rpc.options.idempotency_level
            note = f" ({descriptor_pb2.MethodOptions.IdempotencyLevel.Name(level)})" if level else ""
            out.append(f"service {prefix}{sname} rpc {rpc.name}({request}) returns ({response}){note}")
    return out


def descriptor_view(serialized_file: bytes) -> list[str] | None:
    """`proto_view` of one serialized FileDescriptorProto (what a protoc module holds); None if it is not one."""
    try:
        file = descriptor_pb2.FileDescriptorProto.FromString(serialized_file)
        return proto_view(descriptor_pb2.FileDescriptorSet(file=[file]))
    except (DecodeError, IndexError, KeyError):  # not a descriptor, or one that refers to what it lacks
        return None


def _json_name(name: str) -> str:
    """protoc's default JSON name: lowerCamelCase of the field name."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _reserved_lines(where: str, ranges: Any, names: Any, inclusive_end: bool) -> list[str]:
    out = []
    for r in ranges:
        end = r.end if inclusive_end else r.end - 1
        out.append(f"{where} reserved {r.start}" + (f" to {end}" if end != r.start else ""))
    return out + [f"{where} reserved name {name!r}" for name in names]


# -- REST ---------------------------------------------------------------------------------------------------------
def _deref(doc: dict[str, Any], node: Any) -> Any:
    """Follow local `$ref`s until a node without one (the loader has checked they resolve)."""
    seen: set[str] = set()
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"] not in seen:
        ref = node["$ref"]
        seen.add(ref)
        target: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        node = target
    return node


def _template(path: str) -> tuple[str, tuple[str, ...]]:
    """`/v2/models/{model_name}/infer` -> (`/v2/models/{}/infer`, ("model_name",))."""
    parts = path.split("/")
    names = tuple(p[1:-1] for p in parts if p.startswith("{") and p.endswith("}"))
    shape = "/".join("{}" if p.startswith("{") and p.endswith("}") else p for p in parts)
    return shape, names


def rest_breaks(old_doc: dict[str, Any], new_doc: dict[str, Any]) -> list[Break]:
    out: list[Break] = []
    new_paths: dict[str, tuple[str, dict[str, Any]]] = {}
    for path, item in (new_doc.get("paths") or {}).items():
        new_paths[_template(path)[0]] = (path, _deref(new_doc, item) or {})
    for path, item in (old_doc.get("paths") or {}).items():
        item = _deref(old_doc, item) or {}
        shape, names = _template(path)
        found = new_paths.get(shape)
        if found is None:
            out.append(Break(f"REST {path}", "REST_PATH_NO_DELETE",
                             "path deleted: every call to it now answers 404"))
            continue
        new_path, new_item = found
        new_names = _template(new_path)[1]
        for was, now in zip(names, new_names, strict=True):
            if was != now:
                out.append(Break(f"REST {path}", "REST_PATH_PARAMETER_SAME_NAME",
                                 f"path parameter {{{was}}} renamed to {{{now}}}: clients pass it by name"))
        for method in _HTTP_METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            where = f"REST {method.upper()} {path}"
            new_op = new_item.get(method)
            if not isinstance(new_op, dict):
                out.append(Break(where, "REST_METHOD_NO_DELETE", "operation deleted: calls now answer 405"))
                continue
            _operation(old_doc, new_doc, where, item, op, new_item, new_op, out)
    return out


def _parameters(doc: dict[str, Any], item: dict[str, Any], op: dict[str, Any]) -> dict[tuple[str, str], Any]:
    params: dict[tuple[str, str], Any] = {}
    for p in [*(item.get("parameters") or []), *(op.get("parameters") or [])]:
        p = _deref(doc, p)
        if isinstance(p, dict) and p.get("in") != "path":
            params[(str(p.get("in")), str(p.get("name")))] = p
    return params


def _operation(old_doc: dict[str, Any], new_doc: dict[str, Any], where: str, item: dict[str, Any],
               op: dict[str, Any], new_item: dict[str, Any], new_op: dict[str, Any], out: list[Break]) -> None:
    old_params = _parameters(old_doc, item, op)
    for key, p in _parameters(new_doc, new_item, new_op).items():
        was = old_params.get(key)
        if p.get("required") and not (was and was.get("required")):
            out.append(Break(f"{where} {key[0]} parameter {key[1]!r}", "REST_REQUEST_PARAMETER_REQUIRED",
                             "required parameter added: old clients do not send it"))
    body, new_body = _deref(old_doc, op.get("requestBody")), _deref(new_doc, new_op.get("requestBody"))
    if isinstance(new_body, dict):
        if new_body.get("required") and not (isinstance(body, dict) and body.get("required")):
            out.append(Break(f"{where} request body", "REST_REQUEST_BODY_REQUIRED",
                             "the body became required: old clients may send none"))
        if isinstance(body, dict):
            for media, content in (body.get("content") or {}).items():
                new_content = (new_body.get("content") or {}).get(media)
                if new_content is None:
                    out.append(Break(f"{where} request body", "REST_REQUEST_MEDIA_TYPE_NO_DELETE",
                                     f"{media} bodies are no longer accepted"))
                    continue
                _Walk(old_doc, new_doc, f"{where} request body", out).request(
                    (content or {}).get("schema"), new_content.get("schema"), "")
    responses, new_responses = op.get("responses") or {}, new_op.get("responses") or {}
    for status, answer in responses.items():
        new_answer = new_responses.get(status, new_responses.get(str(status)))
        rwhere = f"{where} response {status}"
        if new_answer is None:
            out.append(Break(rwhere, "REST_RESPONSE_STATUS_NO_DELETE",
                             "status no longer documented: clients that handle it meet an undescribed answer"))
            continue
        answer, new_answer = _deref(old_doc, answer) or {}, _deref(new_doc, new_answer) or {}
        for media, content in (answer.get("content") or {}).items():
            new_content = (new_answer.get("content") or {}).get(media)
            if new_content is None:
                out.append(Break(rwhere, "REST_RESPONSE_MEDIA_TYPE_NO_DELETE",
                                 f"no longer answers {media}: clients parse what they no longer get"))
                continue
            _Walk(old_doc, new_doc, rwhere, out).response((content or {}).get("schema"), new_content.get("schema"), "")


def _types(doc: dict[str, Any], schema: Any, seen: frozenset[int] = frozenset()) -> frozenset[str] | None:
    """The JSON types a schema admits (None: any), looking through oneOf/anyOf/allOf branches."""
    schema = _deref(doc, schema)
    if not isinstance(schema, dict) or id(schema) in seen:
        return None
    seen = seen | {id(schema)}
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else list(schema.get("enum") or [])
        found = {_json_type(v) for v in values}
        return frozenset(found)
    if "type" in schema:
        t = schema["type"]
        return frozenset([t] if isinstance(t, str) else [str(x) for x in t])
    branches = [*(schema.get("oneOf") or []), *(schema.get("anyOf") or [])]
    if branches:
        union: set[str] = set()
        for b in branches:
            bt = _types(doc, b, seen)
            if bt is None:
                return None
            union |= bt
        return frozenset(union)
    if "properties" in schema:
        return frozenset({"object"})
    if "items" in schema:
        return frozenset({"array"})
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _accepts(types: frozenset[str] | None, t: str) -> bool:
    return types is None or t in types or (t == "integer" and "number" in types)


class _Walk:
    """Compares an old and a new schema side by side, through properties and items, each pair once."""

    def __init__(self, old_doc: dict[str, Any], new_doc: dict[str, Any], where: str, out: list[Break]) -> None:
        self.old_doc, self.new_doc, self.where, self.out = old_doc, new_doc, where, out
        self.seen: set[tuple[int, int, str]] = set()

    def _pair(self, old: Any, new: Any, kind: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        old, new = _deref(self.old_doc, old), _deref(self.new_doc, new)
        if not isinstance(old, dict) or not isinstance(new, dict) or (id(old), id(new), kind) in self.seen:
            return None
        self.seen.add((id(old), id(new), kind))
        return old, new

    def _at(self, path: str) -> str:
        return f"{self.where} {path}" if path else self.where

    def request(self, old: Any, new: Any, path: str) -> None:
        """The new schema must accept every body the old one accepted."""
        pair = self._pair(old, new, "request")
        if pair is None:
            return
        o, n = pair
        was, now = _types(self.old_doc, o), _types(self.new_doc, n)
        lost = sorted(t for t in (was or {"any"}) if not _accepts(now, t) and t != "any")
        if lost or (was is None and now is not None):
            self.out.append(Break(self._at(path), "REST_REQUEST_TYPE_NARROWED",
                                  f"no longer accepts {', '.join(lost) or 'any JSON'} (now {_show(now)}): old "
                                  "clients' values are refused"))
        old_enum, new_enum = _enum_values(o), _enum_values(n)
        if old_enum is not None and new_enum is not None:
            for value in old_enum:
                if value not in new_enum:
                    self.out.append(Break(self._at(path), "REST_REQUEST_ENUM_VALUE_NO_DELETE",
                                          f"value {value!r} no longer accepted: old clients still send it"))
        elif new_enum is not None and old_enum is None:
            self.out.append(Break(self._at(path), "REST_REQUEST_ENUM_VALUE_NO_DELETE",
                                  f"now limited to {sorted(map(str, new_enum))}: other values old clients send are "
                                  "refused"))
        old_props, new_props = o.get("properties") or {}, n.get("properties") or {}
        old_required = set(o.get("required") or [])
        for name in sorted(set(n.get("required") or []) - old_required):
            change = "added as required" if name not in old_props else "made required"
            self.out.append(Break(self._at(_join(path, name)), "REST_REQUEST_PROPERTY_REQUIRED",
                                  f"{change}: old clients' requests lack it and are refused"))
        if n.get("additionalProperties") is False and o.get("additionalProperties") is not False:
            self.out.append(Break(self._at(path), "REST_REQUEST_PROPERTY_NO_DELETE",
                                  "no longer accepts unlisted properties: old clients' extra keys are refused"))
        for name, schema in old_props.items():
            if name in new_props:
                self.request(schema, new_props[name], _join(path, name))
            elif n.get("additionalProperties") is False:
                self.out.append(Break(self._at(_join(path, name)), "REST_REQUEST_PROPERTY_NO_DELETE",
                                      "property deleted and unlisted properties refused: old clients send it"))
        if "items" in o and "items" in n:
            self.request(o["items"], n["items"], f"{path}[]")
        if isinstance(o.get("additionalProperties"), dict) and isinstance(n.get("additionalProperties"), dict):
            self.request(o["additionalProperties"], n["additionalProperties"], f"{path}{{}}")

    def response(self, old: Any, new: Any, path: str) -> None:
        """Everything a client read from the old answer must still be there, of the same type."""
        pair = self._pair(old, new, "response")
        if pair is None:
            return
        o, n = pair
        was, now = _types(self.old_doc, o), _types(self.new_doc, n)
        if was != now:
            self.out.append(Break(self._at(path), "REST_RESPONSE_TYPE_CHANGED",
                                  f"type changed from {_show(was)} to {_show(now)}: clients parse it as before"))
        old_props, new_props = o.get("properties") or {}, n.get("properties") or {}
        new_required = set(n.get("required") or [])
        for name, schema in old_props.items():
            at = self._at(_join(path, name))
            if name not in new_props:
                self.out.append(Break(at, "REST_RESPONSE_PROPERTY_NO_DELETE",
                                      "property deleted from the answer: clients that read it find nothing"))
                continue
            if name in set(o.get("required") or []) and name not in new_required:
                self.out.append(Break(at, "REST_RESPONSE_PROPERTY_REQUIRED",
                                      "no longer required in the answer: clients that rely on it may miss it"))
            self.response(schema, new_props[name], _join(path, name))
        if "items" in o and "items" in n:
            self.response(o["items"], n["items"], f"{path}[]")
        if isinstance(o.get("additionalProperties"), dict) and isinstance(n.get("additionalProperties"), dict):
            self.response(o["additionalProperties"], n["additionalProperties"], f"{path}{{}}")


def _enum_values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return list(values) if isinstance(values, list) else None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(types: frozenset[str] | None) -> str:
    return "any" if types is None else "|".join(sorted(types))


# -- where the old spec comes from ----------------------------------------------------------------------------------
class AgainstError(Exception):
    """`--against` names neither a spec folder nor a git revision holding the spec."""


@contextmanager
def spec_at(against: str, spec_dir: Path) -> Iterator[Path]:
    """The spec to compare against: a folder as it is, or a git revision's copy of `spec_dir` in a temp folder."""
    if Path(against).is_dir():
        yield Path(against)
        return
    here = spec_dir.resolve() if spec_dir.exists() else Path.cwd()
    top = _git(["rev-parse", "--show-toplevel"], here if here.is_dir() else here.parent)
    if top is None:
        raise AgainstError(f"{against!r} is not a folder, and {spec_dir} is not inside a git repository")
    root = Path(top.decode().strip())
    rel = spec_dir.resolve().relative_to(root).as_posix() if spec_dir.exists() else spec_dir.as_posix()
    if _git(["rev-parse", "--verify", "--quiet", f"{against}^{{commit}}"], root) is None:
        raise AgainstError(f"{against!r} is neither a spec folder nor a git revision of {root}")
    archive = _git(["archive", "--format=tar", against, "--", rel], root)
    if archive is None:
        raise AgainstError(f"revision {against!r} has no {rel}/ folder")
    with tempfile.TemporaryDirectory(prefix="oipgen-against-") as tmp, \
            tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp) / rel


def _git(args: list[str], cwd: Path) -> bytes | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
