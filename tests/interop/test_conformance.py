"""The generated conformance module (`oip.conformance`): both layers against the generated server, against broken
copies of it, and against stub servers.

- The generated server (`python -m oip serve`, one subprocess for the module) serves examples/models, the
  repository `make serve` serves: every model of spec/examples/models.yaml. Both layers report 0 failed, through
  the command line (text, --format json, --junit) and case by case through the library.
- A server that serves only some example models: the golden cases that need the others are NOT APPLICABLE, and
  the summary names the models.
- Broken servers: a copy of the generated package with one rule removed fails the cases that name the rule, and
  only those: the golden layer and the protocol layer each fail on their own.
- Stub servers that know the cases show that the runner judges by the rules of models.yaml: answers that differ
  only in harmless ways (2.0 for 2, other key order) pass; wrong answers fail, with the difference, and exit 1.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from xml.etree import ElementTree

import grpc
import pytest
from conftest import GENERATED, ROOT
from google.protobuf import json_format
from oip import conformance
from serving import Server, running, server_env

PYTHON = sys.executable
EXAMPLES = ROOT / "examples" / "models"


def _repository(root: Path, only: tuple[str, ...] | None = None) -> Path:
    """A copy of examples/models (or of the models named), so that importing them writes nothing into the tree."""
    for folder in sorted(EXAMPLES.iterdir()):
        if folder.is_dir() and (only is None or folder.name in only):
            shutil.copytree(folder, root / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("conformance")
    with running(_repository(work / "models"), work, ready=[m["name"] for m in conformance.MODELS]) as server:
        yield server


def _forms() -> int:
    return sum(len(case.transports()) for case in conformance.CASES)


def _cli(url: str, grpc_target: str, *args: str, package_dir: Path = GENERATED) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "oip.conformance", "--url", url, "--grpc", grpc_target, "--timeout", "10", *args],
        env=server_env(package_dir), capture_output=True, text=True, timeout=300,
    )


# ---------------------------------------------------------------------------------------------------------------
# The generated server, serving examples/models, passes both layers


def test_examples_serve_every_example_model() -> None:
    """examples/models (what `make serve` serves) holds every model the golden cases need."""
    assert sorted(p.name for p in EXAMPLES.iterdir() if (p / "model.toml").is_file()) == sorted(
        m["name"] for m in conformance.MODELS)


def test_both_layers_pass_from_the_command_line(server: Server, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = _cli(server.url, server.target, "--junit", str(junit))
    lines = result.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert result.returncode == 0, "\n".join(failures) + result.stderr + "\n" + server.log_tail()
    assert not failures
    assert lines[-1].startswith(f"{_forms() + _protocol_count(lines)} passed, 0 failed"), lines[-1]
    assert f"golden: {_forms()} passed, 0 failed; protocol: " in result.stdout
    assert "cases need models" not in result.stdout
    # every section named, with its counts
    assert "OIP: Request Input" in result.stdout and "extension: statistics" in result.stdout
    suites = ElementTree.parse(junit).getroot()
    golden, protocol = suites.findall("testsuite")
    assert (golden.get("name"), golden.get("tests"), golden.get("failures")) == (
        "oip.conformance.golden", str(_forms()), "0")
    assert protocol.get("failures") == "0" and int(protocol.get("tests", "0")) > 500
    skipped = [c for c in protocol.iter("testcase") if c.find("skipped") is not None]
    assert len(skipped) == int(protocol.get("skipped", "-1"))
    assert any("decoupled" in str(c.find("skipped").get("message")) for c in skipped)  # type: ignore[union-attr]


def _protocol_count(lines: list[str]) -> int:
    """The protocol layer's passed count from the per-layer line."""
    layer = next(line for line in lines if line.startswith("golden: "))
    return int(layer.split("protocol: ")[1].split(" passed")[0])


def test_protocol_layer_as_json(server: Server) -> None:
    result = _cli(server.url, server.target, "--layer", "protocol", "--model", "simple", "identity_fp16",
                  "--format", "json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    document = json.loads(result.stdout)
    results = document["results"]
    assert document["summary"]["failed"] == 0 and document["layers"]["protocol"]["pass"] == len(
        [r for r in results if r["outcome"] == "pass"])
    assert {r["model"] for r in results} == {"", "simple", "identity_fp16"}
    assert all(r["layer"] == "protocol" and r["section"] for r in results)
    by_case = {(r["case"], r["model"], r["transport"]): r for r in results}
    # what the server reports decides what applies: it lists no cuda_shared_memory, and FP16 has no JSON form
    assert by_case[("extension.cuda_shared_memory", "", "rest")]["outcome"] == "n/a"
    assert "does not list the cuda_shared_memory" in by_case[("extension.cuda_shared_memory", "", "rest")]["detail"]
    assert by_case[("infer.valid", "identity_fp16", "rest")]["outcome"] == "pass"  # via binary tensor data
    assert by_case[("infer.wrong_datatype", "simple", "grpc")]["choice"] == 14
    assert by_case[("infer.transports_agree", "simple", "all")]["outcome"] == "pass"
    assert "REST JSON, REST binary, gRPC" in by_case[("infer.transports_agree", "simple", "all")]["expected"]


def test_protocol_layer_over_grpc_alone(server: Server) -> None:
    """Without a REST address, the models' metadata comes over gRPC (where int64 shapes print as strings)."""
    results = conformance.run(grpc=server.target, layers=("protocol",), models=["mymodel", "identity_fp16"])
    assert results and {r.transport for r in results} <= {"grpc", "rest", "all"}
    assert not [r.line() for r in results if r.failed]
    assert {(r.case, r.model) for r in results if r.passed} >= {("infer.valid", "mymodel"),
                                                                 ("infer.wrong_shape", "identity_fp16")}
    assert all(r.not_applicable and "--url" in r.detail for r in results if r.transport == "rest")


@pytest.mark.parametrize("name", [case.name for case in conformance.CASES])
def test_case(server: Server, name: str) -> None:
    results = conformance.run(url=server.url, grpc=server.target, only=[name], layers=("golden",))
    assert results and all(r.passed for r in results), "\n".join(
        f"{r.line()}\n    answer: {r.response[:1000]}" for r in results if not r.passed
    )


def test_the_server_is_still_serving_after_every_case(server: Server) -> None:
    assert server.process.poll() is None, server.log_tail()
    assert all(r.passed for r in conformance.run(url=server.url, grpc=server.target, only=["server_live"]))


def test_cases_of_unserved_models_are_not_applicable_and_named(tmp_path: Path) -> None:
    repository = _repository(tmp_path / "models", only=("simple", "identity_fp32"))
    with running(repository, tmp_path, ready=("simple", "identity_fp32")) as server:
        result = _cli(server.url, server.target, "--layer", "golden", "--only", "infer_datatype_*", "infer_simple_flat")
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS rest infer_datatype_fp32" in lines and "PASS grpc infer_simple_flat" in lines
    assert "N/A  grpc infer_datatype_bf16_raw: needs model identity_bf16, which the server does not serve" in lines
    unserved = [f"identity_{t}" for t in ("bf16", "bool", "bytes", "fp16", "fp64", "int16", "int32", "int64", "int8",
                                          "uint16", "uint32", "uint64", "uint8")]
    assert f"13 cases need models the server does not serve: {', '.join(f'{m} (1)' for m in unserved)}" in lines
    assert lines[-1].startswith("4 passed, 0 failed, ")


# ---------------------------------------------------------------------------------------------------------------
# Broken servers: a copy of the generated package with one rule removed fails the cases that name it, and only those

# (the rule, the code that holds it, the same code without it, the failures expected: (case, model, transport))
BROKEN = {
    "datatype": (
        "if tensor.datatype != spec.datatype:", "if False:  # the datatype rule removed",
        {("infer_error_datatype_mismatch", "", transport) for transport in ("rest", "grpc")}
        | {("infer.wrong_datatype", model, transport) for model in ("simple", "identity_fp32")
           for transport in ("rest", "grpc")},
    ),
    "id": (  # over REST only: the gRPC answer is written elsewhere
        'body["id"] = request_id\n    if parameters:', "pass  # the request's id dropped\n    if parameters:",
        {("infer_simple_id", "", "rest")} | {("infer.id", model, "rest") for model in ("simple", "identity_fp32")},
    ),
    "statistics": (
        "succeeded.count += 1", "pass  # successes not counted",
        {("infer.statistics", model, transport) for model in ("simple", "identity_fp32")
         for transport in ("rest", "grpc")},
    ),
}


def _broken_package(root: Path, code: str, broken: str) -> Path:
    """A copy of the generated package with `code` (found once, in whichever file holds it) replaced by `broken`."""
    shutil.copytree(GENERATED / "oip", root / "oip", ignore=shutil.ignore_patterns("__pycache__"))
    holders = [p for p in (root / "oip").rglob("*.py") if code in p.read_text()]
    assert len(holders) == 1 and holders[0].read_text().count(code) == 1, f"{code!r} is in {holders}"
    holders[0].write_text(holders[0].read_text().replace(code, broken))
    return root


@pytest.mark.parametrize("rule", BROKEN)
def test_a_server_without_one_rule_fails_the_cases_that_name_it(rule: str, tmp_path: Path) -> None:
    code, broken, expected = BROKEN[rule]
    package = _broken_package(tmp_path / "package", code, broken)
    models = ("simple", "identity_fp32")
    repository = _repository(tmp_path / "models", only=models)
    with running(repository, tmp_path, package_dir=package, ready=models) as server:
        result = _cli(server.url, server.target, "--format", "json", "--model", *models, package_dir=package)
    document = json.loads(result.stdout)
    failed = {(r["case"], r["model"], r["transport"]) for r in document["results"] if r["outcome"] == "fail"}
    # what an unexpected failure said, whole (a result's detail is what the server answered or how the call ended)
    unexpected = [f'{r["case"]} {r["model"]} {r["transport"]}: {r["detail"]}' for r in document["results"]
                  if (r["case"], r["model"], r["transport"]) in failed - expected]
    assert result.returncode == 1 and failed == expected, ("\n".join(unexpected), expected - failed)
    # the golden layer ran in full beside it: the models it needs and the server does not serve are named
    assert document["layers"]["golden"]["pass"] > 40 and "identity_bf16" in document["unserved_models"]


# ---------------------------------------------------------------------------------------------------------------
# The comparison rules (models.yaml header)


def test_numbers_compare_by_value_but_booleans_are_not_numbers() -> None:
    assert conformance.compare_json({"a": [2, 0.5]}, {"a": [2.0, 0.5]}) == []
    assert conformance.compare_json(2, 3) == ["the body: expected 2, got 3"]
    assert conformance.compare_json(True, 1) == ["the body: expected boolean true, got number 1"]
    assert conformance.compare_json(0, False) == ["the body: expected number 0, got boolean false"]
    assert conformance.compare_json(18446744073709551615, 1.8446744073709552e19) != []  # not by float rounding


def test_key_order_does_not_matter_but_keys_do() -> None:
    assert conformance.compare_json({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}) == []
    assert conformance.compare_json({"a": {"b": 1}}, {"a": {}}) == ["a: missing key 'b' (expected 1)"]
    # An empty `reason` is omitted (models.yaml): sending "" is a difference, not the same thing.
    index = [{"name": "simple", "version": "1", "state": "READY"}]
    assert conformance.compare_json(index, [{**index[0], "reason": ""}]) == ["[0]: unexpected key 'reason' = \"\""]
    assert conformance.compare_json([1, 2], [1, 2, 3]) == ["the body: expected 2 items [1, 2], got 3 [1, 2, 3]"]
    assert conformance.compare_json("1", 1) == ['the body: expected string "1", got number 1']


def test_cases_and_models_are_the_spec_s() -> None:
    import yaml

    spec = GENERATED.parent / "spec" / "examples"
    files = sorted(p for p in spec.glob("*.yaml") if p.name != "models.yaml")
    assert [c.name for c in conformance.CASES] == [p.stem for p in files]
    for case, path in zip(conformance.CASES, files, strict=True):
        data = yaml.safe_load(path.read_text())
        assert (case.operation, case.compare, case.rest, case.grpc) == (
            data["operation"], data.get("compare"), data.get("rest"), data.get("grpc")
        ), case.name
    assert list(conformance.MODELS) == yaml.safe_load((spec / "models.yaml").read_text())["models"]


def test_only_selects_by_name_or_pattern_and_rejects_unknown_names() -> None:
    assert [c.name for c in conformance.select(["server_live"])] == ["server_live"]
    assert {c.name for c in conformance.select(["model_ready_*"])} == {
        "model_ready_simple", "model_ready_simple_versioned", "model_ready_unknown_model", "model_ready_unknown_version"
    }
    with pytest.raises(ValueError, match="no_such_case"):
        conformance.select(["no_such_case"])
    result = subprocess.run(
        [PYTHON, "-m", "oip.conformance", "--only", "no_such_case"], env=server_env(), capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "no_such_case" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Stub servers that answer from the cases themselves, exactly (modulo harmless changes) or wrongly


def _harmless(value: Any) -> Any:
    """The same JSON value written differently: integers as floats (where exact), keys in reverse order."""
    if isinstance(value, dict):
        return {k: _harmless(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_harmless(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value)
    return value


def _wrong(value: Any) -> Any:
    """A different JSON value: booleans become numbers, numbers change, objects gain an empty `reason`."""
    if isinstance(value, dict):
        return {**{k: _wrong(v) for k, v in value.items()}, "reason": ""}
    if isinstance(value, list):
        return [_wrong(v) for v in value]
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value + 1
    return value


def _rest_answer(spec: dict[str, Any], compare: str | None, wrong: bool) -> tuple[int, bytes, str]:
    status = int(spec["status"])
    if "events" in spec:  # server-sent events: one more (an error) when wrong
        events = [*spec["events"], {"error": "stub says no"}] if wrong else [_harmless(e) for e in spec["events"]]
        return status, b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events), _EVENTS
    if "response" not in spec:
        return status, b"{}" if wrong else b"", _JSON
    expected = spec["response"]
    if expected == {"error": True}:
        body: Any = {"detail": [{"msg": "FastAPI-style"}]} if wrong else {"error": "stub says no"}
    elif compare == "keys":
        body = {**expected, "extra": 1} if wrong else _harmless(expected)
    else:
        body = _wrong(expected) if wrong else _harmless(expected)
    return status, json.dumps(body).encode(), _JSON


_JSON = "application/json"
_EVENTS = "text/event-stream; charset=utf-8"


class _Rest(ThreadingHTTPServer):
    daemon_threads = True
    answers: dict[tuple[str, str, bytes], tuple[int, bytes, str]]


class _Handler(BaseHTTPRequestHandler):
    server: _Rest

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, payload, kind = self.server.answers.get(
            (self.command, self.path, body), (404, b'{"error": "no case"}', _JSON))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def _request_key(rpc: conformance.Rpc, data: bytes) -> bytes:
    return rpc.request.FromString(data).SerializeToString(deterministic=True)


class _GrpcStub(grpc.GenericRpcHandler):
    def __init__(self, wrong: bool) -> None:
        self.answers: dict[tuple[str, bytes], tuple[str, bytes]] = {}
        for case in conformance.CASES:
            if case.grpc is None:
                continue
            rpc = conformance.RPCS[case.operation]
            key = json_format.ParseDict(case.grpc["request"], rpc.request()).SerializeToString(deterministic=True)
            code = case.grpc["code"]
            response = rpc.response()
            if "response" in case.grpc:
                json_format.ParseDict(case.grpc["response"], response)
            if wrong:
                if code != "OK":
                    code = "OK"
                elif case.compare == "keys" or not case.grpc.get("response"):
                    code = "INTERNAL"
                else:
                    response = rpc.response()  # an empty answer: every expected field is missing
            self.answers[(rpc.name, key)] = (code, response.SerializeToString())

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        name = str(handler_call_details.method).rsplit("/", 1)[-1]
        rpc = conformance.RPCS.get(name)
        if rpc is None:
            return None

        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            code, response = self.answers.get((name, _request_key(rpc, request)), ("NOT_FOUND", b""))
            if code != "OK":
                context.abort(grpc.StatusCode[code], "stub")
            return response

        def same(b: bytes) -> bytes:
            return b

        return grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=same, response_serializer=same)


@contextlib.contextmanager
def stub_server(wrong: bool) -> Iterator[tuple[str, str]]:
    rest = _Rest(("127.0.0.1", 0), _Handler)
    rest.answers = {}
    for case in conformance.CASES:
        if case.rest is None:
            continue
        spec = case.rest
        body = json.dumps(spec["body"]).encode() if "body" in spec else str(spec.get("raw_body", "")).encode()
        rest.answers[(spec["method"], spec["path"], body)] = _rest_answer(spec, case.compare, wrong)
    for model in conformance.MODELS:  # every example model is served (the golden layer asks before it runs a case)
        rest.answers.setdefault(("GET", f"/v2/models/{model['name']}/ready", b""), (200, b"{}", _JSON))
    thread = threading.Thread(target=rest.serve_forever, daemon=True)
    thread.start()
    rpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[_GrpcStub(wrong)])
    port = rpc_server.add_insecure_port("127.0.0.1:0")
    rpc_server.start()
    try:
        yield f"http://127.0.0.1:{rest.server_address[1]}", f"127.0.0.1:{port}"
    finally:
        rpc_server.stop(grace=None)
        rest.shutdown()
        rest.server_close()
        thread.join(timeout=10)


def _results(stdout: str) -> list[str]:
    """The result lines of a text report (those before the summaries)."""
    return stdout.split("\n\n")[0].splitlines()


def test_equivalent_answers_pass() -> None:
    with stub_server(wrong=False) as (url, grpc_target):
        result = _cli(url, grpc_target, "--layer", "golden")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"{_forms()} passed, 0 failed"


def test_wrong_answers_fail_with_the_difference_and_exit_1() -> None:
    with stub_server(wrong=True) as (url, grpc_target):
        result = _cli(url, grpc_target, "--layer", "golden")
        verbose = _cli(url, grpc_target, "--only", "server_live", "--rest-only", "--verbose")
    lines = _results(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"0 passed, {_forms()} failed"
    assert len(lines) == _forms() and all(line.startswith("FAIL ") for line in lines)
    by_case = {tuple(line.split()[1:3]): line for line in lines}
    assert "live: expected boolean true, got number 1" in by_case[("rest", "server_live:")]
    assert "unexpected key 'reason'" in by_case[("rest", "server_live:")]
    assert 'expected an error body {"error": "<message>"}' in by_case[("rest", "infer_error_unknown_model:")]
    assert "expected an empty body" in by_case[("rest", "repository_load_simple:")]
    assert "unexpected key 'extra'" in by_case[("rest", "server_metadata:")]
    assert "code OK, expected NOT_FOUND" in by_case[("grpc", "infer_error_unknown_model:")]
    assert "code INTERNAL (stub), expected OK" in by_case[("grpc", "server_metadata:")]
    assert "missing key 'raw_output_contents'" in by_case[("grpc", "infer_simple_flat:")]
    assert verbose.returncode == 1
    assert _results(verbose.stdout) == [
        "FAIL rest server_live: live: expected boolean true, got number 1; the body: unexpected key 'reason' = \"\"",
        f"     OIP: Health (Server Live, Server Ready, Model Ready): {conformance.select(['server_live'])[0].summary}",
        '     answer: 200 {"live": 1, "reason": ""}',
    ]
    assert verbose.stdout.splitlines()[-1] == "0 passed, 1 failed"


def test_unreachable_transports_fail_and_absent_ones_are_not_applicable() -> None:
    results = conformance.run(url="http://127.0.0.1:9", grpc=None, only=["server_live"], timeout=2)
    assert [(r.transport, r.outcome) for r in results] == [("rest", "fail"), ("grpc", "n/a")]
    assert "failed" in results[0].detail and "--grpc" in results[1].detail
    assert conformance.summary(results) == "0 passed, 1 failed, 1 not applicable"
    only_grpc = conformance.run(url=None, grpc="127.0.0.1:9", only=["infer_simple_raw"], transports=("rest",))
    assert only_grpc == []


# ---------------------------------------------------------------------------------------------------------------
# The matrix harness (make conformance-matrix): its native repositories, its page, and a run against our server

BENCH = ROOT / "bench"


def _bench(name: str) -> Any:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return __import__(name)


def test_native_repositories_declare_what_models_yaml_declares(tmp_path: Path) -> None:
    from google.protobuf import text_format
    from oip import datatypes
    from oip.grpc import model_config_pb2

    native = _bench("conformance_native")
    types = {d.name: d.model_config for d in datatypes.DATATYPES}
    by_name = {m["name"]: m for m in conformance.MODELS}
    written = native.write("triton", conformance.MODELS, tmp_path / "triton", types)
    assert written == list(by_name)
    for name in written:  # every config parses as Triton's ModelConfig and says what models.yaml says
        config = text_format.Parse((tmp_path / "triton" / name / "config.pbtxt").read_text(),
                                   model_config_pb2.ModelConfig())
        entry = by_name[name]
        assert (config.name, config.backend, config.max_batch_size) == (name, "python", 0)
        for declared, tensors in ((entry["inputs"], config.input), (entry["outputs"], config.output)):
            assert [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in tensors] == [
                (t["name"], types[t["datatype"]], t["shape"]) for t in declared]
        assert config.parameters["behaviour"].string_value == entry["behaviour"]
        assert config.model_transaction_policy.decoupled == bool(entry.get("decoupled"))
        assert (tmp_path / "triton" / name / "1" / "model.py").is_file()
    mlserver = native.write("mlserver", conformance.MODELS, tmp_path / "mlserver", types)
    assert set(by_name) - set(mlserver) == {"identity_bf16"}
    settings = json.loads((tmp_path / "mlserver" / "simple" / "model-settings.json").read_text())
    assert (settings["inputs"], settings["parameters"]) == (
        by_name["simple"]["inputs"], {"version": "1", "extra": {"behaviour": "add_sub"}})
    kserve = native.write("kserve", conformance.MODELS, tmp_path / "kserve", types)
    assert set(by_name) - set(kserve) == {"identity_bf16", "text_stream"}
    assert [m["name"] for m in json.loads((tmp_path / "kserve" / "models.json").read_text())] == kserve
    assert set(native.CANNOT["mlserver"]) | set(native.CANNOT["kserve"]) == {"identity_bf16", "text_stream"}


def _document(failing: dict[str, Any]) -> dict[str, Any]:
    """A matrix document with our server passing and a peer failing as `failing` says."""
    matrix = _bench("conformance_matrix")
    catalogue = matrix.catalogue()
    ok = [{"case": "server_live", "transport": t, "outcome": "pass"} for t in ("rest", "grpc")]
    ok += [{"case": "infer.wrong_datatype", "transport": t, "outcome": "pass", "model": m}
           for t in ("rest", "grpc") for m in ("simple", "identity_fp32")]
    peer = [dict(r) for r in ok]
    peer[0] = {**peer[0], **failing}
    peer[2] = {**peer[2], "outcome": "fail", "detail": "status 200, expected 400", "expected": "400 with ...",
               "got": '200 {"outputs": []}'}
    record = {"cannot": {}, "error": "", "metadata": {"version": "1"}}
    return {"commit": "abc", "date": "2026-01-01", "catalogue": catalogue, "servers": {
        "oipgen": {**record, "label": "oipgen", "results": ok},
        "peer": {**record, "label": "Peer 1.0", "cannot": {"identity_bf16": "no BF16"}, "results": peer}}}


def test_the_matrix_page_cites_the_rule_and_the_answer_of_each_failure() -> None:
    table = _bench("conformance_table")
    document = table.annotate(_document({"outcome": "fail", "detail": "the body is not JSON", "expected": "200 {}",
                                         "got": "200 (empty body)"}))
    page = table.markdown(document)
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| `")}
    assert rows["| `server_live`"].endswith("| 4 | pass | **FAIL** (REST) |")  # choice 4; gRPC passed
    assert rows["| `infer.wrong_datatype`"].endswith("| 14 | pass | **FAIL** (REST, 1/2 models) |")
    evidence = page.split("## What Peer 1.0 answered where it failed")[1]
    rule = conformance.CASES[[c.name for c in conformance.CASES].index("server_live")].source
    assert "- **server_live** (REST) · choice 4" in evidence and rule in evidence
    assert "Peer 1.0 answered (REST): `200 (empty body)`" in evidence
    assert "- **infer.wrong_datatype** (REST; 1 models: simple) · choice 14" in evidence
    assert "spec/README.md, choice 14" in evidence and '`200 {"outputs": []}`' in evidence
    assert "`identity_bf16`: no BF16" in page
    assert "| Peer 1.0 | 1 | 1 passed, 1 failed, 0 n/a | 3 passed, 1 failed, 0 n/a |" in page
    assert page.split("## What oipgen answered where it failed")[1].split("##")[0].strip() == "No failure."


def test_the_matrix_harness_runs_against_our_server(tmp_path: Path) -> None:
    done = subprocess.run(
        [PYTHON, str(BENCH / "conformance_matrix.py"), "--servers", "oipgen", "--out", str(tmp_path / "out"),
         "--work", str(tmp_path / "work"), "--only", "server_*", "health.*", "infer.id", "--timeout", "10"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads((tmp_path / "out" / "conformance-matrix.json").read_text())
    ours = document["servers"]["oipgen"]
    assert ours["error"] == "" and len(ours["served"]) == len(conformance.MODELS)
    outcomes = {(r["case"], r.get("model", ""), r["transport"]): r["outcome"] for r in ours["results"]}
    assert outcomes[("server_live", "", "rest")] == "pass" and outcomes[("infer.id", "mymodel", "grpc")] == "pass"
    assert "fail" not in outcomes.values() and len(outcomes) > 60
    page = (tmp_path / "out" / "conformance-matrix.md").read_text()
    assert "| `server_metadata` | golden | OIP: Server Metadata | 6 | pass |" in page
    assert (tmp_path / "out" / "conformance-matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_name_every_protocol_case() -> None:
    from oip.conformance_protocol import CHECKS

    page = (ROOT / "docs" / "conformance.md").read_text()
    missing = [name for name in CHECKS if f"`{name}`" not in page]
    assert not missing, f"docs/conformance.md does not describe {missing}"


class _Odd(BaseHTTPRequestHandler):
    """A REST server whose answers have every shape but the protocol's."""

    answers: ClassVar[dict[str, Any]] = {
        "/v2": {"name": "odd", "version": 7, "extensions": ["statistics", "model_repository", 3]},
        "/v2/repository/index": [{"name": "m", "state": "READY"}, "junk"],
        "/v2/models/m": {"name": "m", "versions": None, "platform": "x",
                         "inputs": [{"name": "x", "datatype": "INT32", "shape": [-1]}],
                         "outputs": [{"name": "y", "datatype": "INT32", "shape": [-1]}]},
        "/v2/models/m/stats": {"model_stats": [{"name": "m", "inference_stats": {"success": {"count": "many"}}}]},
        "/v2/models/m/infer": {"outputs": [{"name": 1, "shape": "wide"}, "junk"], "id": 5},
    }

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps(self.answers.get(self.path.split("?")[0], None)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_server_of_odd_answers_fails_cases_but_never_the_run() -> None:
    odd = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    thread = threading.Thread(target=odd.serve_forever, daemon=True)
    thread.start()
    try:
        result = _cli(f"http://127.0.0.1:{odd.server_address[1]}", "127.0.0.1:9", "--rest-only", "--format", "json")
    finally:
        odd.shutdown()
        odd.server_close()
        thread.join(timeout=10)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    outcomes = {(r["case"], r["model"]): (r["outcome"], r["detail"]) for r in json.loads(result.stdout)["results"]}
    assert outcomes[("metadata.server", "")] == ("fail", "`version` is 7, not a string; `extensions` is [\"statistics\""
                                                         ", \"model_repository\", 3], not an array of strings")
    assert outcomes[("metadata.model", "m")] == ("fail", "`versions` is null, not an array of strings")
    assert outcomes[("infer.valid", "m")] == ("fail", "output '1': shape 'wide' is not a list of integers; an output "
                                                      "is not an object: 'junk'; model_name is '', expected 'm'; the "
                                                      "outputs are [1], expected ['y']")
    assert outcomes[("infer.statistics", "m")] == (
        "fail", "the answer could not be read: ValueError(\"invalid literal for int() with base 10: 'many'\")")
    assert outcomes[("health.server_live", "")][0] == "pass"  # a 200 is live, whatever the body
