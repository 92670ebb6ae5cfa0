"""`oipgen breaking`: crafted pairs of specs, each rule in both directions, and the command as users run it.

Every case copies the real spec into tmp_path and changes it programmatically. The gRPC cases work on a probe
message and RPC added to the proto (declared gRPC-only), so that no REST schema has to follow them.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, SPEC, oipgen
from google.protobuf import descriptor_pb2

from oipgen.api import Api
from oipgen.breaking import compare
from oipgen.load import load_spec
from oipgen.output import MANIFEST

PROBE = """
// A message and an RPC that only the breaking-change tests use.
message BreakProbe {
  message Inner { int32 a = 1; }
  enum Color {
    RED = 0;
    GREEN = 1;
    BLUE = 2;
  }
  int32 count = 1;
  string label = 2;
  map<string, int32> tags = 4;
  oneof choice {
    bool flag = 5;
    int64 number = 6;
  }
  Color color = 7;
  Inner inner = 8;
  int32 spare = 9;
  reserved 20, 21;
  reserved "gone";
}
"""
PROBE_RPC = "  rpc ProbeCall(BreakProbe) returns (BreakProbe) {}\n"
SERVICE = "service GRPCInferenceService {\n"

Edit = Callable[[Path], None]


def _proto(old: str, new: str, count: int = 1) -> Edit:
    def edit(spec: Path) -> None:
        path = spec / "grpc_service.proto"
        text = path.read_text()
        assert text.count(old) >= count, old
        path.write_text(text.replace(old, new, count))
    return edit


def _openapi(change: Callable[[dict[str, Any]], None]) -> Edit:
    def edit(spec: Path) -> None:
        doc = yaml.safe_load((spec / "openapi.yaml").read_text())
        change(doc)
        (spec / "openapi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return edit


def _grpc_only(rpc: str, present: bool) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        if present:
            doc["x-oip-grpc-only"][rpc] = "a probe for the breaking-change tests"
        else:
            del doc["x-oip-grpc-only"][rpc]
    return _openapi(change)


def _both(*edits: Edit) -> Edit:
    def edit(spec: Path) -> None:
        for e in edits:
            e(spec)
    return edit


with_probe = _both(_proto(SERVICE, SERVICE + PROBE_RPC), _proto("// Health\n", "// Health\n" + PROBE),
                   _grpc_only("ProbeCall", True))


def _spec(tmp_path: Path, name: str, *edits: Edit) -> Path:
    spec = tmp_path / name
    shutil.copytree(SPEC, spec, ignore=shutil.ignore_patterns("__pycache__"))
    for e in edits:
        e(spec)
    return spec


@pytest.fixture(scope="module")
def probe_api(tmp_path_factory: pytest.TempPathFactory) -> Api:
    return load_spec(_spec(tmp_path_factory.mktemp("probe"), "spec", with_probe))


def _rules(old: Api, new: Api) -> set[str]:
    return {b.rule for b in compare(old, new)}


# (name, edit of the probe spec, rules found from probe to edited, rules found from edited back to probe)
GRPC_CASES: list[tuple[str, Edit, set[str], set[str]]] = [
    ("field renumbered", _proto("int32 count = 1;", "int32 count = 10;"),
     {"FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"}, {"FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"}),
    ("field type", _proto("string label = 2;", "bytes label = 2;"),
     {"FIELD_WIRE_JSON_COMPATIBLE_TYPE"}, {"FIELD_WIRE_JSON_COMPATIBLE_TYPE"}),
    ("field type, wire and JSON compatible", _proto("int32 count = 1;", "uint32 count = 1;"), set(), set()),
    ("field type, 32 to 64 bits (JSON writes int64 as a string)", _proto("int32 count = 1;", "int64 count = 1;"),
     {"FIELD_WIRE_JSON_COMPATIBLE_TYPE"}, {"FIELD_WIRE_JSON_COMPATIBLE_TYPE"}),
    ("field cardinality", _proto("int32 spare = 9;", "repeated int32 spare = 9;"),
     {"FIELD_WIRE_JSON_COMPATIBLE_CARDINALITY"}, {"FIELD_WIRE_JSON_COMPATIBLE_CARDINALITY"}),
    ("explicit presence does not count", _proto("int32 spare = 9;", "optional int32 spare = 9;"), set(), set()),
    ("field JSON name", _proto("int32 spare = 9;", 'int32 spare = 9 [json_name = "extra"];'),
     {"FIELD_SAME_JSON_NAME"}, {"FIELD_SAME_JSON_NAME"}),
    ("field name", _proto("int32 spare = 9;", "int32 slot = 9;"),
     {"FIELD_SAME_NAME", "FIELD_SAME_JSON_NAME"}, {"FIELD_SAME_NAME", "FIELD_SAME_JSON_NAME"}),
    ("field deleted", _proto("  int32 spare = 9;\n", ""), {"FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"}, set()),
    ("field deleted, number reserved", _proto("  int32 spare = 9;\n", "  reserved 9;\n"),
     {"FIELD_NO_DELETE_UNLESS_NAME_RESERVED"}, {"RESERVED_MESSAGE_NO_DELETE"}),
    ("field deleted, number and name reserved", _proto("  int32 spare = 9;\n", '  reserved 9;\n  reserved "spare";\n'),
     set(), {"RESERVED_MESSAGE_NO_DELETE"}),
    ("message deleted", _both(_proto("  message Inner { int32 a = 1; }\n", ""), _proto("  Inner inner = 8;\n", "")),
     {"MESSAGE_NO_DELETE", "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"}, set()),
    ("rpc deleted", _both(_proto(PROBE_RPC, ""), _grpc_only("ProbeCall", False)), {"RPC_NO_DELETE"}, set()),
    ("rpc request type", _proto("rpc ProbeCall(BreakProbe)", "rpc ProbeCall(BreakProbe.Inner)"),
     {"RPC_SAME_REQUEST_TYPE"}, {"RPC_SAME_REQUEST_TYPE"}),
    ("rpc response type", _proto("returns (BreakProbe) {}", "returns (ServerLiveResponse) {}"),
     {"RPC_SAME_RESPONSE_TYPE"}, {"RPC_SAME_RESPONSE_TYPE"}),
    ("client streaming", _proto("rpc ProbeCall(BreakProbe)", "rpc ProbeCall(stream BreakProbe)"),
     {"RPC_SAME_CLIENT_STREAMING"}, {"RPC_SAME_CLIENT_STREAMING"}),
    ("server streaming", _proto("returns (BreakProbe) {}", "returns (stream BreakProbe) {}"),
     {"RPC_SAME_SERVER_STREAMING"}, {"RPC_SAME_SERVER_STREAMING"}),
    ("field out of its oneof", _both(_proto("    bool flag = 5;\n", ""), _proto("int32 spare = 9;",
                                                                                 "int32 spare = 9;\n  bool flag = 5;")),
     {"FIELD_SAME_ONEOF"}, {"FIELD_SAME_ONEOF"}),
    ("oneof renamed", _proto("oneof choice {", "oneof pick {"), {"FIELD_SAME_ONEOF"}, {"FIELD_SAME_ONEOF"}),
    ("enum value deleted", _proto("    BLUE = 2;\n", ""), {"ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED"}, set()),
    ("enum value renumbered", _proto("BLUE = 2;", "BLUE = 3;"),
     {"ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED"}, {"ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED"}),
    ("enum value renamed", _proto("BLUE = 2;", "AZURE = 2;"), {"ENUM_VALUE_SAME_NAME"}, {"ENUM_VALUE_SAME_NAME"}),
    ("enum type of a field, values added", _proto("    BLUE = 2;\n", "    BLUE = 2;\n    CYAN = 3;\n"),
     set(), {"ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED"}),
    ("reserved range deleted", _proto("  reserved 20, 21;\n", "  reserved 20;\n"),
     {"RESERVED_MESSAGE_NO_DELETE"}, set()),
    ("reserved name deleted", _proto('  reserved "gone";\n', ""), {"RESERVED_MESSAGE_NO_DELETE"}, set()),
    ("additive: a field with a new number, a message, an RPC",
     _both(_proto("int32 spare = 9;", "int32 spare = 9;\n  string added = 30;\n  message Extra {}"),
           _proto(PROBE_RPC, PROBE_RPC + "  rpc ProbeTwo(BreakProbe) returns (BreakProbe) {}\n"),
           _grpc_only("ProbeTwo", True)),
     set(), {"RPC_NO_DELETE", "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED", "MESSAGE_NO_DELETE"}),
]


@pytest.mark.parametrize(("name", "edit", "forward", "backward"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_rule(tmp_path: Path, probe_api: Api, name: str, edit: Edit, forward: set[str],
                   backward: set[str]) -> None:
    changed = load_spec(_spec(tmp_path, "spec", with_probe, edit))
    assert _rules(probe_api, changed) == forward
    assert _rules(changed, probe_api) == backward


def _op(doc: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    op: dict[str, Any] = doc["paths"][path][method]
    return op


def _schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"][name]
    return schema


def _delete_path(doc: dict[str, Any]) -> None:
    del doc["paths"]["/v2/models/{model_name}/versions/{model_version}/stats"]


def _move_method(doc: dict[str, Any]) -> None:
    item = doc["paths"]["/v2/models/{model_name}/config"]
    item["post"] = item.pop("get")


def _rename_path_param(doc: dict[str, Any]) -> None:
    item = doc["paths"].pop("/v2/models/{model_name}/ready")
    for p in item["get"].get("parameters", []) + item.get("parameters", []):
        if p.get("name") == "model_name":
            p["name"] = "name"
    doc["paths"]["/v2/models/{name}/ready"] = item


def _require_id(doc: dict[str, Any]) -> None:
    _schema(doc, "InferenceRequest")["required"].append("id")


def _add_required(doc: dict[str, Any]) -> None:
    s = _schema(doc, "RequestOutput")
    s["properties"]["priority"] = {"type": "integer", "x-oip-rest-only": True}
    s["required"].append("priority")


def _widen_id(doc: dict[str, Any]) -> None:
    _schema(doc, "InferenceRequest")["properties"]["id"]["type"] = ["string", "integer"]


def _enum_value(doc: dict[str, Any]) -> None:
    props = _schema(doc, "RequestOutput")["properties"]
    props["mode"] = {"type": "string", "enum": ["fast", "exact"], "x-oip-rest-only": True}


def _enum_value_dropped(doc: dict[str, Any]) -> None:
    _enum_value(doc)
    _schema(doc, "RequestOutput")["properties"]["mode"]["enum"] = ["fast"]


def _drop_response_property(doc: dict[str, Any]) -> None:
    s = _schema(doc, "InferenceResponse")
    del s["properties"]["id"]
    s["x-oip-grpc-only"].append("id")


def _response_type(doc: dict[str, Any]) -> None:
    _schema(doc, "InferenceResponse")["properties"]["model_version"]["type"] = ["string", "null"]


def _drop_status(doc: dict[str, Any]) -> None:
    del _op(doc, "/v2/models/{model_name}/infer")["responses"]["501"]


def _require_body(doc: dict[str, Any]) -> None:
    _op(doc, "/v2/repository/index")["requestBody"]["required"] = True


def _new_path(doc: dict[str, Any]) -> None:
    op = dict(_op(doc, "/v2/models/{model_name}/infer"), operationId="model_infer_alias")
    doc["paths"]["/v2/models/{model_name}/predict"] = {"post": op}


# (name, edit of the real spec's OpenAPI document, rules forward, rules backward)
REST_CASES: list[tuple[str, Callable[[dict[str, Any]], None], set[str], set[str]]] = [
    ("path deleted", _delete_path, {"REST_PATH_NO_DELETE"}, set()),
    ("method changed", _move_method, {"REST_METHOD_NO_DELETE"}, {"REST_METHOD_NO_DELETE"}),
    ("path parameter renamed", _rename_path_param, {"REST_PATH_PARAMETER_SAME_NAME"},
     {"REST_PATH_PARAMETER_SAME_NAME"}),
    ("request property made required", _require_id, {"REST_REQUEST_PROPERTY_REQUIRED"}, set()),
    ("request property added as required", _add_required, {"REST_REQUEST_PROPERTY_REQUIRED"}, set()),
    ("request property type widened", _widen_id, set(), {"REST_REQUEST_TYPE_NARROWED"}),
    ("optional request property added", _enum_value, set(), set()),
    ("response property deleted", _drop_response_property, {"REST_RESPONSE_PROPERTY_NO_DELETE"}, set()),
    ("response property type changed", _response_type, {"REST_RESPONSE_TYPE_CHANGED"},
     {"REST_RESPONSE_TYPE_CHANGED"}),
    ("documented status deleted", _drop_status, {"REST_RESPONSE_STATUS_NO_DELETE"}, set()),
    ("request body made required", _require_body, {"REST_REQUEST_BODY_REQUIRED"}, set()),
    ("additive: a new path", _new_path, set(), {"REST_PATH_NO_DELETE"}),
]


@pytest.fixture(scope="module")
def real_api() -> Api:
    return load_spec(SPEC)


@pytest.mark.parametrize(("name", "change", "forward", "backward"), REST_CASES, ids=[c[0] for c in REST_CASES])
def test_rest_rule(tmp_path: Path, real_api: Api, name: str, change: Callable[[dict[str, Any]], None],
                   forward: set[str], backward: set[str]) -> None:
    changed = load_spec(_spec(tmp_path, "spec", _openapi(change)))
    assert _rules(real_api, changed) == forward
    assert _rules(changed, real_api) == backward


def test_rest_enum_value_deleted(tmp_path: Path) -> None:
    with_enum = load_spec(_spec(tmp_path, "old", _openapi(_enum_value)))
    without = load_spec(_spec(tmp_path, "new", _openapi(_enum_value_dropped)))
    breaks = compare(with_enum, without)
    assert [(b.rule, b.where) for b in breaks] == [
        ("REST_REQUEST_ENUM_VALUE_NO_DELETE", f"REST POST {path} request body outputs[].mode")
        for path in ("/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{model_version}/infer")]
    assert "'exact'" in breaks[0].why
    assert compare(without, with_enum) == []


def test_unchanged_spec_has_no_break(real_api: Api) -> None:
    assert compare(real_api, real_api) == []


def test_a_break_says_what_where_and_why(tmp_path: Path, probe_api: Api) -> None:
    changed = load_spec(_spec(tmp_path, "spec", with_probe, _proto("string label = 2;", "bytes label = 2;")))
    (only,) = compare(probe_api, changed)
    assert str(only) == ("gRPC message inference.BreakProbe field 2 'label': FIELD_WIRE_JSON_COMPATIBLE_TYPE: type "
                         "changed from string to bytes: old and new peers cannot read each other's value")


# -- the command ---------------------------------------------------------------------------------------------------
def test_command_exit_codes(tmp_path: Path) -> None:
    changed = _spec(tmp_path, "new", _openapi(_delete_path))
    same = oipgen("breaking", "--against", str(SPEC), "--spec", str(SPEC))
    assert same.returncode == 0 and same.stdout == ""
    broken = oipgen("breaking", "--against", str(SPEC), "--spec", str(changed))
    assert broken.returncode == 1
    assert broken.stdout.splitlines() == [
        "REST /v2/models/{model_name}/versions/{model_version}/stats: REST_PATH_NO_DELETE: path deleted: every call "
        "to it now answers 404"]
    assert "1 breaking change(s)" in broken.stderr
    assert oipgen("breaking", "--against", str(changed), "--spec", str(SPEC)).returncode == 0

    bad = _spec(tmp_path, "bad", _proto("message ServerLiveRequest", "mesage ServerLiveRequest"))
    for old, new in ((bad, SPEC), (SPEC, bad)):
        result = oipgen("breaking", "--against", str(old), "--spec", str(new))
        assert result.returncode == 2
        assert "grpc_service.proto" in result.stderr and "problem(s)" in result.stderr
        assert "Traceback" not in result.stderr


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=oipgen", "-c", "user.email=oipgen@localhost", *args], cwd=repo,
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout


def test_against_a_git_revision(tmp_path: Path) -> None:
    """`--against REV` compares with the revision's copy of the spec folder; the pre-commit hook runs the same."""
    project = tmp_path / "acme"
    _spec(project, "protocol")
    (project / "pyproject.toml").write_text('[tool.oipgen]\nspec = "protocol"\n')
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "the protocol")
    _openapi(_delete_path)(project / "protocol")
    _git(project, "commit", "-q", "-am", "drop a path")

    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    hook = hooks["oipgen-breaking"]
    assert hook["entry"] == "oipgen breaking" and hook["pass_filenames"] is False
    assert hook["args"] == ["--against", "origin/main"]

    assert oipgen("breaking", "--against", "HEAD", cwd=project).returncode == 0
    result = oipgen("breaking", "--against", "HEAD~1", cwd=project)
    assert result.returncode == 1 and "REST_PATH_NO_DELETE" in result.stdout
    assert oipgen("breaking", "--against", "HEAD", "--spec", "protocol", cwd=project).returncode == 0
    _git(project, "branch", "-q", "old", "HEAD~1")
    assert oipgen("breaking", "--against", "old", cwd=project).returncode == 1
    # origin/main, as in the hook and the CI recipe
    _git(project, "update-ref", "refs/remotes/origin/main", "HEAD~1")
    assert oipgen("breaking", *hook["args"], cwd=project).returncode == 1

    missing = oipgen("breaking", "--against", "no-such-revision", cwd=project)
    assert missing.returncode == 2 and "neither a spec folder nor a git revision" in missing.stderr
    (project / "other").mkdir()
    absent = oipgen("breaking", "--against", "HEAD", "--spec", "other", cwd=project)
    assert absent.returncode == 2 and "has no other/ folder" in absent.stderr


def test_the_docs_document_the_command() -> None:
    """The CI and pre-commit recipes (docs/install.md; tests/project/test_recipes.py runs them) and the command line
    page."""
    install = (ROOT / "docs" / "install.md").read_text()
    assert "oipgen breaking --against origin/main" in install
    assert "id: oipgen-breaking" in install
    assert "`oipgen breaking` compares the spec" in (ROOT / "docs" / "cli.md").read_text()


# -- the build warns of wire breaks against its previous output -----------------------------------------------------
def _build(project: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return oipgen("build", "--spec", "spec", "--out", "out", *flags, cwd=project)


@pytest.fixture
def probe_project(tmp_path: Path) -> Path:
    """A project whose spec has the probe message and RPC, built once: its manifest records the descriptors."""
    project = tmp_path / "acme"
    _spec(project, "spec", with_probe)
    first = _build(project)
    assert first.returncode == 0 and "wire break" not in first.stderr, first.stderr
    return project


def test_the_build_warns_of_each_wire_break_against_its_previous_output(probe_project: Path) -> None:
    """Each step changes the spec built by the step before; the build warns of exactly the break it makes."""
    steps: list[tuple[str, Edit, str | None]] = [
        ("additive: a field with a new number", _proto("int32 spare = 9;", "int32 spare = 9;\n  string added = 30;"),
         None),
        ("field renumbered", _proto("int32 count = 1;", "int32 count = 10;"), "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"),
        ("field retyped", _proto("string label = 2;", "bytes label = 2;"), "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
        ("field removed", _proto("  int32 spare = 9;\n", ""), "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"),
        ("rpc retyped", _proto("rpc ProbeCall(BreakProbe)", "rpc ProbeCall(BreakProbe.Inner)"),
         "RPC_SAME_REQUEST_TYPE"),
        ("rpc removed", _both(_proto(PROBE_RPC.replace("(BreakProbe)", "(BreakProbe.Inner)", 1), ""),
                              _grpc_only("ProbeCall", False)), "RPC_NO_DELETE"),
    ]
    for name, edit, rule in steps:
        edit(probe_project / "spec")
        result = _build(probe_project)
        assert result.returncode == 0, (name, result.stderr)
        warnings = [line for line in result.stderr.splitlines() if "wire break: " in line]
        if rule is None:
            assert "wire break" not in result.stderr, (name, result.stderr)
            continue
        assert len(warnings) == 1 and f": {rule}: " in warnings[0], (name, result.stderr)
        assert "`oipgen breaking --against REV`" in result.stderr and "--strict" in result.stderr
        assert "updated  out/oip/_oipgen_manifest.json" in result.stdout  # a warning: the build went on
    again = _build(probe_project)  # the manifest records the last descriptors: nothing to warn of
    assert again.returncode == 0 and "wire break" not in again.stderr


def test_the_build_and_oipgen_breaking_decide_wire_breaks_in_one_place(probe_project: Path) -> None:
    shutil.copytree(probe_project / "spec", probe_project / "old")
    for edit in (_proto("int32 count = 1;", "int32 count = 10;"), _proto("string label = 2;", "bytes label = 2;"),
                 _both(_proto(PROBE_RPC, ""), _grpc_only("ProbeCall", False))):
        edit(probe_project / "spec")
    built = _build(probe_project)
    breaking = oipgen("breaking", "--against", "old", "--spec", "spec", cwd=probe_project)
    assert breaking.returncode == 1
    warned = [line.removeprefix("oipgen: warning: wire break: ") for line in built.stderr.splitlines()
              if line.startswith("oipgen: warning: wire break: ")]
    assert len(warned) == 3 and warned == [line for line in breaking.stdout.splitlines() if line.startswith("gRPC")]


def test_strict_makes_a_wire_break_an_error_and_writes_nothing(probe_project: Path) -> None:
    package = probe_project / "out" / "oip"
    before = {p: p.read_bytes() for p in (package / MANIFEST, package / "grpc" / "grpc_service_pb2.py")}
    _proto("int32 count = 1;", "int32 count = 10;")(probe_project / "spec")
    strict = _build(probe_project, "--strict")
    assert strict.returncode == 1
    assert "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED" in strict.stderr and "nothing was written" in strict.stderr
    assert {p: p.read_bytes() for p in before} == before
    assert _build(probe_project).returncode == 0
    assert _build(probe_project, "--strict").returncode == 0  # against the new output, nothing breaks


def _inconsistent_record() -> str:
    """A descriptor set that parses but whose BreakProbe.count refers to a oneof it does not declare."""
    file = descriptor_pb2.FileDescriptorProto(name="x.proto", package="inference", syntax="proto3")
    probe = file.message_type.add(name="BreakProbe")
    probe.field.add(name="count", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, oneof_index=3)
    return base64.b64encode(descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString()).decode()


@pytest.mark.parametrize("record", ["not a descriptor set", "INCONSISTENT", 7])
def test_unreadable_recorded_descriptors_are_said_and_strict_refuses(probe_project: Path, record: object) -> None:
    record = _inconsistent_record() if record == "INCONSISTENT" else record
    manifest = probe_project / "out" / "oip" / MANIFEST
    doc = json.loads(manifest.read_text())
    doc["descriptors"] = record
    manifest.write_text(json.dumps(doc))
    strict = _build(probe_project, "--strict")
    assert strict.returncode == 1 and "are unreadable" in strict.stderr and "nothing was written" in strict.stderr
    assert "Traceback" not in strict.stderr
    assert json.loads(manifest.read_text())["descriptors"] == record
    plain = _build(probe_project)
    assert plain.returncode == 0 and "wire breaks against the previous build were not checked" in plain.stderr


def test_the_manifest_records_the_descriptors_deterministically_without_source_info(tmp_path: Path) -> None:
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "out" / "oip" / MANIFEST).read_text())["descriptors"]
    assert record == json.loads((ROOT / "generated" / "oip" / MANIFEST).read_text())["descriptors"]
    fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(record))
    assert [f.name for f in fds.file] == ["model_config.proto", "grpc_service.proto"]
    assert not any(f.HasField("source_code_info") for f in fds.file)
