"""The spec loads into one API model whose two halves agree; a broken spec gets a clear report naming the file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import SPEC, oipgen

from oipgen.api import Api
from oipgen.load import load_spec
from oipgen.problems import SpecError


def test_the_spec_loads_and_cross_checks(api: Api) -> None:
    assert api.proto_package == "inference" and api.service == "GRPCInferenceService"
    rpcs = {r.name for r in api.rpcs}
    assert {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
            "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
            "RepositoryModelUnload", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister"} <= rpcs
    for op in api.operations:
        assert op.rest or op.grpc_only, op.name
    assert [d.name for d in api.datatypes] == ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                               "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]
    assert api.operation("ModelStreamInfer").grpc_only
    infer = api.operation("ModelInfer")
    assert {ep.path for ep in infer.rest} == {"/v2/models/{model_name}/infer",
                                             "/v2/models/{model_name}/versions/{model_version}/infer"}
    assert len(api.examples) >= 50


def test_infer_parameter_has_all_five_cases(api: Api) -> None:
    fields = {f.name: (f.number, f.kind) for f in api.message("inference.InferParameter").fields}
    assert fields == {"bool_param": (1, "bool"), "int64_param": (2, "int64"), "string_param": (3, "string"),
                      "double_param": (4, "double"), "uint64_param": (5, "uint64")}


def test_proto_is_wire_compatible_with_tritons(api: Api) -> None:
    """Every field we declare exists in tritonclient's copy of Triton's proto with the same number and type."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    pools = [service_pb2.DESCRIPTOR.pool, model_config_pb2.DESCRIPTOR.pool]
    checked = 0
    for m in api.messages:
        if m.full_name == "inference.ModelMetadataResponse":
            continue  # field 6 (properties) is OIP's, which Triton lacks; see spec/README.md
        theirs = None
        for pool in pools:
            try:
                theirs = pool.FindMessageTypeByName(m.full_name)
                break
            except KeyError:
                continue
        assert theirs is not None, f"{m.full_name} is not in Triton's proto"
        for f in m.fields:
            t = theirs.fields_by_name.get(f.name)
            assert t is not None and t.number == f.number, f"{m.full_name}.{f.name}"
            checked += 1
    for rpc in api.rpcs:
        method = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[rpc.name]
        assert method.input_type.full_name == rpc.request and method.output_type.full_name == rpc.response
    assert checked > 200


# -- broken specs ----------------------------------------------------------------------------------------------
def _broken(tmp_path: Path, change: Callable[[Path], None]) -> Path:
    spec = tmp_path / "spec"
    shutil.copytree(SPEC, spec)
    change(spec)
    return spec


def _edit_openapi(spec: Path, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    doc = yaml.safe_load((spec / "openapi.yaml").read_text())
    edit(doc)
    (spec / "openapi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def _proto_syntax_error(spec: Path) -> None:
    path = spec / "grpc_service.proto"
    path.write_text(path.read_text().replace("message ServerLiveRequest", "mesage ServerLiveRequest", 1))


def _comment_breaking_a_docstring(spec: Path) -> None:
    """grpcio-tools prints an RPC's comment as the docstring of its stub: this one would end it and run code."""
    path = spec / "grpc_service.proto"
    path.write_text(path.read_text().replace(
        "  // Liveness: whether", '  // Liveness """; import os; os.system("touch pwned"); """ whether', 1))


def _comment_with_a_backslash(spec: Path) -> None:
    path = spec / "grpc_service.proto"
    path.write_text(path.read_text().replace("  // Liveness: whether", "  // Liveness \\N whether", 1))


def _dangling_ref(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        doc["components"]["schemas"]["RequestInput"]["properties"]["data"] = {
            "$ref": "#/components/schemas/NoSuchSchema"}
    _edit_openapi(spec, edit)


def _rpc_without_rest(spec: Path) -> None:
    path = spec / "grpc_service.proto"
    text = path.read_text()
    ping = "  rpc ServerPing(ServerLiveRequest) returns (ServerLiveResponse) {}"
    text = text.replace("service GRPCInferenceService {", "service GRPCInferenceService {\n" + ping, 1)
    path.write_text(text)


def _unsafe_identifier(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        doc["paths"]["/v2/health/live"]["get"]["operationId"] = "class"
    _edit_openapi(spec, edit)


def _field_mismatch(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        doc["components"]["schemas"]["RequestInput"]["properties"]["shapes"] = {"type": "array"}
    _edit_openapi(spec, edit)


def _datatype_mismatch(spec: Path) -> None:
    path = spec / "datatypes.yaml"
    path.write_text(path.read_text().replace("name: BF16", "name: BF17"))


def _rpc_and_operation(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        doc["paths"]["/v2/models/{model_name}/generate"]["post"]["x-oip-rpc"] = "ModelInfer"
    _edit_openapi(spec, edit)


def _unlisted_operation(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        del doc["x-oip-rest-only"]["GenerateStream"]
    _edit_openapi(spec, edit)


def _rest_only_case_with_grpc(spec: Path) -> None:
    path = spec / "examples" / "generate_text_echo.yaml"
    path.write_text(path.read_text() + "grpc:\n  request: {}\n  code: OK\n")


def _data_type_mismatch(spec: Path) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        rules = doc["components"]["schemas"]["RequestInput"]["allOf"]
        rules[1]["if"]["properties"]["datatype"]["enum"].remove("INT64")  # INT64 data no longer typed
        rules[2]["if"]["properties"]["datatype"]["enum"].append("FP16")  # FP16 both numbers and no JSON
    _edit_openapi(spec, edit)


def _grpc_health_on(path: str, method: str = "get", value: object = True) -> Callable[[Path], None]:
    """x-oip-grpc-health set to `value` on the operation `method` `path`."""
    def change(spec: Path) -> None:
        def edit(doc: dict) -> None:  # type: ignore[type-arg]
            doc["paths"][path][method]["x-oip-grpc-health"] = value
        _edit_openapi(spec, edit)
    return change


BROKEN = {
    "rpc-and-operation": (_rpc_and_operation, "openapi.yaml", "not both"),
    "unlisted-rest-only-operation": (_unlisted_operation, "openapi.yaml",
                                     "x-oip-operation names 'GenerateStream', which x-oip-rest-only does not list"),
    "rest-only-case-with-grpc": (_rest_only_case_with_grpc, "generate_text_echo.yaml",
                                 "Generate is REST-only; the case cannot have a grpc part"),
    "proto-syntax": (_proto_syntax_error, "grpc_service.proto", "line "),
    "comment-breaking-a-docstring": (_comment_breaking_a_docstring, "grpc_service.proto",
                                     "a comment of a service or RPC holds '\"\"\"'"),
    "comment-with-a-backslash": (_comment_with_a_backslash, "grpc_service.proto",
                                 "a comment of a service or RPC holds '\\\\'"),
    "dangling-ref": (_dangling_ref, "openapi.yaml", "dangling reference '#/components/schemas/NoSuchSchema'"),
    "rpc-without-rest": (_rpc_without_rest, "openapi.yaml", "RPC ServerPing has no REST operation"),
    "unsafe-identifier": (_unsafe_identifier, "openapi.yaml", "operationId 'class' is not a safe Python identifier"),
    "field-mismatch": (_field_mismatch, "openapi.yaml",
                       "no field 'shapes' in inference.ModelInferRequest.InferInputTensor"),
    "datatype-mismatch": (_datatype_mismatch, "openapi.yaml", "differs from datatypes.yaml"),
    "data-type-mismatch": (_data_type_mismatch, "openapi.yaml",
                           "data element types differ from datatypes.yaml for INT64 (schema None, table integer)"),
    # The standard gRPC health service answers from one argument-less unary operation with a health boolean.
    "grpc-health-twice": (_grpc_health_on("/v2/health/live"), "openapi.yaml",
                          "x-oip-grpc-health marks 2 operations (ServerLive, ServerReady)"),
    "grpc-health-with-arguments": (_grpc_health_on("/v2/models/{model_name}/ready"), "openapi.yaml",
                                   "x-oip-grpc-health marks the server's own health"),
    "grpc-health-without-health": (_grpc_health_on("/v2"), "openapi.yaml",
                                   "x-oip-grpc-health marks the server's own health"),
    "grpc-health-rest-only": (_grpc_health_on("/v2/models/{model_name}/generate", "post"), "openapi.yaml",
                              "x-oip-grpc-health marks an operation that has no gRPC form"),
    "grpc-health-not-a-bool": (_grpc_health_on("/v2/health/ready", value="yes"), "openapi.yaml",
                               "x-oip-grpc-health must be true or false"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_spec_is_reported_with_its_file(tmp_path: Path, case: str) -> None:
    change, file, text = BROKEN[case]
    spec = _broken(tmp_path, change)
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert any(file in p.file and text in str(p) for p in info.value.problems), info.value.problems
    result = oipgen("build", "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert file in result.stderr and text in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    def both(spec: Path) -> None:
        _dangling_ref(spec)
        _datatype_mismatch(spec)
    with pytest.raises(SpecError) as info:
        load_spec(_broken(tmp_path, both))
    files = {Path(p.file).name for p in info.value.problems}
    assert {"openapi.yaml"} <= files and len(info.value.problems) >= 2


def test_unsafe_package_name_is_refused(tmp_path: Path) -> None:
    result = oipgen("build", "--package", "my-pkg", "--out", str(tmp_path))
    assert result.returncode == 2 and "not a safe Python package name" in result.stderr


@pytest.mark.parametrize("given", ["myspec", "./myspec/", "ABSOLUTE"])
def test_a_proto_error_names_the_file_under_a_relative_spec_path_once(tmp_path: Path, given: str) -> None:
    _broken(tmp_path, _proto_syntax_error).rename(tmp_path / "myspec")
    spec = str(tmp_path / "myspec") if given == "ABSOLUTE" else given
    result = oipgen("build", "--spec", spec, "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    where = (Path(spec) / "grpc_service.proto").as_posix()
    assert f"  {where}: line " in result.stderr, result.stderr
    assert "myspec/myspec" not in result.stderr


def test_spec_text_in_a_docstring_stays_text(tmp_path: Path) -> None:
    """An operation's summary (OpenAPI) is printed into the generated clients' docstrings: quotes, backslashes and
    control characters there stay the summary's text, and the modules compile."""
    summary = 'Live """; import os; os.system("touch pwned"); """ \\N{x} \x85 end"'

    def edit(spec: Path) -> None:
        path = spec / "openapi.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["paths"]["/v2/health/live"]["get"]["summary"] = summary
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        proto = spec / "grpc_service.proto"  # the client's docstring takes the RPC's comment first
        comment = "  // Liveness: whether the server process can take requests at all.\n"
        proto.write_text(proto.read_text().replace(comment, "", 1))
    spec = _broken(tmp_path, edit)
    result = oipgen("build", "--spec", str(spec), "--out", str(tmp_path / "out"), "--target", "client", "-q")
    assert result.returncode == 0, result.stderr
    client = tmp_path / "out" / "oip" / "client" / "rest.py"
    import ast
    tree = ast.parse(client.read_bytes())
    docs = [ast.get_docstring(f, clean=False) for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name == "server_live"]
    assert docs and all(d is not None and " ".join(summary.split()) in " ".join(d.split()) for d in docs), docs
    assert not (tmp_path / "pwned").exists()
