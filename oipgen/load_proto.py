"""Load the .proto files of a spec: compiled by grpcio-tools' protoc into a descriptor set, never parsed by hand."""

from __future__ import annotations

import importlib.resources
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

from .api import Enum, Field, Message, Rpc
from .problems import Problems

_KINDS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE: "message",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_ENUM: "enum",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}

# Numbers of the repeated fields in descriptor.proto, as used by SourceCodeInfo location paths.
_FILE_MESSAGES, _FILE_ENUMS, _FILE_SERVICES = 4, 5, 6
_MESSAGE_FIELDS, _MESSAGE_NESTED, _MESSAGE_ENUMS = 2, 3, 4
_SERVICE_METHODS = 2

_PROTOC_LINE = re.compile(r"^(?P<file>[^:\s]+\.proto):(?P<line>\d+):(?P<col>\d+): (?P<msg>.*)$")


@dataclass(frozen=True)
class ProtoSet:
    package: str
    service: str
    service_module: str
    messages: tuple[Message, ...]
    enums: tuple[Enum, ...]
    rpcs: tuple[Rpc, ...]
    files: tuple[str, ...]
    descriptor_set: bytes


def run_protoc(args: list[str]) -> tuple[int, str]:
    """Run grpcio-tools' embedded protoc in this process; return its exit code and what it wrote to stderr.

    protoc's C++ code writes errors straight to file descriptor 2, so that descriptor is redirected to a file.
    """
    os.environ.setdefault("GRPC_PYTHON_DISABLE_DYNAMIC_STUBS", "1")
    from grpc_tools import protoc

    wkt = str(importlib.resources.files("grpc_tools") / "_proto")
    main: Callable[[list[str]], int] = protoc.main
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err:
        os.dup2(err.fileno(), 2)
        try:
            rc = main(["protoc", f"-I{wkt}", *args])
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return rc, err.read().decode("utf-8", "replace")


def load_protos(spec_dir: Path, problems: Problems) -> ProtoSet | None:
    proto_paths = sorted(spec_dir.glob("*.proto"))
    if not proto_paths:
        problems.add(str(spec_dir), "", "no .proto file found")
        return None
    names = [p.name for p in proto_paths]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc, err = run_protoc(
            [f"-I{spec_dir}", f"--descriptor_set_out={out}", "--include_imports", "--include_source_info", *names]
        )
        if rc != 0 or not out.exists():
            _report_protoc_errors(spec_dir, names, err, problems)
            return None
        data = out.read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    ours = [f for f in fds.file if f.name in names]
    return _walk(spec_dir, ours, fds, problems)


def _spec_file(spec_dir: Path, names: list[str], reported: str) -> str:
    """protoc names a file by the path it opened, the -I folder joined with the name (`myspec/x.proto` for
    --spec myspec): name it once, as the user gave the folder."""
    path = Path(reported)
    for name in names:
        if reported == name or path == spec_dir / name:
            return str(spec_dir / name)
    return reported


def _report_protoc_errors(spec_dir: Path, names: list[str], err: str, problems: Problems) -> None:
    found = False
    for line in err.splitlines():
        m = _PROTOC_LINE.match(line.strip())
        if m:
            problems.add(_spec_file(spec_dir, names, m["file"]), f"line {m['line']}:{m['col']}", m["msg"])
            found = True
        elif line.strip() and not line.startswith("Warning"):
            file = next((n for n in names if line.startswith(n)), ", ".join(names))
            problems.add(str(spec_dir / file), "", line.strip())
            found = True
    if not found:
        problems.add(str(spec_dir), "", "protoc failed without saying why")


def _comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    docs: dict[tuple[int, ...], str] = {}
    for loc in file.source_code_info.location:
        text = loc.leading_comments or loc.trailing_comments
        if text:
            docs[tuple(loc.path)] = " ".join(line.strip() for line in text.strip().splitlines()).strip()
    return docs


# grpcio-tools prints the comments of services and RPCs into `*_pb2_grpc.py` as docstrings, as they are: a `"""`
# there would end the docstring and make the rest of the comment code, and a backslash starts an escape sequence.
_DOCSTRING_BREAKERS = ('"""', "\\")


def _check_printed_comments(spec_dir: Path, file: descriptor_pb2.FileDescriptorProto, problems: Problems) -> None:
    """Refuse the comments of services and RPCs that would not stay a docstring in the generated stubs."""
    for loc in file.source_code_info.location:
        path = tuple(loc.path)
        if not path or path[0] != _FILE_SERVICES or len(path) not in (2, 4):
            continue
        for text in (loc.leading_comments, loc.trailing_comments, *loc.leading_detached_comments):
            found = [b for b in _DOCSTRING_BREAKERS if b in text]
            if found:
                line = loc.span[0] + 1 if loc.span else 0
                problems.add(str(spec_dir / file.name), f"line {line}",
                             f"a comment of a service or RPC holds {' and '.join(map(repr, found))}: it becomes a "
                             "docstring of the generated stubs, where that would end the docstring or start an "
                             "escape sequence")


class _FileWalker:
    """Turns one file's descriptors into API-model messages and enums."""

    def __init__(self, spec_dir: Path, file: descriptor_pb2.FileDescriptorProto, package: str,
                 map_entries: dict[str, tuple[descriptor_pb2.FieldDescriptorProto,
                                              descriptor_pb2.FieldDescriptorProto]],
                 problems: Problems) -> None:
        self.path = str(spec_dir / file.name)
        self.package = package
        self.module = file.name.removesuffix(".proto").replace("/", ".")
        self.docs = _comments(file)
        self.map_entries = map_entries
        self.problems = problems
        self.messages: list[Message] = []
        self.enums: list[Enum] = []

    def enum(self, e: descriptor_pb2.EnumDescriptorProto, prefix: str, path: tuple[int, ...]) -> None:
        py_path = f"{prefix}{e.name}"
        values = tuple((v.name, v.number) for v in e.value)
        self.enums.append(Enum(f"{self.package}.{py_path}", py_path, self.module, values, self.docs.get(path, "")))

    def message(self, m: descriptor_pb2.DescriptorProto, prefix: str, path: tuple[int, ...]) -> None:
        if m.options.map_entry:
            return
        py_path = f"{prefix}{m.name}"
        full = f"{self.package}.{py_path}"
        oneofs = [o.name for o in m.oneof_decl]
        used_oneofs: set[str] = set()
        fields: list[Field] = []
        for i, f in enumerate(m.field):
            type_name = f.type_name.lstrip(".") or None
            kind = _KINDS.get(f.type, "")
            if not kind:
                self.problems.add(self.path, full, f"field {f.name!r} has an unsupported type")
                continue
            map_key = None
            if type_name in self.map_entries:
                key, value = self.map_entries[type_name]
                map_key = _KINDS[key.type]
                kind = _KINDS[value.type]
                type_name = value.type_name.lstrip(".") or None
            oneof = None
            if f.HasField("oneof_index") and not f.proto3_optional:  # proto3 `optional` is a synthetic oneof
                oneof = oneofs[f.oneof_index]
                used_oneofs.add(oneof)
            repeated = f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED and map_key is None
            fields.append(Field(f.name, f.number, kind, type_name, repeated, map_key, oneof, f.json_name,
                                self.docs.get((*path, _MESSAGE_FIELDS, i), "")))
        real_oneofs = tuple(o for o in oneofs if o in used_oneofs)
        self.messages.append(Message(full, py_path, self.module, tuple(fields), real_oneofs, self.docs.get(path, "")))
        for j, nested in enumerate(m.nested_type):
            self.message(nested, f"{py_path}.", (*path, _MESSAGE_NESTED, j))
        for j, e in enumerate(m.enum_type):
            self.enum(e, f"{py_path}.", (*path, _MESSAGE_ENUMS, j))


def _walk(
    spec_dir: Path,
    files: list[descriptor_pb2.FileDescriptorProto],
    fds: descriptor_pb2.FileDescriptorSet,
    problems: Problems,
) -> ProtoSet | None:
    packages = {f.package for f in files}
    if len(packages) != 1:
        problems.add(str(spec_dir), "", f"all .proto files must share one package, found {sorted(packages)}")
        return None
    package = packages.pop()
    map_entries = _map_entries(fds)
    messages: list[Message] = []
    enums: list[Enum] = []
    rpcs: list[Rpc] = []
    services: list[tuple[str, str]] = []
    for file in files:
        _check_printed_comments(spec_dir, file, problems)
        walker = _FileWalker(spec_dir, file, package, map_entries, problems)
        for i, m in enumerate(file.message_type):
            walker.message(m, "", (_FILE_MESSAGES, i))
        for i, e in enumerate(file.enum_type):
            walker.enum(e, "", (_FILE_ENUMS, i))
        messages += walker.messages
        enums += walker.enums
        for i, s in enumerate(file.service):
            services.append((s.name, file.name))
            for j, method in enumerate(s.method):
                rpcs.append(
                    Rpc(
                        name=method.name,
                        request=method.input_type.lstrip("."),
                        response=method.output_type.lstrip("."),
                        client_streaming=method.client_streaming,
                        server_streaming=method.server_streaming,
                        doc=walker.docs.get((_FILE_SERVICES, i, _SERVICE_METHODS, j), ""),
                    )
                )
    if len(services) != 1:
        where = ", ".join(f"{name} ({file})" for name, file in services) or "none"
        problems.add(str(spec_dir), "", f"the spec must define exactly one gRPC service; found {where}")
        return None
    own = descriptor_pb2.FileDescriptorSet()
    own.file.extend(files)
    return ProtoSet(
        package=package,
        service=services[0][0],
        service_module=services[0][1].removesuffix(".proto").replace("/", "."),
        messages=tuple(messages),
        enums=tuple(enums),
        rpcs=tuple(rpcs),
        files=tuple(f.name for f in files),
        descriptor_set=own.SerializeToString(deterministic=True),
    )


def _map_entries(
    fds: descriptor_pb2.FileDescriptorSet,
) -> dict[str, tuple[descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto]]:
    """Full names of the synthetic map-entry messages, with their key and value fields."""
    found: dict[str, tuple[descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto]] = {}

    def walk(m: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        full = f"{prefix}.{m.name}"
        if m.options.map_entry:
            found[full.lstrip(".")] = (m.field[0], m.field[1])
        for nested in m.nested_type:
            walk(nested, full)

    for f in fds.file:
        for m in f.message_type:
            walk(m, f".{f.package}" if f.package else "")
    return found
