"""Schemathesis against the generated server's own document (/openapi.json, the spec's operations and each ready
model's inference): a 60 s budget for the whole run, a fixed seed, positive and negative data (`--mode all`), the
coverage, fuzzing and stateful phases (and examples, should the document carry any), every check.

What must hold: no 5xx, no status the document does not list for the operation, every answer matches the schema
of its status (bodies, content types, headers), 405 with `Allow` for methods a path lacks, schema-valid requests
accepted and schema-violating ones refused (400, or 408/413 for what is too slow or too large), and no operation
whose generated valid requests are all refused (schemathesis's "schema validation mismatch"), but for the spec's
templated inference and generate operations (below).

Allowances, each for something JSON Schema cannot say, scoped to the operations concerned:
- the spec's templated inference and generate operations (`/v2/models/{model_name}/...`): the body depends on the
  model the path names, which the schema cannot know (each model's own operations state it exactly), so a
  schema-valid body may be refused 400/404/413/503 there;
- a model's own inference when one of its dimensions has any size (-1): JSON Schema cannot tie the length of
  `data` to the shape the request states, so a schema-valid request may be refused 400 (count differs) or 413
  (more elements than the server takes per tensor); models of fixed shape (`simple`) are held to the full check;
- a shared memory region name: schemathesis's generator makes names the spec's pattern refuses (a trailing
  newline, C1 control characters), which the server refuses 400 (tests/test_shared_memory_safety.py checks names);
- a load with parameters is a documented 501 (this server loads models as their folder defines them);
- load and unload run apart, after the main run, in the coverage and fuzzing phases only (names the generator
  makes up): in the main run, the stateful phase would follow the repository index to unload a served model, and
  its answers meanwhile are the documented 503 (not ready), which the run counts as a server error. The fault
  suite (tests/test_faults.py) storms load/unload of served models under inference.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from serving import Server, running

MODELS = ("simple", "identity_fp32", "identity_bytes")
SEED = 20261123
BUDGET_S = 60

CONFIG = """
# schemathesis's list of refusals, with 408 and 413 (a tensor of more elements than the server takes).
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

[[operations]]
include-path-regex = "\\\\{{model_name\\\\}}/(versions/\\\\{{model_version\\\\}}/)?(infer|generate|generate_stream)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "413", "503"]

[[operations]]
include-path-regex = "{any_size}"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "413"]

[[operations]]
include-operation-id = "repository_model_load"
checks.not_a_server_error.expected-statuses = ["1xx", "2xx", "3xx", "4xx", "501"]

# Region names: the generator makes names that the spec's pattern refuses (Python's `$` admits a trailing newline,
# and C1 control characters came through), which the server rightly refuses with 400.
[[operations]]
include-operation-id = "system_shared_memory_register"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409", "429"]
"""


_TEMPLATED = re.compile(
    r"^POST /v2/models/\{model_name\}/(versions/\{model_version\}/)?(infer|generate|generate_stream)$")
# Shared memory register: the generator's names pass the pattern yet are refused (see CONFIG), so most generated
# requests of this one operation can be refused.
_REGISTER = "POST /v2/systemsharedmemory/region/{region_name}/register"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("schemathesis")
    models = ROOT / "examples" / "models"
    for name in MODELS:
        shutil.copytree(models / name, root / "models" / name, ignore=shutil.ignore_patterns("__pycache__"))
    with running(root / "models", root, ready=MODELS) as server:
        yield server


def _config(server: Server) -> str:
    """The run's configuration; the models with a dimension of any size are read from their metadata."""
    with server.http_client() as http:
        any_size = [name for name in MODELS
                    if any(-1 in t["shape"] for t in http.get(f"/v2/models/{name}").json()["inputs"])]
    assert any_size and "simple" not in any_size  # both kinds of model are in the run
    pattern = "^/v2/models/(" + "|".join(map(re.escape, any_size)) + ")/"
    return CONFIG.format(models="[" + ", ".join(f'"{m}"' for m in MODELS) + "]",
                         any_size=pattern.replace("\\", "\\\\"))


REPOSITORY_WRITES = ("repository_model_load", "repository_model_unload")


def _st(server: Server, config: Path, *args: str, budget: int) -> str:
    st = Path(sys.executable).with_name("st")
    argv = [str(st), "--config-file", str(config), "run", f"{server.url}/openapi.json", *args,
            "--checks", "all", "--mode", "all", "--max-time", str(budget), "--seed", str(SEED),
            "--generation-database", "none", "--request-timeout", "10", "--no-color"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=budget + 180, check=False,
                          cwd=config.parent)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    return output


def test_schemathesis_finds_nothing(server: Server, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(server))
    with server.http_client() as http:
        operations = sum(
            1 for item in http.get("/openapi.json").json()["paths"].values() for key in item
            if key in ("get", "put", "post", "delete", "patch", "head", "options", "trace")
        )
    excluded = [arg for op in REPOSITORY_WRITES for arg in ("--exclude-operation-id", op)]
    output = _st(server, config, *excluded, "--phases", "examples,coverage,fuzzing,stateful", budget=BUDGET_S)
    summary = output[output.rindex("SUMMARY"):]
    # every operation of the document was run (load and unload below)
    assert f"Tested: {operations - len(REPOSITORY_WRITES)}\n" in summary, summary
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, summary
    # "Schema validation mismatch" (every generated valid request of an operation refused): only where the body
    # depends on the model the path names (see the allowances above), never a model's own or any other operation.
    mismatched = re.findall(r"^  - (\S+ \S+)$", output.split("Schema validation mismatch:")[1].split("💡")[0],
                            re.MULTILINE) if "Schema validation mismatch:" in output else []
    assert all(_TEMPLATED.search(op) or op == _REGISTER for op in mismatched), output[-8000:]
    assert re.search(r"(\d+) generated, \1 passed", summary), summary

    included = [arg for op in REPOSITORY_WRITES for arg in ("--include-operation-id", op)]
    output = _st(server, config, *included, "--phases", "coverage,fuzzing", budget=15)
    summary = output[output.rindex("SUMMARY"):]
    assert f"Tested: {len(REPOSITORY_WRITES)}\n" in summary, summary
    assert re.search(r"(\d+) generated, \1 passed", summary), summary
    with server.http_client() as http:  # and the server is still up and right
        assert http.get("/v2/health/ready").json() == {"ready": True}
        assert all(http.get(f"/v2/models/{name}/ready").status_code == 200 for name in MODELS)
    assert "Traceback" not in server.log_text()
