"""Schemathesis against the generated server's own document (/openapi.json: the spec's operations and each ready
model's inference): one 60 s run, a fixed seed, positive and negative data (`--mode all`), the coverage, fuzzing
and stateful phases (and examples, should the document carry any), every check, over every operation of the
document, load and unload included.

What must hold: no 5xx but the documented 503 of a model the run unloaded, no status the document does not list
for the operation, every answer matches the schema of its status (bodies, content types, headers), 405 with
`Allow` for methods a path lacks, schema-valid requests accepted and schema-violating ones refused, no operation
whose generated valid requests are mostly refused (schemathesis's "schema validation mismatch"), and the server
whole at the end (every model loaded again, ready, and answering an inference exactly).

Where the document was made to say what the server does:
- the spec's templated inference and generate (`/v2/models/{model_name}/...infer`, `.../generate[_stream]`):
  their `model_name` excludes the served models (`not: enum`), whose own concrete paths match first (OpenAPI),
  with request and answer schemas narrowed to the model (for generate: each input once, at the top or in
  `parameters`, a scalar or a flat array that fits its shape and datatype; `id` a string; other keys scalar
  parameters, `triton_*` refused but those the server takes; the answer's outputs, as JSON or as the `data` of
  each event of `generate_stream`); the server looks the model up before it reads the body, so a name it does not
  serve is 404 whatever the body, which schemathesis 4's acceptances of valid data include (2xx, 3xx, 401, 403,
  404, 409, 429, 5xx: schemathesis/config/_checks.py);
- a shared memory region name is `not` a search for a refused character, which ECMA-262 and Python's `re` read
  alike (tests/server/extensions/test_shared_memory_safety.py); it sits in `allOf`, since schemathesis replaces a
  path parameter's own `not.pattern` with its `[/{}]`; status and unregister take the same schema (schemathesis
  reuses a value of one operation's `region_name` in another's); register's offset and byte_size are uint64
  (`maximum`);
- load and unload run in the main run: the operations that document 503 (not ready) may answer it, exactly those
  (read from the document), and load may also answer its documented 501 (below);
- 408 and 413 count as refusals of negative data: every operation with a body documents both (a body stalled past
  --http-body-timeout; a body, or a tensor, larger than the server takes), so that is the document's own word.

Allowances that stay, each scoped to the operations concerned (see CONFIG):
- the templated inference and generate, negative data: a served name, which its schema excludes, is answered 200
  by that model's own operation (the concrete path first, as OpenAPI says; schemathesis does not apply that
  precedence), and that operation is held to every check itself;
- a model's own generate, valid data: a request parameter named both at the top and in `parameters` is given
  twice (400); JSON Schema cannot say that two objects share no key (the schema says it of the inputs and of the
  reserved keys, which it names);
- a model's own inference or generate when one of its dimensions has any size (-1): JSON Schema cannot tie the
  length of `data` to the shape the request states (nor a generate input's length to a multiple of the fixed
  dimensions), so a schema-valid request may be refused 400 (count differs) or 413 (more elements than the server
  takes per tensor); models of fixed shape (`simple`) are held to the full check;
- a load with parameters is a documented 501 (this server loads models as their folder defines them);
- schemathesis's own limit (`TOOL_LIMIT`): in the stateful phase it may fail to make a linked request whose schema
  its canonical form (jsonschema-rs) cannot express, and it reports that as an error of the run, not as a failure
  of the server. How far the time budget takes the phase decides whether it meets one. A run whose only errors are
  that one, with no check failed and every generated case passed, counts as a pass.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from serving import Server, running

MODELS = ("simple", "identity_fp32", "identity_bytes")
SEED = 20261123
BUDGET_S = 60
TOOL_LIMIT = "Failed to generate test cases for this API operation: result is not supported in canonical form"

CONFIG = """
# schemathesis's list of refusals, with 408 and 413: every operation with a body lists both (a body that stalls
# past --http-body-timeout, a body or a tensor larger than the server takes), so a refusal with either is an answer
# the document states, not an allowance.
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "408", "409", "413", "415", "422", "428", "429", "5xx"]

# Half of the reads name a model (and version) that exists, so that they reach the model, not only the 404.
[dictionaries.models]
values = {models}

[dictionaries.versions]
values = ["1"]

[[operations]]
include-method = "GET"
parameters = {{ "path.model_name" = {{ dictionary = "models", probability = 0.5 }}, \
"path.model_version" = {{ dictionary = "versions", probability = 0.5 }} }}

# The spec's templated inference and generate: their `model_name` excludes the served models, whose own (concrete)
# paths answer them first; schemathesis does not apply that precedence, so a served name it sends as negative data
# reaches the model's own operation, which answers 200 (and is itself held to every check).
[[operations]]
include-path-regex = \
"^/v2/models/\\\\{{model_name\\\\}}/(versions/\\\\{{model_version\\\\}}/)?(infer|generate|generate_stream)$"
checks.negative_data_rejection.expected-statuses = [\
"200", "400", "401", "403", "404", "405", "406", "408", "409", "413", "415", "422", "428", "429", "5xx"]

# A model's own generate: a request parameter named both at the top and in `parameters` is given twice (400), and
# JSON Schema cannot say that two objects share no key (it says so of the inputs and the reserved keys).
[[operations]]
include-path-regex = "^/v2/models/[^{{/]+/(versions/[^{{/]+/)?generate(_stream)?$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]

# A model's own inference or generate when one of its dimensions has any size (-1): JSON Schema cannot tie the
# length of `data` (or of a generate input) to the shape, so a schema-valid request may be refused 400 (count
# differs) or 413 (more elements than the server takes per tensor); schemathesis's list of acceptances with those two.
[[operations]]
include-path-regex = "{any_size}"
checks.positive_data_acceptance.expected-statuses = [
"2xx", "3xx", "400", "401", "403", "404", "409", "413", "429", "5xx"]

# A model that the run unloads is not ready until it loads again: the operations that document 503 answer it.
[[operations]]
include-operation-id = {not_ready}
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]

[[operations]]
include-operation-id = "repository_model_load"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "501", "503"]
"""



@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("schemathesis")
    models = ROOT / "examples" / "models"
    for name in MODELS:
        shutil.copytree(models / name, root / "models" / name, ignore=shutil.ignore_patterns("__pycache__"))
    with running(root / "models", root, ready=MODELS) as server:
        yield server


def _config(server: Server, document: dict[str, Any]) -> str:
    """The run's configuration: the models with a dimension of any size are read from their metadata, the
    operations that document 503 (not ready) from the document."""
    with server.http_client() as http:
        any_size = [name for name in MODELS
                    if any(-1 in t["shape"] for t in http.get(f"/v2/models/{name}").json()["inputs"])]
    assert any_size and "simple" not in any_size  # both kinds of model are in the run
    pattern = "^/v2/models/(" + "|".join(map(re.escape, any_size)) + ")/"
    not_ready = sorted(op["operationId"] for op in _operations(document)
                       if "503" in op["responses"] and op["operationId"] != "repository_model_load")
    assert "model_infer" in not_ready and "model_metadata" in not_ready and "server_ready" in not_ready
    return CONFIG.format(models=json.dumps(list(MODELS)), any_size=pattern.replace("\\", "\\\\"),
                         not_ready=json.dumps(not_ready))


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in document["paths"].values() for key, op in item.items()
            if key in ("get", "put", "post", "delete", "patch", "head", "options", "trace")]


def _st(server: Server, config: Path, *args: str, budget: int) -> str:
    st = Path(sys.executable).with_name("st")
    argv = [str(st), "--config-file", str(config), "run", f"{server.url}/openapi.json", *args,
            "--checks", "all", "--mode", "all", "--max-time", str(budget), "--seed", str(SEED),
            "--generation-database", "none", "--request-timeout", "10", "--no-color"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=budget + 180, check=False,
                          cwd=config.parent)
    output = done.stdout + done.stderr
    assert done.returncode == 0 or _tool_limits_only(output), output[-8000:]
    return output


def _tool_limits_only(output: str) -> bool:
    """Whether a run's only errors are schemathesis's own `TOOL_LIMIT`, with no check failed."""
    if "SUMMARY" not in output:
        return False
    summary = output[output.rindex("SUMMARY"):]
    errors = re.findall(r"^\s*🚫 ([^:\n]+): (\d+)$", summary, re.MULTILINE)
    return ("Failures:" not in summary and bool(errors) and all(kind == "Schema Error" for kind, _ in errors)
            and output.count(TOOL_LIMIT) == sum(int(count) for _, count in errors))


def test_schemathesis_finds_nothing(server: Server, tmp_path: Path) -> None:
    with server.http_client() as http:
        document = http.get("/openapi.json").json()
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(server, document))
    try:
        output = _st(server, config, "--phases", "examples,coverage,fuzzing,stateful", budget=BUDGET_S)
    finally:  # the run may end with models unloaded: load every one again
        with server.http_client() as http:
            for name in MODELS:
                assert http.post(f"/v2/repository/models/{name}/load").status_code == 200
    summary = output[output.rindex("SUMMARY"):]
    # every operation of the document was run, load and unload among them, in every phase
    assert f"Tested: {len(_operations(document))}\n" in summary, summary
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary or (phase == "Stateful" and _tool_limits_only(output)), summary
    # no operation whose generated valid requests are mostly refused
    assert "Schema validation mismatch" not in output, output[-8000:]
    assert re.search(r"(\d+) generated, \1 passed", summary), summary
    with server.http_client() as http:  # and the server is up and right
        assert http.get("/v2/health/ready").json() == {"ready": True}
        assert all(http.get(f"/v2/models/{name}/ready").status_code == 200 for name in MODELS)
        answer = http.post("/v2/models/simple/infer", json={"inputs": [
            {"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for i in (0, 1)]})
        assert answer.status_code == 200, answer.text
        assert {o["name"]: o["data"] for o in answer.json()["outputs"]} == {
            "OUTPUT0": [2 * i for i in range(16)], "OUTPUT1": [0] * 16}
    assert "Traceback" not in server.log_text()


def test_only_the_tools_own_limit_is_allowed() -> None:
    """A run that met schemathesis's own limit (as one did) passes; one with a failed check or any other error
    does not."""
    summary = ("SUMMARY\n\nTest Phases:\n  ✅ Coverage\n  ✅ Fuzzing\n  🚫 Stateful\n\nErrors:\n"
               "  🚫 Schema Error: 1\n\nTest cases:\n  5409 generated, 5409 passed\n")
    errors = f"ERRORS\nStateful tests\nSchema Error\n\n{TOOL_LIMIT}\n\n"
    assert _tool_limits_only(errors + summary)
    assert not _tool_limits_only(summary)  # the error is another one
    assert not _tool_limits_only(errors + summary.replace("Schema Error: 1", "Schema Error: 2"))
    assert not _tool_limits_only(errors + summary.replace("Schema Error: 1", "Network Error: 1"))
    assert not _tool_limits_only(errors + summary.replace("Errors:", "Failures:\n  ❌ Server error: 1\n\nErrors:"))
