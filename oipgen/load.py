"""Read a spec directory into the one API model (`oipgen.api.Api`), or report every problem found."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from .api import Api, Datatype, Example, ExampleModel, Operation, RestOperation, SpecFile, is_safe_identifier
from .check import check_api
from .load_openapi import load_openapi
from .load_proto import load_protos
from .problems import Problems

OPENAPI_FILE = "openapi.yaml"
DATATYPES_FILE = "datatypes.yaml"
EXAMPLES_DIR = "examples"
MODELS_FILE = "models.yaml"


def spec_inputs(spec_dir: Path) -> list[Path]:
    """Every file the loader reads, in a stable order: what the spec hash covers."""
    files = [*spec_dir.glob("*.proto"), spec_dir / OPENAPI_FILE, spec_dir / DATATYPES_FILE]
    files += (spec_dir / EXAMPLES_DIR).glob("*.yaml")
    return sorted((f for f in files if f.is_file()), key=lambda p: p.relative_to(spec_dir).as_posix())


def hash_files(root: Path, files: list[Path]) -> tuple[list[SpecFile], str]:
    entries: list[SpecFile] = []
    total = hashlib.sha256()
    for f in files:
        rel = f.relative_to(root).as_posix()
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        entries.append(SpecFile(rel, digest))
        total.update(f"{rel}\0{digest}\n".encode())
    return entries, total.hexdigest()


def _read_yaml(path: Path, problems: Problems) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.add(str(path), "", "file not found")
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        problems.add(str(path), "", f"not valid YAML: {e}".replace("\n", " "))
    return None


def load_spec(spec_dir: Path) -> Api:
    """Load and cross-check a spec; raises `SpecError` listing every problem."""
    spec_dir = Path(spec_dir)
    problems = Problems()
    if not spec_dir.is_dir():
        problems.add(str(spec_dir), "", "spec directory not found")
        problems.raise_if_any()

    protos = load_protos(spec_dir, problems)
    openapi_path = spec_dir / OPENAPI_FILE
    openapi = load_openapi(str(openapi_path), _read_yaml(openapi_path, problems), problems)
    datatypes = _datatypes(spec_dir / DATATYPES_FILE, problems)
    models = _example_models(spec_dir / EXAMPLES_DIR / MODELS_FILE, problems)
    examples = _examples(spec_dir / EXAMPLES_DIR, problems)
    if protos is None or openapi is None:
        problems.raise_if_any()
    assert protos is not None and openapi is not None

    by_rpc = {rpc.name: rpc for rpc in protos.rpcs}
    operations: list[Operation] = []
    for rpc in protos.rpcs:
        rest = tuple(ep for name, ep in openapi.endpoints if name == rpc.name)
        operations.append(Operation(rpc, rest, openapi.grpc_only.get(rpc.name)))
    for name, ep in openapi.endpoints:
        if name not in by_rpc:
            problems.add(str(openapi_path), f"paths/{ep.path}/{ep.method.lower()}",
                         f"x-oip-rpc names {name!r}, which is not an RPC of service {protos.service}")
    rest_only = openapi.rest_only or {}
    rest_operations = tuple(
        RestOperation(name, tuple(ep for n, ep in openapi.rest_endpoints if n == name), reason)
        for name, reason in rest_only.items()
    )
    for name, ep in openapi.rest_endpoints:
        if name not in rest_only:
            problems.add(str(openapi_path), f"paths/{ep.path}/{ep.method.lower()}",
                         f"x-oip-operation names {name!r}, which x-oip-rest-only does not list")

    files, spec_hash = hash_files(spec_dir, spec_inputs(spec_dir))
    api = Api(
        proto_package=protos.package,
        service=protos.service,
        service_module=protos.service_module,
        files=tuple(files),
        spec_hash=spec_hash,
        datatypes=datatypes,
        messages=protos.messages,
        enums=protos.enums,
        rpcs=protos.rpcs,
        operations=tuple(operations),
        schemas=openapi.schemas,
        examples=examples,
        example_models=models,
        proto_files=protos.files,
        descriptor_set=protos.descriptor_set,
        openapi=openapi.doc,
        info=dict(openapi.doc.get("info") or {}),
        tags=openapi.tags,

        rest_operations=rest_operations,
    )
    check_api(api, spec_dir, problems)
    problems.raise_if_any()
    return api


def load_datatypes(spec_dir: Path) -> tuple[Datatype, ...]:
    """The datatype table of a spec alone; raises `SpecError` when it cannot be read."""
    problems = Problems()
    datatypes = _datatypes(Path(spec_dir) / DATATYPES_FILE, problems)
    problems.raise_if_any()
    return datatypes


def _datatypes(path: Path, problems: Problems) -> tuple[Datatype, ...]:
    data = _read_yaml(path, problems)
    rows = data.get("datatypes") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        if data is not None:
            problems.add(str(path), "datatypes", "expected a non-empty list")
        return ()
    out: list[Datatype] = []
    for i, row in enumerate(rows):
        where = f"datatypes[{i}]"
        try:
            dt = Datatype(
                name=str(row["name"]),
                size=int(row["size"]),
                numpy=str(row["numpy"]),
                contents=None if row.get("contents") is None else str(row["contents"]),
                json=bool(row["json"]),
                model_config=str(row["model_config"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            problems.add(str(path), where, f"incomplete datatype row ({e})")
            continue
        if dt.name in {d.name for d in out}:
            problems.add(str(path), where, f"datatype {dt.name} is listed twice")
        out.append(dt)
    return tuple(out)


def _example_models(path: Path, problems: Problems) -> tuple[ExampleModel, ...]:
    data = _read_yaml(path, problems)
    rows = data.get("models") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        if data is not None:
            problems.add(str(path), "models", "expected a list of models")
        return ()
    out: list[ExampleModel] = []
    for i, row in enumerate(rows):
        try:
            out.append(
                ExampleModel(
                    name=str(row["name"]),
                    behaviour=str(row["behaviour"]),
                    platform=str(row.get("platform", "")),
                    versions=tuple(str(v) for v in row.get("versions") or ()),
                    inputs=tuple(row["inputs"]),
                    outputs=tuple(row["outputs"]),
                    raw=row,
                )
            )
        except (KeyError, TypeError) as e:
            problems.add(str(path), f"models[{i}]", f"incomplete model ({e})")
    return tuple(out)


def _examples(folder: Path, problems: Problems) -> tuple[Example, ...]:
    out: list[Example] = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name == MODELS_FILE:
            continue
        data = _read_yaml(path, problems)
        if data is None:
            continue
        if not isinstance(data, dict):
            problems.add(str(path), "", "a case must be a mapping")
            continue
        name = data.get("name")
        if name != path.stem or not is_safe_identifier(str(name)):
            problems.add(str(path), "name", f"must equal the file name and be a safe identifier, not {name!r}")
            continue
        if not isinstance(data.get("operation"), str):
            problems.add(str(path), "operation", "must name the RPC the case exercises")
            continue
        rest, grpc = data.get("rest"), data.get("grpc")
        if rest is None and grpc is None:
            problems.add(str(path), "", "a case needs a rest or a grpc part")
            continue
        out.append(
            Example(
                name=str(name),
                summary=str(data.get("summary", "")),
                source=str(data.get("source", "")),
                operation=data["operation"],
                rest=rest if isinstance(rest, dict) else None,
                grpc=grpc if isinstance(grpc, dict) else None,
                raw=data,
            )
        )
    return tuple(out)
