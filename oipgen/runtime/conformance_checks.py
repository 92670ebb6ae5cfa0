"""The protocol layer's checks (registered into `conformance_protocol.CHECKS`, in this order): each names the section
it checks and the spec's words for its rule, and returns what it expected, what came and how they differ.

Statuses are those of the spec (spec/README.md, choice 14): 400 / INVALID_ARGUMENT for an invalid request, 404 /
NOT_FOUND for an unknown model or version, 405 for a wrong method, always with the body {"error": "<message>"}.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from . import datatypes, framing
from .conformance_protocol import Context, Model, NotApplicable, Verdict, check
from .conformance_results import Answer, compare_json, print_message, show
from .conformance_tensors import Decoded, Request, TensorMeta, decode_grpc, decode_rest, fits, valid_request

__all__ = [
    "answered",
    "code_problems",
    "derived_request",
    "grpc_json",
    "json_body",
    "refused",
    "send",
    "status_problems",
]

UNKNOWN = "conformance-no-such-model"
UNKNOWN_TENSOR = "CONFORMANCE_UNKNOWN"
ERROR_BODY = 'with {"error": "<message>"}'


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def status_problems(answer: Answer, status: int, error_body: bool = False) -> list[str]:
    if answer.error:
        return [answer.error]
    problems = [] if answer.status == status else [f"status {answer.status}, expected {status}"]
    if error_body and not answer.error_body():
        problems.append('the body is not {"error": "<message>"}')
    return problems


def code_problems(answer: Answer, code: str) -> list[str]:
    if answer.error:
        return [answer.error]
    if answer.status != code:
        return [f"code {answer.status}" + (f" ({answer.details})" if answer.details else "") + f", expected {code}"]
    return []


def refused(answer: Answer, transport: str, status: int, code: str) -> Verdict:
    if transport == "rest":
        return Verdict(f"{status} {ERROR_BODY}", answer, status_problems(answer, status, True))
    return Verdict(code, answer, code_problems(answer, code))


def json_body(answer: Answer) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def grpc_json(answer: Answer) -> Any:
    ok = answer.status == "OK" and answer.message is not None
    return print_message(answer.message, defaults=True) if ok and answer.message is not None else None


def derived_request(model: Model | None) -> tuple[Model, Request]:
    assert model is not None
    if model.problem:
        raise NotApplicable(model.problem)
    return model, valid_request(model.name, model.inputs)


def _json_type(model: Model, name: str) -> bool:
    meta = next((o for o in model.outputs if o.name == name), None)
    return meta is None or datatypes.BY_NAME[meta.datatype].json


def send(
    ctx: Context, transport: str, model: Model, request: Request, *, binary: bool = False, version: str = ""
) -> tuple[Answer, Decoded | None]:
    """Send an inference request over `transport` (REST: JSON data unless `binary`, or where a datatype has no
    JSON form) and decode a successful answer."""
    if transport == "rest":
        wanted = request.outputs or tuple(o.name for o in model.outputs)
        binary_outputs = [n for n in wanted if binary or not _json_type(model, n)]
        if (binary or binary_outputs or not request.json_only()) and not ctx.listed("binary_tensor_data"):
            raise NotApplicable("the model has FP16 or BF16 tensors, which travel as binary tensor data only "
                                "(choice 8), and the server does not list binary_tensor_data")
        content, headers = request.rest_body(binary, binary_outputs)
        operation = "model_infer_versioned" if version else "model_infer"
        answer = ctx.rest(operation, model.name, version, content=content, headers=headers)
        return answer, decode_rest(answer) if answer.status == 200 else None
    message = request.grpc_message(ctx.target.rpcs["ModelInfer"].request, version)
    answer = ctx.target.call("ModelInfer", message)
    return answer, decode_grpc(answer.message) if answer.status == "OK" and answer.message is not None else None


def answered(
    model: Model, transport: str, answer: Answer, decoded: Decoded | None, requested: tuple[str, ...] = ()
) -> list[str]:
    """What is wrong with the answer to a valid request: outputs of the declared names, datatypes and shapes."""
    problems = status_problems(answer, 200) if transport == "rest" else code_problems(answer, "OK")
    if problems or decoded is None:
        return problems or ["no answer"]
    problems = list(decoded.problems)
    if decoded.model_name != model.name:
        problems.append(f"model_name is {decoded.model_name!r}, expected {model.name!r}")
    declared = {o.name: o for o in model.outputs}
    want = list(requested) or list(declared)
    got = [name for name, *_ in decoded.outputs]
    if sorted(map(str, got)) != sorted(want):
        problems.append(f"the outputs are {got}, expected {want}")
    for name, datatype, shape, _ in decoded.outputs:
        meta = declared.get(name)
        if meta is not None and datatype != meta.datatype:
            problems.append(f"output '{name}' has datatype {datatype}, its metadata says {meta.datatype}")
        if meta is not None and not fits(shape, meta.shape):
            problems.append(f"output '{name}' has shape {shape}, its metadata says {list(meta.shape)}")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Health and metadata


def _health(ctx: Context, transport: str, operation: str, rpc: str, key: str, model: str = "") -> Verdict:
    if transport == "rest":
        answer = ctx.rest(operation, model)
        return Verdict("200", answer, status_problems(answer, 200))
    answer = ctx.target.call(rpc, {"name": model} if model else {})
    problems = code_problems(answer, "OK")
    if not problems and not getattr(answer.message, key, False):
        problems.append(f"{key} is false")
    return Verdict(f"OK with {key}: true", answer, problems)


@check("health.server_live", "health", 'OIP, Health / Server Live: "server live" answers 200 (gRPC ServerLive: '
       "OK, live true) when the server can receive and respond to metadata and inference requests")
def _server_live(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _health(ctx, transport, "server_live", "ServerLive", "live")


@check("health.server_ready", "health", 'OIP, Health / Server Ready: "server ready" answers 200 (gRPC ServerReady: '
       "OK, ready true) when the server is ready for inferencing")
def _server_ready(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _health(ctx, transport, "server_ready", "ServerReady", "ready")


@check("health.body", "health", 'spec/README.md, choice 4 (and 5): "Health answers carry JSON bodies: {"live": bool}, '
       '{"ready": bool}, {"name": str, "ready": bool}, as the OIP REST doc and KServe python show"',
       transports=("rest",), choice=4)
def _health_body(ctx: Context, transport: str, model: Model | None) -> Verdict:
    wanted: list[tuple[str, str, dict[str, Any]]] = [("server_live", "", {"live": True}),
                                                     ("server_ready", "", {"ready": True})]
    if ctx.models:
        name = ctx.models[0].name
        wanted.append(("model_ready", name, {"name": name, "ready": True}))
    verdict = Verdict(" and ".join(show(body) for *_, body in wanted))
    for operation, name, body in wanted:
        answer = ctx.rest(operation, name)
        if answer.error or not answer.body:
            found = [answer.error or "the body is empty"]
        else:
            got = json_body(answer)
            found = ["the body is not JSON"] if got is None else compare_json(body, got)
        problems = [f"{ctx.path(operation, name)}: {p}" for p in found]
        if problems and not verdict.problems:
            verdict.answer = answer
        verdict.problems += problems
    return verdict


@check("health.model_ready", "health", 'OIP, Health / Model Ready: "model ready" answers 200 (gRPC ModelReady: OK, '
       "ready true) for a model that is ready for inferencing", per_model=True)
def _model_ready(ctx: Context, transport: str, model: Model | None) -> Verdict:
    assert model is not None
    return _health(ctx, transport, "model_ready", "ModelReady", "ready", model.name)


@check("metadata.server", "server-metadata", 'OIP, Server Metadata Response JSON Object: {"name": $string, '
       '"version": $string, "extensions": [$string, ...]} with a 200 status (gRPC ServerMetadata: OK)')
def _server_metadata(ctx: Context, transport: str, model: Model | None) -> Verdict:
    if transport == "grpc":
        answer = ctx.target.call("ServerMetadata", {})
        verdict = Verdict("OK with name, version and the extensions REST lists", answer, code_problems(answer, "OK"))
        if not verdict.problems and ctx.target.http is not None and ctx.extensions is not None:
            listed = list(getattr(answer.message, "extensions", []))
            if sorted(listed) != sorted(ctx.extensions):
                verdict.problems.append(f"extensions {listed}, but REST lists {ctx.extensions}")
        return verdict
    answer = ctx.rest("server_metadata")
    verdict = Verdict("200 {name: string, version: string, extensions: [string]}", answer, status_problems(answer, 200))
    body = json_body(answer)
    if not verdict.problems:
        if not isinstance(body, dict):
            verdict.problems.append(f"the body is not a JSON object: {answer.text(80)}")
        else:
            for key in ("name", "version"):
                if not isinstance(body.get(key), str):
                    verdict.problems.append(f"`{key}` is {show(body.get(key))}, not a string")
            extensions = body.get("extensions")
            if not isinstance(extensions, list) or not all(isinstance(e, str) for e in extensions):
                verdict.problems.append(f"`extensions` is {show(extensions)}, not an array of strings")
    return verdict


@check("metadata.model", "model-metadata", 'OIP, Model Metadata Response JSON Object: "name", "platform" strings, '
       '"versions" (optional) an array of strings, "inputs" and "outputs" arrays of {"name", "datatype", "shape"} '
       "with a 200 status (gRPC ModelMetadata: OK, the same tensors)", per_model=True)
def _model_metadata(ctx: Context, transport: str, model: Model | None) -> Verdict:
    assert model is not None
    expected = "the model's name, platform, versions and tensors"
    if transport == "grpc":
        answer = ctx.target.call("ModelMetadata", {"name": model.name})
        verdict = Verdict("OK with " + expected, answer, code_problems(answer, "OK"))
        data = grpc_json(answer)
        if data is not None and data.get("name") != model.name:
            verdict.problems.append(f"name is {show(data.get('name'))}, expected {model.name!r}")
        if data is not None and isinstance(model.metadata, dict) and ctx.target.http is not None:
            for key in ("inputs", "outputs"):
                ours = [(t["name"], t["datatype"], [int(d) for d in t.get("shape", [])]) for t in data.get(key, [])]
                rest = [(t.get("name"), t.get("datatype"), t.get("shape")) for t in model.metadata.get(key) or []]
                if ours != rest:
                    verdict.problems.append(f"{key} {show(ours, 120)} differ from REST's {show(rest, 120)}")
        return verdict
    answer = ctx.rest("model_metadata", model.name)
    verdict = Verdict("200 with " + expected, answer, status_problems(answer, 200))
    body = json_body(answer)
    if verdict.problems:
        return verdict
    if not isinstance(body, dict):
        return Verdict(verdict.expected, answer, ["the body is not a JSON object"])
    if body.get("name") != model.name:
        verdict.problems.append(f"`name` is {show(body.get('name'))}, expected {model.name!r}")
    if not isinstance(body.get("platform"), str):
        verdict.problems.append(f"`platform` is {show(body.get('platform'))}, not a string")
    versions = body.get("versions", [])
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        verdict.problems.append(f"`versions` is {show(versions)}, not an array of strings")
    if model.problem.startswith("its metadata gives no request"):
        verdict.problems.append(model.problem.split(": ", 1)[1])
    return verdict


# ---------------------------------------------------------------------------------------------------------------
# Errors the server itself must tell: unknown model, unknown version, wrong method, unknown path, bad bodies


def _unknown(ctx: Context, transport: str, kind: str, name: str, version: str = "") -> Verdict:
    if transport == "rest":
        if kind == "infer":
            body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
            operation = "model_infer_versioned" if version else "model_infer"
            return refused(ctx.rest(operation, name, version, body=body), transport, 404, "NOT_FOUND")
        operation = {"ready": "model_ready", "metadata": "model_metadata"}[kind] + ("_versioned" if version else "")
        return refused(ctx.rest(operation, name, version), transport, 404, "NOT_FOUND")
    if kind == "infer":
        request = valid_request(name, [TensorMeta("INPUT0", "INT32", (1,))])
        message = request.grpc_message(ctx.target.rpcs["ModelInfer"].request, version)
        return refused(ctx.target.call("ModelInfer", message), transport, 404, "NOT_FOUND")
    rpc = {"ready": "ModelReady", "metadata": "ModelMetadata"}[kind]
    return refused(ctx.target.call(rpc, {"name": name, "version": version}), transport, 404, "NOT_FOUND")


def _unknown_model(ctx: Context, transport: str, model: Model | None, *, kind: str) -> Verdict:
    return _unknown(ctx, transport, kind, UNKNOWN)


def _unknown_version(ctx: Context, transport: str, model: Model | None, *, kind: str) -> Verdict:
    served = ctx.first_model()
    version = 987654321
    while str(version) in served.versions:
        version += 1
    return _unknown(ctx, transport, kind, served.name, str(version))


_KINDS = (("ready", "Model Ready"), ("metadata", "Model Metadata"), ("infer", "Inference"))
for _kind, _words in _KINDS:
    check(f"errors.unknown_model_{_kind}", "errors", f"OIP, {_words} JSON Error Object: a failed request is an HTTP "
          'error status with {"error": "<message>"}; spec/README.md, choice 14: "404 for an unknown model" '
          "(gRPC NOT_FOUND)", choice=14)(
        partial(_unknown_model, kind=_kind))
for _kind, _words in _KINDS:
    check(f"errors.unknown_version_{_kind}", "errors", f"OIP, {_words}: the version is optional in the URL; "
          'spec/README.md, choice 15: "a version the model does not have, numeric or not, is 404 / NOT_FOUND", '
          'with {"error": "<message>"}', choice=15)(
        partial(_unknown_version, kind=_kind))


@check("errors.wrong_method", "errors", 'spec/openapi.yaml: "A wrong HTTP method answers 405 with the same error '
       'body" (spec/README.md, choice 14)', transports=("rest",), choice=14)
def _wrong_method(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return refused(ctx.target.request("PUT", ctx.path("server_live")), transport, 405, "")


@check("errors.unknown_path", "errors", 'spec/README.md, choice 14: "an unknown path 404, both with the error body"',
       transports=("rest",), choice=14)
def _unknown_path(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return refused(ctx.target.request("GET", "/v2/conformance/no-such-path"), transport, 404, "")


def _bad_body(ctx: Context, transport: str, model: Model | None, *, body: bytes) -> Verdict:
    answer = ctx.rest("model_infer", ctx.first_model().name, content=body, headers={"Content-Type": framing.JSON_TYPE})
    return refused(answer, transport, 400, "")


_BODIES = {
    "malformed_json": (b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1', "JSON that "
                       "does not parse"),
    "body_not_object": (b"[1, 2, 3]", "a JSON array instead of the Inference Request JSON Object"),
    "missing_inputs": (b'{"id": "1"}', "an Inference Request JSON Object without its required `inputs`"),
}
for _name, (_body, _what) in _BODIES.items():
    check(f"errors.{_name}", "errors", f"OIP, Inference Request JSON Object ({_what}): a failed inference is an HTTP "
          'error status with {"error": "<message>"}; spec/README.md, choice 14: "400 for a malformed or invalid '
          'request (bad JSON, schema violations ...)"', transports=("rest",), choice=14)(
        partial(_bad_body, body=_body))


# ---------------------------------------------------------------------------------------------------------------
# Extensions with endpoints: when listed, they answer


def _answers(ctx: Context, transport: str, operation: str, rpc: str, request: dict[str, Any], kind: type) -> Verdict:
    if transport == "grpc":
        answer = ctx.target.call(rpc, request)
        return Verdict("OK", answer, code_problems(answer, "OK"))
    name = str(request.get("name", ""))
    answer = ctx.rest(operation, name, body={} if operation == "repository_index" else None)
    verdict = Verdict(f"200 with a JSON {kind.__name__.replace('list', 'array').replace('dict', 'object')}", answer,
                      status_problems(answer, 200))
    if not verdict.problems and not isinstance(json_body(answer), kind):
        verdict.problems.append(f"the body is not a JSON {'array' if kind is list else 'object'}")
    return verdict


@check("extension.model_repository", "model_repository", "Triton's model repository extension (listed as "
       '`model_repository`): POST v2/repository/index answers the models with their state; spec/README.md, choice '
       '11: "No body, an empty body and {} all mean every model ... The answer is a bare array"',
       extension="model_repository", choice=11)
def _repository(ctx: Context, transport: str, model: Model | None) -> Verdict:
    verdict = _answers(ctx, transport, "repository_index", "RepositoryIndex", {}, list)
    if verdict.problems or verdict.answer is None:
        return verdict
    entries = json_body(verdict.answer) if transport == "rest" else (grpc_json(verdict.answer) or {}).get("models", [])
    states = {e.get("name"): e.get("state") for e in entries if isinstance(e, dict)}
    for served in ctx.models:
        if states.get(served.name) != "READY":
            state = show(states.get(served.name))
            verdict.problems.append(f"model '{served.name}' is ready, but the index says {state}")
    return verdict


@check("extension.statistics", "statistics", "Triton's statistics extension (listed as `statistics`): GET "
       'v2/models/stats answers {"model_stats": [...]} for every model', extension="statistics")
def _statistics(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _answers(ctx, transport, "model_statistics_all", "ModelStatistics", {}, dict)


def _region_status(ctx: Context, transport: str, model: Model | None, *, operation: str, rpc: str) -> Verdict:
    return _answers(ctx, transport, operation, rpc, {}, list)


for _ext, _operation, _rpc in (("system_shared_memory", "system_shared_memory_status_all", "SystemSharedMemoryStatus"),
                               ("cuda_shared_memory", "cuda_shared_memory_status_all", "CudaSharedMemoryStatus")):
    check(f"extension.{_ext}", _ext, f"Triton's shared-memory extension (listed as `{_ext}`): the status of every "
          "registered region answers 200 with a JSON array (gRPC: OK)", extension=_ext)(
        partial(_region_status, operation=_operation, rpc=_rpc))


@check("extension.model_configuration", "model_configuration", "Triton's model configuration extension (listed as "
       "`model_configuration`): GET v2/models/{name}/config answers the model's configuration, whose `name` is the "
       "model's (gRPC: ModelConfig, OK)", per_model=True, extension="model_configuration")
def _configuration(ctx: Context, transport: str, model: Model | None) -> Verdict:
    assert model is not None
    verdict = _answers(ctx, transport, "model_config", "ModelConfig", {"name": model.name}, dict)
    if not verdict.problems and verdict.answer is not None:
        data = json_body(verdict.answer) if transport == "rest" else (grpc_json(verdict.answer) or {}).get("config")
        if not isinstance(data, dict) or data.get("name") != model.name:
            verdict.problems.append(f"the configuration's name is not {model.name!r}")
    return verdict

