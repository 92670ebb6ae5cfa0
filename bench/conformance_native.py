"""The example models of spec/examples/models.yaml in each server's own native form, for bench/conformance_matrix.py.

Each entry of models.yaml (name, tensors, versions, behaviour: identity, add_sub or words) becomes:
- oipgen: examples/models as it is (every entry, written by hand);
- Triton 2.51: a folder per model, `config.pbtxt` (its tensors in Triton's types, `max_batch_size: 0` so shapes
  are full shapes, the behaviour as a parameter, `model_transaction_policy { decoupled: true }` for `words`) and
  `1/model.py`, the one Python-backend model of bench/servers/conformance/triton_model.py;
- MLServer 1.7.1: `settings.json`, a folder per model with `model-settings.json` (its tensors, platform, version
  and behaviour) and the one MLModel of bench/servers/conformance/mlserver_models.py;
- KServe 0.21.0: bench/servers/conformance/kserve_server.py with `models.json`, the entries it can serve.

CANNOT says which models a server cannot express, and why; those are not written, and the golden cases that need
them are NOT APPLICABLE on that server.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "bench" / "servers" / "conformance"
EXAMPLES = ROOT / "examples" / "models"

CANNOT: dict[str, dict[str, str]] = {
    "oipgen": {},
    "triton": {},
    "mlserver": {
        "identity_bf16": "MLServer 1.7.1 has no BF16 datatype: its Datatype enum (and so its metadata and request "
        "validation) stops at BYTES",
    },
    "kserve": {
        "identity_bf16": "KServe 0.21.0 has no BF16 datatype: its numpy codec knows no bfloat16, so neither "
        "metadata nor tensors can carry one",
        "text_stream": "KServe 0.21.0's V2 data plane has no decoupled model (one request, many responses): no "
        "ModelStreamInfer, no generate_stream; its streaming endpoints are the OpenAI ones of its LLM runtimes",
    },
}


def _pbtxt_tensors(kind: str, tensors: Sequence[dict[str, Any]], types: dict[str, str]) -> str:
    items = ",\n".join(
        f'  {{ name: "{t["name"]}", data_type: {types[t["datatype"]]}, dims: [ {", ".join(map(str, t["shape"]))} ] }}'
        for t in tensors
    )
    return f"{kind} [\n{items}\n]"


def triton(models: Sequence[dict[str, Any]], root: Path, types: dict[str, str]) -> None:
    """Triton's model repository: config.pbtxt and 1/model.py per model (`types`: datatype -> TYPE_* name)."""
    for model in models:
        folder = root / model["name"]
        lines = [
            f'# {model["summary"]}',
            f'name: "{model["name"]}"',
            'backend: "python"',
            "max_batch_size: 0",
            _pbtxt_tensors("input", model["inputs"], types),
            _pbtxt_tensors("output", model["outputs"], types),
            f'parameters: {{ key: "behaviour" value: {{ string_value: "{model["behaviour"]}" }} }}',
            "instance_group [ { count: 1, kind: KIND_CPU } ]",
        ]
        if model.get("decoupled"):
            lines.append("model_transaction_policy { decoupled: true }")
        for version in model["versions"]:
            (folder / version).mkdir(parents=True)
            shutil.copy(NATIVE / "triton_model.py", folder / version / "model.py")
        (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")


def mlserver(models: Sequence[dict[str, Any]], root: Path) -> None:
    """MLServer's folder: settings.json, the shared MLModel, and model-settings.json per model."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(json.dumps({"debug": False, "parallel_workers": 0}, indent=2) + "\n")
    shutil.copy(NATIVE / "mlserver_models.py", root / "mlserver_models.py")
    for model in models:
        (root / model["name"]).mkdir()
        settings = {
            "name": model["name"],
            "implementation": "mlserver_models.Example",
            "platform": model["platform"],
            "versions": model["versions"],
            "inputs": model["inputs"],
            "outputs": model["outputs"],
            "parameters": {"version": model["versions"][0], "extra": {"behaviour": model["behaviour"]}},
        }
        (root / model["name"] / "model-settings.json").write_text(json.dumps(settings, indent=2) + "\n")


def kserve(models: Sequence[dict[str, Any]], root: Path) -> None:
    """KServe's folder: its server script and the entries it serves (models.json)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(NATIVE / "kserve_server.py", root / "kserve_server.py")
    (root / "models.json").write_text(json.dumps(list(models), indent=2) + "\n")


def oipgen(models: Sequence[dict[str, Any]], root: Path) -> None:
    """Ours: a copy of examples/models (so that importing the models writes nothing into the tree)."""
    for model in models:
        shutil.copytree(EXAMPLES / model["name"], root / model["name"], ignore=shutil.ignore_patterns("__pycache__"))


def write(server: str, models: Sequence[dict[str, Any]], root: Path, types: dict[str, str]) -> list[str]:
    """Write `server`'s native repository of `models` (less those it cannot express) into `root`; the names of the
    models written."""
    chosen = [m for m in models if m["name"] not in CANNOT[server]]
    writers: dict[str, Callable[[Sequence[dict[str, Any]], Path], None]] = {
        "oipgen": oipgen, "mlserver": mlserver, "kserve": kserve,
        "triton": lambda ms, folder: triton(ms, folder, types),
    }
    root.mkdir(parents=True, exist_ok=True)
    writers[server](chosen, root)
    return [m["name"] for m in chosen]
