"""`oipgen build --target deploy`: the Containerfile, KServe's ServingRuntime and InferenceService, and the Ray Serve
application, written beside the package in generated/deploy/.

- The KServe manifests validate against KServe's own CRD schemas (tests/data/kserve), made strict: an unknown field
  is refused (the API server would drop it silently) and protocolVersions must be one KServe knows.
- The container's command line runs exactly as a pod runs it, in a private network namespace (netns.py): the
  same words (`--host=0.0.0.0`, ports 8080 and 8081), the test repository in place of /mnt/models; the pod's
  probes, the image's HEALTHCHECK and tritonclient over REST and gRPC see it ready and answering, and SIGTERM
  drains a request in flight and exits 0 within the pod's grace period. No container engine runs here (no image
  registry can be reached to pull a base image), so the image itself is not built.
- The Ray Serve group (marker `ray`) is test_ray.py.
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import netns
import pytest
import yaml
from conftest import GENERATED, ROOT, SPEC, TESTS, oipgen
from serving import build_repository

from oipgen.output import read_manifest
from oipgen.render import LINE_BREAKS
from oipgen.targets import requirements, resolve
from oipgen.targets.deploy import DeploySettings, defaults, parse_settings, serve_command

DEPLOY = GENERATED / "deploy"
SCHEMAS = TESTS / "data" / "kserve"
PROTOCOL_VERSIONS = ["v1", "v2", "grpc-v1", "grpc-v2"]  # KServe's constants; its CRD has no enum for them
SETTINGS: DeploySettings = parse_settings({}, "oip")
# What the README documents, written here rather than read from the generator or the files under test: the
# container's REST and gRPC ports and its command line, and Ray Serve's own proxy ports (its documented defaults:
# HTTPOptions.port 8000, gRPCOptions.port 9000).
HTTP_PORT, GRPC_PORT = 8080, 8081
RAY_HTTP_PORT, RAY_GRPC_PORT = 8000, 9000
COMMAND = ["python", "-m", "oip", "serve", "--model-repository=/mnt/models", "--host=0.0.0.0",
           f"--http-port={HTTP_PORT}", f"--grpc-port={GRPC_PORT}", "--shutdown-delay-seconds=5",
           "--graceful-shutdown-seconds=20"]


def _yaml(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return document


def containerfile(path: Path = DEPLOY / "Containerfile") -> list[tuple[str, str]]:
    """The Containerfile's instructions: (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            instructions.append((word.upper(), rest.strip()))
            pending = ""
    return instructions


def instruction(name: str) -> list[str]:
    return [args for word, args in containerfile() if word == name]


# --- what is generated ------------------------------------------------------------------------------------------


def test_the_deploy_kit_is_written_beside_the_package_and_listed_in_its_manifest() -> None:
    files = sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts)
    assert files == ["Containerfile", "kserve/inference-service.yaml", "kserve/serving-runtime.yaml",
                     "ray/oip_ray.py", "ray/serve-config.yaml"]
    manifest = read_manifest(GENERATED / "oip")
    assert manifest is not None and "deploy" in manifest["targets"]
    assert {f"../deploy/{f}" for f in files} <= set(manifest["files"])


def test_check_sees_a_hand_edited_deploy_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(GENERATED, out, ignore=shutil.ignore_patterns("__pycache__"))
    assert oipgen("build", "--check", "--out", str(out)).returncode == 0
    config = out / "deploy" / "ray" / "serve-config.yaml"
    config.write_text(config.read_text().replace("num_replicas: 2", "num_replicas: 3"))
    (out / "deploy" / "kserve" / "extra.yaml").write_text("kind: Mine\n")
    result = oipgen("build", "--check", "--out", str(out))
    assert result.returncode == 1
    assert "changed: ../deploy/ray/serve-config.yaml" in result.stderr
    assert "extra (not generated): ../deploy/kserve/extra.yaml" in result.stderr


def test_settings_come_from_the_deploy_table_of_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.oipgen]\nspec = "{SPEC.as_posix()}"\nout = "vendor"\npackage = "acme_oip"\n'
        '[tool.oipgen.deploy]\nimage = "registry.example/acme/server:1.2"\nmodel_format = "acme"\n'
        'ray_replicas = 4\nray_num_cpus = 2\ntermination_grace_seconds = 60\nworkers = 2\ncpu = "2"\n'
    )
    result = oipgen("build", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    deploy = tmp_path / "vendor" / "deploy"
    runtime = yaml.safe_load((deploy / "kserve" / "serving-runtime.yaml").read_text())
    assert runtime["metadata"]["name"] == "acme-oip-runtime"
    assert runtime["spec"]["containers"][0]["image"] == "registry.example/acme/server:1.2"
    assert runtime["spec"]["containers"][0]["command"] == ["python", "-m", "acme_oip", "serve"]
    assert runtime["spec"]["containers"][0]["args"][-3:] == ["--shutdown-delay-seconds=5",
                                                             "--graceful-shutdown-seconds=50", "--workers=2"]
    assert runtime["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"
    [cmd] = [line for line in (deploy / "Containerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert json.loads(cmd[4:])[-1] == "--workers=2"
    assert runtime["spec"]["supportedModelFormats"][0]["name"] == "acme"
    service = yaml.safe_load((deploy / "kserve" / "inference-service.yaml").read_text())
    assert service["spec"]["predictor"]["model"]["modelFormat"]["name"] == "acme"
    assert service["spec"]["predictor"]["terminationGracePeriodSeconds"] == 60
    ray = yaml.safe_load((deploy / "ray" / "serve-config.yaml").read_text())
    assert ray["applications"][0]["deployments"][0]["num_replicas"] == 4
    assert ray["applications"][0]["deployments"][0]["ray_actor_options"]["num_cpus"] == 2.0
    assert ray["applications"][0]["import_path"] == "acme_oip_ray:build"
    assert (deploy / "ray" / "acme_oip_ray.py").read_text().count("from acme_oip.server import") == 1
    # Settings are an input: changing one makes the tree stale.
    pyproject = (tmp_path / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(pyproject.replace("ray_replicas = 4", "ray_replicas = 5"))
    assert oipgen("build", "--check", cwd=tmp_path).returncode == 1


@pytest.mark.parametrize(("table", "message"), [
    ('imgae = "x"', "unknown setting 'imgae'"),
    ("ray_replicas = \"two\"", "ray_replicas must be a int"),
    ('runtime = "My_Runtime"', "is not a Kubernetes name"),
    ("uid = 0", "non-root"),
    ("min_replicas = 5\nmax_replicas = 2", "min_replicas is larger than max_replicas"),
    ("shutdown_delay_seconds = -1", "shutdown_delay_seconds must be 0 or more, got -1"),
    ("termination_grace_seconds = 10\nshutdown_delay_seconds = 5",
     "termination_grace_seconds (10) must leave the drain a second after shutdown_delay_seconds (5)"),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path: Path, table: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.oipgen]\nspec = "{SPEC.as_posix()}"\n[tool.oipgen.deploy]\n{table}\n')
    result = oipgen("build", cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and "[tool.oipgen.deploy]" in result.stderr
    assert not (tmp_path / "generated").exists()


def _deploy_table(tmp_path: Path, table: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.oipgen]\nspec = "{SPEC.as_posix()}"\n[tool.oipgen.deploy]\n{table}\n', encoding="utf-8")
    return oipgen("build", cwd=tmp_path)


def test_a_carriage_return_in_base_image_cannot_add_a_containerfile_instruction(tmp_path: Path) -> None:
    result = _deploy_table(tmp_path, 'base_image = "python:3.11\\rRUN\\ttouch\\t/tmp/x"')
    assert result.returncode == 2
    assert "base_image 'python:3.11\\rRUN\\ttouch\\t/tmp/x' holds a line break" in result.stderr
    assert not (tmp_path / "generated").exists()


def test_a_line_separator_in_image_cannot_reparent_the_serving_runtime_fields(tmp_path: Path) -> None:
    result = _deploy_table(tmp_path, 'image = "acme/server:1\\u2028privileged:"')
    assert result.returncode == 2
    assert "image 'acme/server:1\\u2028privileged:' holds a line break" in result.stderr
    assert not (tmp_path / "generated").exists()


STRING_SETTINGS = sorted(key for key, value in defaults("oip").items() if isinstance(value, str))
STEERING = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\t", "\x00", "\x1b", "\x7f",
            "\u202e"]


@pytest.mark.parametrize("key", STRING_SETTINGS)
@pytest.mark.parametrize("char", STEERING, ids=[f"U+{ord(c):04X}" for c in STEERING])
def test_no_string_setting_takes_a_character_that_can_steer_a_line(tmp_path: Path, key: str, char: str) -> None:
    value = defaults("oip")[key][:3] + char + "x"
    with pytest.raises(ValueError, match=f"{key} .* holds a line break"):
        parse_settings({key: value}, "oip")


def test_the_command_line_refuses_each_steering_character(tmp_path: Path) -> None:
    for char in STEERING:
        result = _deploy_table(tmp_path, f'storage_uri = "s3://a\\u{ord(char):04X}b"')
        assert result.returncode == 2 and "storage_uri" in result.stderr, (char, result.stderr)
        assert char not in result.stderr.removesuffix("\n")  # one line: named escaped, never echoed raw
    assert not (tmp_path / "generated").exists()


def test_a_kubernetes_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes name"):
        parse_settings({"runtime": "oip-runtime\n"}, "oip")


@pytest.mark.parametrize("value", ["&anchor", "*alias", "!tag", "-flag", "{a}", "[a]", "|", ">x", "%x", "@x", "`x"])
def test_a_word_setting_cannot_start_with_a_yaml_indicator(value: str) -> None:
    with pytest.raises(ValueError, match="starting with a letter or digit"):
        parse_settings({"image": value}, "oip")


def test_line_breaks_are_exactly_what_str_splitlines_splits_on() -> None:
    splitters = {chr(i) for i in range(0x110000) if len(f"a{chr(i)}b".splitlines()) == 2}
    assert splitters == LINE_BREAKS


def test_the_renderer_refuses_a_line_break_it_does_not_write(tmp_path: Path) -> None:
    """The renderer writes "\\n" only; output that holds another line break (a value carried it in) is refused,
    never turned into a new line."""
    override = tmp_path / "templates" / "deploy"
    override.mkdir(parents=True)
    original = (ROOT / "templates" / "deploy" / "Containerfile.jinja").read_text()
    (override / "Containerfile.jinja").write_text(original + "LABEL x=a\u2028RUN touch /tmp/x\n", encoding="utf-8")
    result = oipgen("build", "--spec", str(SPEC), "--templates", str(tmp_path / "templates"), "--out", "out",
                    cwd=tmp_path)
    assert result.returncode == 2
    assert "deploy/Containerfile.jinja: the rendered text holds line breaks other than \\n (U+2028)" in result.stderr
    assert not (tmp_path / "out").exists()


# --- the models' own requirements in the image ------------------------------------------------------------------

SERVER_REQUIREMENTS = requirements(resolve(["server"]))


def _installed_by(run: str) -> list[str]:
    """The words a RUN `python -m pip install ...` passes to pip, as a real shell splits them (printf stands in
    for pip: nothing is installed, and nothing but printf runs)."""
    assert run.startswith("python -m pip install "), run
    done = subprocess.run(["sh", "-c", "printf '%s\\n' " + run.removeprefix("python -m pip install ")],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.splitlines()


def _pip_layers(tmp_path: Path, table: str) -> tuple[list[str], str]:
    result = _deploy_table(tmp_path, table)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "generated" / "deploy" / "Containerfile"
    instructions = containerfile(path)
    runs = [i for i, (word, args) in enumerate(instructions) if word == "RUN" and "pip install" in args]
    copy = next(i for i, (word, args) in enumerate(instructions) if word == "COPY")
    assert all(i < copy for i in runs)  # before the package: a change to it reinstalls nothing
    return [instructions[i][1] for i in runs], path.read_text()


def test_the_models_requirements_get_a_layer_of_their_own_after_the_servers(tmp_path: Path) -> None:
    wanted = ["scikit-learn>=1.4", "torch==2.3.0; python_version < '3.13'", "acme-models[gpu]>=2",
              "weights @ https://example.com/$(touch${IFS}pwned)/w-1.0.zip#sha256=abc"]
    toml = ", ".join(json.dumps(r) for r in wanted)
    (server, models), text = _pip_layers(tmp_path, f"model_requirements = [{toml}]")
    assert _installed_by(server) == list(SERVER_REQUIREMENTS)
    # The models' layer: theirs, then the server's again so that pip resolves both; word for word through sh.
    assert _installed_by(models) == [*wanted, *SERVER_REQUIREMENTS]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    assert "They come from [tool.oipgen.deploy] model_requirements; when they change, run `oipgen build`, then" \
           " build the" in text


def test_without_model_requirements_the_containerfile_says_where_they_go(tmp_path: Path) -> None:
    (server,), text = _pip_layers(tmp_path, 'image = "acme/server:1"')
    assert _installed_by(server) == list(SERVER_REQUIREMENTS)
    assert "# The models' own requirements (scikit-learn, torch...) go in [tool.oipgen.deploy] model_requirements" \
        in text


def test_a_requirements_file_is_read_and_its_changes_make_the_output_stale(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "requirements.txt").write_bytes(
        b"# the models' requirements\r\nscikit-learn>=1.4  # the classifier\r\n\r\nnumpy<2.3\r\n"
        b"pkg @ https://example.com/p-1.zip#sha256=abc\n")
    (_, models_layer), text = _pip_layers(tmp_path, 'model_requirements = "models/requirements.txt"')
    assert _installed_by(models_layer) == ["scikit-learn>=1.4", "numpy<2.3", "pkg @ https://example.com/p-1.zip"
                                           "#sha256=abc", *SERVER_REQUIREMENTS]
    assert "They come from models/requirements.txt; when they change, run `oipgen build`" in text
    assert oipgen("build", "--check", cwd=tmp_path).returncode == 0
    with (models / "requirements.txt").open("a") as f:
        f.write("pandas>=2\n")
    stale = oipgen("build", "--check", cwd=tmp_path)
    assert stale.returncode == 1 and "+        'pandas>=2' \\" in stale.stderr


@pytest.mark.parametrize(("value", "message"), [
    ('["numpy\\rRUN touch /tmp/x"]', "model_requirements[0] 'numpy\\rRUN touch /tmp/x' holds a line break"),
    ('["numpy\\u2028x"]', "holds a line break"),
    ('["-r /etc/passwd"]', "model_requirements[0] '-r /etc/passwd' is a pip option"),
    ('["--index-url=http://example.com/simple"]', "is a pip option"),
    ('["numpy>=1", "not a requirement!"]', "model_requirements[1] 'not a requirement!' is not a requirement"),
    ('["numpy; os_name == \'nt\' or"]', "is not a requirement (PEP 508)"),
    ("[1]", "model_requirements[0] must be a string, got 1"),
    (f'["{"x" * 401}"]', "is longer than 400 characters"),
    ("[" + ", ".join(['"numpy"'] * 201) + "]", "201 requirements, more than 200"),
    ('"missing.txt"', "model_requirements: 'missing.txt' is not a file"),
    ('"models"', "model_requirements: 'models' is not a file"),
    ('"models/requirements.txt"', "models/requirements.txt:2 'torch\\x0b' holds a line break"),
    ('"models/big.txt"', "model_requirements: 'models/big.txt' is larger than 65536 bytes"),
    ('"models/options.txt"', "models/options.txt:1 '--extra-index-url https://example.com' is a pip option"),
    ("{ a = 1 }", "model_requirements must be a list"),
])
def test_hostile_model_requirements_are_refused_before_anything_is_written(tmp_path: Path, value: str,
                                                                         message: str) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "requirements.txt").write_text("numpy\ntorch\v\n")
    (models / "big.txt").write_text("numpy\n" * 20_000)
    (models / "options.txt").write_text("--extra-index-url https://example.com\ntorch\n")
    result = _deploy_table(tmp_path, f"model_requirements = {value}")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "generated").exists()


def test_generated_messages_pickle_as_ray_passes_them_between_processes() -> None:
    from oip.grpc import grpc_service_pb2 as pb

    message = pb.ModelInferRequest(model_name="simple", id="7")
    message.raw_input_contents.append(b"\x01\x02")
    assert type(message).__module__ == "oip.grpc.grpc_service_pb2"
    assert pickle.loads(pickle.dumps(message)) == message


# --- the Containerfile --------------------------------------------------------------------------------------------


def test_the_image_runs_the_server_command_line_as_a_non_root_user() -> None:
    [cmd] = instruction("CMD")
    assert json.loads(cmd) == COMMAND == serve_command("oip", SETTINGS)
    [user] = instruction("USER")
    assert user.isdigit() and int(user) == SETTINGS.uid != 0
    assert instruction("EXPOSE") == [f"{HTTP_PORT} {GRPC_PORT}"]
    [healthcheck] = instruction("HEALTHCHECK")
    assert f"http://127.0.0.1:{HTTP_PORT}/v2/health/ready" in healthcheck
    assert instruction("FROM") == [SETTINGS.base_image]
    assert instruction("COPY") == ["oip /app/oip"]
    installs = [shlex.split(run) for run in instruction("RUN") if "pip install" in run]
    assert len(installs) == 1
    assert sorted(w for w in installs[0] if not w.startswith("-") and w not in ("python", "pip", "install")) == \
        sorted(requirements(resolve(["server"])))
    assert {word for word, _ in containerfile()} <= {"FROM", "ENV", "RUN", "COPY", "WORKDIR", "USER", "EXPOSE",
                                                     "HEALTHCHECK", "STOPSIGNAL", "CMD"}


def healthcheck_command() -> list[str]:
    [healthcheck] = instruction("HEALTHCHECK")
    words: list[str] = json.loads(healthcheck[healthcheck.index("CMD ") + 4:])
    return words


# --- KServe ------------------------------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD's schema as a JSON-schema validator should apply it offline: Kubernetes' int-or-string spelled out,
    and unknown fields refused (the API server prunes them silently) except where the schema keeps them."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


@cache
def schema(kind: str) -> dict[str, Any]:
    name = {"ServingRuntime": "servingruntime-v1alpha1", "InferenceService": "inferenceservice-v1beta1"}[kind]
    document: dict[str, Any] = strict(json.loads(gzip.decompress((SCHEMAS / f"{name}.schema.json.gz").read_bytes())))
    api_version = {"ServingRuntime": "serving.kserve.io/v1alpha1", "InferenceService": "serving.kserve.io/v1beta1"}
    document["properties"]["apiVersion"] = {"const": api_version[kind]}
    document["properties"]["kind"] = {"const": kind}
    document["properties"]["metadata"] = OBJECT_META
    document["required"] = ["apiVersion", "kind", "metadata", "spec"]
    if kind == "ServingRuntime":
        document["properties"]["spec"]["properties"]["protocolVersions"]["items"]["enum"] = PROTOCOL_VERSIONS
    else:
        model = document["properties"]["spec"]["properties"]["predictor"]["properties"]["model"]
        model["properties"]["protocolVersion"]["enum"] = PROTOCOL_VERSIONS
    return document


def problems(manifest: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema(manifest.get("kind", "ServingRuntime")))
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest))


def test_the_schemas_are_kserves_own() -> None:
    runtime = schema("ServingRuntime")["properties"]["spec"]
    assert runtime["required"] == ["containers"]
    assert {"supportedModelFormats", "protocolVersions", "containers", "annotations"} <= set(runtime["properties"])
    predictor = schema("InferenceService")["properties"]["spec"]["properties"]["predictor"]
    model = predictor["properties"]["model"]["properties"]
    assert {"modelFormat", "runtime", "protocolVersion", "storageUri"} <= set(model)


@pytest.mark.parametrize("name", ["kserve/serving-runtime.yaml", "kserve/inference-service.yaml"])
def test_the_kserve_manifests_validate_against_kserves_crd_schemas(name: str) -> None:
    assert problems(_yaml(name)) == []


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda m: m["spec"].__setitem__("suportedModelFormats", m["spec"].pop("supportedModelFormats")),
     "Additional properties are not allowed ('suportedModelFormats' was unexpected)"),
    (lambda m: m["spec"]["protocolVersions"].append("v3"), "'v3' is not one of"),
    (lambda m: m["spec"]["containers"][0]["ports"][1].__setitem__("containerPort", "8081"), "'8081' is not of type"),
    (lambda m: m["spec"]["containers"][0]["readinessProbe"]["httpGet"].__setitem__("pathh", "/"),
     "('pathh' was unexpected)"),
    (lambda m: m["spec"].pop("containers"), "'containers' is a required property"),
    (lambda m: m["metadata"].__setitem__("name", "Oip_Runtime"), "does not match"),
])
def test_the_check_refuses_what_a_cluster_would_refuse_or_drop(edit: Any, expected: str) -> None:
    manifest = copy.deepcopy(_yaml("kserve/serving-runtime.yaml"))
    edit(manifest)
    assert any(expected in p for p in problems(manifest)), problems(manifest)


def test_an_inference_service_with_an_unknown_protocol_or_field_is_refused() -> None:
    service = copy.deepcopy(_yaml("kserve/inference-service.yaml"))
    service["spec"]["predictor"]["model"]["protocolVersion"] = "v2.1"
    service["spec"]["predictor"]["model"]["storageURI"] = "s3://x"
    found = problems(service)
    assert any("'v2.1' is not one of" in p for p in found) and any("'storageURI' was unexpected" in p for p in found)


def test_the_serving_runtime_is_what_kserve_needs_to_run_the_server() -> None:
    spec = _yaml("kserve/serving-runtime.yaml")["spec"]
    assert spec["supportedModelFormats"] == [
        {"name": "oip", "version": "1", "autoSelect": True, "priority": 1}]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"] == {"prometheus.kserve.io/port": str(HTTP_PORT), "prometheus.kserve.io/path": "/metrics"}
    [container] = spec["containers"]
    assert container["name"] == "kserve-container"
    assert container["command"] + container["args"] == COMMAND
    [cmd] = instruction("CMD")
    assert container["command"] + container["args"] == json.loads(cmd)  # the image and the pod run one command
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http1": HTTP_PORT, "h2c": GRPC_PORT}
    assert set(probes(container)) == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/live", "port": HTTP_PORT}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": HTTP_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": HTTP_PORT}
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] == SETTINGS.uid


def probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's probes, by kind: each one's httpGet (the only kind of probe the runtime has)."""
    return {kind: container[kind]["httpGet"] for kind in container if kind.endswith("Probe")}


def test_the_ray_application_serves_on_rays_documented_ports() -> None:
    config = _yaml("ray/serve-config.yaml")
    assert config["http_options"] == {"host": "0.0.0.0", "port": RAY_HTTP_PORT}
    assert config["grpc_options"]["port"] == RAY_GRPC_PORT
    assert config["applications"][0]["args"] == {"model_repository": "/mnt/models"}


def test_the_inference_service_uses_the_runtime_through_predictor_model() -> None:
    service = _yaml("kserve/inference-service.yaml")
    predictor = service["spec"]["predictor"]
    runtime = _yaml("kserve/serving-runtime.yaml")
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"]
    assert predictor["model"]["modelFormat"] == {"name": "oip", "version": "1"}
    assert predictor["model"]["protocolVersion"] == "v2"
    assert predictor["model"]["storageUri"] == defaults("oip")["storage_uri"]
    assert "storageUri" in (DEPLOY / "kserve" / "inference-service.yaml").read_text().split("apiVersion")[0]
    # The shutdown delay and the drain the server is told about end inside the grace period the pod gets.
    args = runtime["spec"]["containers"][0]["args"]
    delay, drain = (float(next(a for a in args if a.startswith(f"--{flag}=")).split("=")[1])
                    for flag in ("shutdown-delay-seconds", "graceful-shutdown-seconds"))
    assert delay > 0 and delay + drain < predictor["terminationGracePeriodSeconds"]


# --- the pod ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why_not = netns.available()
    if why_not:
        pytest.skip(f"no private network namespace for the pod: {why_not}")
    work = tmp_path_factory.mktemp("pod")
    repository = build_repository(work / "models", extra=("slow",), only=("simple",))
    [cmd] = instruction("CMD")
    plan = {
        "command": json.loads(cmd),
        "healthcheck": healthcheck_command(),
        "probes": probes(_yaml("kserve/serving-runtime.yaml")["spec"]["containers"][0]),
        "repository": str(repository),
        "model_dir": "/mnt/models",
        "pythonpath": str(GENERATED),
        "grace_seconds": _yaml("kserve/inference-service.yaml")["spec"]["predictor"]["terminationGracePeriodSeconds"],
        "log": str(work / "server.log"),
    }
    (work / "plan.json").write_text(json.dumps(plan))
    report = netns.run(TESTS / "deploy_pod.py", str(work / "plan.json"), timeout=180)
    report["log"] = (work / "server.log").read_text()
    report["plan"] = plan
    return report


SIMPLE = {"OUTPUT0": [list(range(1, 17))], "OUTPUT1": [list(range(-1, 15))]}


def test_the_pod_runs_the_container_command_word_for_word(pod: dict[str, Any]) -> None:
    [cmd] = instruction("CMD")
    words = json.loads(cmd)
    repository = pod["plan"]["repository"]
    assert pod["command"] == [sys.executable if w == "python" else w.replace("/mnt/models", repository) for w in words]
    assert "--host=0.0.0.0" in pod["command"] and "--http-port=8080" in pod["command"]


def test_the_server_listens_on_every_address_as_a_container_must(pod: dict[str, Any]) -> None:
    assert pod["listening"]["http"] == ["0.0.0.0"]
    assert pod["listening"]["grpc"] and set(pod["listening"]["grpc"]) <= {"0.0.0.0", "::"}
    assert pod["ready_on_127.0.0.2"] == 200  # not only loopback's 127.0.0.1


def test_the_images_healthcheck_fails_before_the_server_and_passes_once_ready(pod: dict[str, Any]) -> None:
    assert pod["healthcheck_before_start"] != 0
    assert pod["healthcheck_when_ready"] == 0


def test_the_pods_probes_pass_once_ready(pod: dict[str, Any]) -> None:
    """The ServingRuntime's startup, readiness and liveness probes, sent as the kubelet sends them, to the running
    server: each one is answered 200 (a probe on another port or path would keep the pod from ever serving)."""
    assert pod["probes_when_ready"] == {"startupProbe": 200, "readinessProbe": 200, "livenessProbe": 200}


def test_the_pod_is_ready_and_answers_over_rest_and_grpc(pod: dict[str, Any]) -> None:
    assert pod["rest_ready"] is True and pod["grpc_live"] is True
    assert pod["rest_infer"] == SIMPLE
    assert pod["grpc_infer"] == SIMPLE


def test_the_pod_serves_metrics_where_the_annotations_point(pod: dict[str, Any]) -> None:
    annotations = _yaml("kserve/serving-runtime.yaml")["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    assert pod["metrics"]["status"] == 200
    assert "text/plain" in pod["metrics"]["type"]
    assert re.search(r"^# TYPE \w+ (counter|gauge|histogram|summary)$", pod["metrics"]["text"], re.M)
    # The pod's two inferences (REST and gRPC), scraped after them under Triton's names.
    text = pod["metrics"]["text"]
    found = re.search(r'^nv_inference_request_success\{model="simple",version="1"\} (\S+)$', text, re.M)
    assert found and float(found[1]) == 2, text


def test_sigterm_drains_the_request_in_flight_and_exits_within_the_grace_period(pod: dict[str, Any]) -> None:
    assert pod["in_flight"]["status"] == 200, pod["log"][-3000:]
    assert pod["in_flight"]["body"]["outputs"][0]["data"] == [7, 8, 9]
    assert pod["exit_code"] == 0, pod["log"][-3000:]
    grace = _yaml("kserve/inference-service.yaml")["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert 1.5 < pod["exit_after_sigterm_s"] < grace  # it waited for the 2 s request, and no longer than allowed
    assert pod["left_behind"] == []


def test_after_sigterm_the_pod_leaves_the_endpoints_while_it_still_answers(pod: dict[str, Any]) -> None:
    """Kubernetes takes the pod out of the Service's endpoints as it sends SIGTERM, and connections already on
    their way still come for a moment: during the shutdown delay the readiness probe fails, the liveness probe
    passes, and a new request is answered; then the server drains and exits."""
    assert pod["probes_while_stopping"] == {"startupProbe": 200, "readinessProbe": 503, "livenessProbe": 200}
    assert pod["infer_while_stopping"] == 200
    assert pod["exit_after_sigterm_s"] >= SETTINGS.shutdown_delay_seconds


# --- the Ray replica's model control, in process (Ray's decorators stood in; test_ray.py runs it on a cluster) ---


def _ray_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The generated Ray application module, imported with a stand-in `ray.serve` whose decorators leave the
    class as it is, so that a replica can be made and driven here."""
    import importlib.util
    import types

    serve = types.ModuleType("ray.serve")

    def deployment(**_: Any) -> Any:
        def bound(cls: Any) -> Any:
            cls.bind = classmethod(lambda c, *args: (c, args))  # what the application builder hands Ray
            return cls
        return bound

    serve.deployment = deployment  # type: ignore[attr-defined]
    serve.ingress = lambda *_: (lambda cls: cls)  # type: ignore[attr-defined]
    ray = types.ModuleType("ray")
    ray.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    spec = importlib.util.spec_from_file_location("oip_ray_under_test", DEPLOY / "ray" / "oip_ray.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _replica(module: Any, repository: Path, settings: dict[str, Any]) -> Any:
    """One replica of the Ray application `module`, made as Ray makes it (its `__init__` is a coroutine)."""
    made = module.Server.__new__(module.Server)
    await made.__init__(str(repository), settings)
    return made


@pytest.mark.filterwarnings("ignore:coroutine .Server.__del__. was never awaited")  # Python's GC: Ray awaits it
def test_a_ray_replica_keeps_the_model_control_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """explicit with load_model loads only the models named; poll reads the repository again in each replica and
    refuses load requests; a mode that does not exist is refused by `build`, before any replica starts."""
    import asyncio

    import httpx

    module = _ray_module(monkeypatch)
    repository = build_repository(tmp_path / "models", only=("simple",))
    spare = build_repository(tmp_path / "spare", only=("identity_fp32",))

    async def status(made: Any, method: str, path: str) -> int:
        transport = httpx.ASGITransport(app=made.__serve_build_asgi_app__())
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
            return (await http.request(method, path)).status_code

    async def scenario() -> None:
        shutil.copytree(spare / "identity_fp32", repository / "identity_fp32")
        explicit = await _replica(module, repository, {"model_control_mode": "explicit", "load_model": ["simple"]})
        try:
            assert await status(explicit, "GET", "/v2/models/simple/ready") == 200
            assert await status(explicit, "GET", "/v2/models/identity_fp32/ready") != 200
            assert await status(explicit, "POST", "/v2/repository/models/identity_fp32/load") == 200
            assert await status(explicit, "GET", "/v2/models/identity_fp32/ready") == 200
        finally:
            await explicit.__del__()
        shutil.rmtree(repository / "identity_fp32")
        polled = await _replica(module, repository, {"model_control_mode": "poll", "repository_poll_secs": 0.2})
        try:
            assert await status(polled, "GET", "/v2/models/identity_fp32/ready") != 200
            assert await status(polled, "POST", "/v2/repository/models/identity_fp32/load") == 503
            shutil.copytree(spare / "identity_fp32", repository / "identity_fp32")  # a model added: polled in
            deadline = time.monotonic() + 20
            while await status(polled, "GET", "/v2/models/identity_fp32/ready") != 200:
                assert time.monotonic() < deadline, "the replica never polled the new model in"
                await asyncio.sleep(0.1)
        finally:
            await polled.__del__()
        assert polled.poller.done()  # stopped with the replica

    asyncio.run(scenario())
    assert module.build({"model_repository": str(repository), "model_control_mode": "poll"})[1][1] == {
        "model_control_mode": "poll"}
    with pytest.raises(ValueError, match="model-control-mode must be one of"):
        module.build({"model_repository": str(repository), "model_control_mode": "sometimes"})


_TOGETHER = """
import threading

from oip.server import Model, TensorSpec

ARRIVED = threading.Barrier({parties}, timeout=10)


class Together(Model):
    inputs = (TensorSpec("IN", "INT32", [1]),)
    outputs = (TensorSpec("OUT", "INT32", [1]),)

    def infer(self, inputs, parameters):
        ARRIVED.wait()  # broken, after its timeout, unless every party runs at once
        return {{"OUT": inputs["IN"]}}
"""


@pytest.mark.filterwarnings("ignore:coroutine .Server.__del__. was never awaited")  # Python's GC: Ray awaits it
def test_a_ray_replica_runs_as_many_plain_infers_at_once_as_model_threads(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """`model_threads` is the replica's count of worker threads: that many plain `infer` calls run at once (each
    waits until all have arrived), more than the loop's own default executor runs (min(32, cores + 4))."""
    import asyncio
    import os

    import httpx

    module = _ray_module(monkeypatch)
    at_once = min(32, (os.cpu_count() or 1) + 4) + 2
    folder = tmp_path / "models" / "together"
    folder.mkdir(parents=True)
    (folder / "model.toml").write_text('class = "model:Together"\n')
    (folder / "model.py").write_text(_TOGETHER.format(parties=at_once))
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [7]}]}

    async def scenario() -> list[httpx.Response]:
        replica = await _replica(module, tmp_path / "models", {"model_threads": at_once})
        try:
            transport = httpx.ASGITransport(app=replica.__serve_build_asgi_app__())
            async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=60) as http:
                return await asyncio.gather(*(http.post("/v2/models/together/infer", json=body)
                                              for _ in range(at_once)))
        finally:
            await replica.__del__()

    answers = asyncio.run(scenario())
    assert [answer.status_code for answer in answers] == [200] * at_once, answers[0].text
    assert {answer.json()["outputs"][0]["data"][0] for answer in answers} == {7}
