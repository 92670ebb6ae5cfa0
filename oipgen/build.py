"""One build: spec -> API model -> targets -> tree (+ manifest). Pure: nothing is written here."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .api import is_safe_identifier
from .output import BESIDE, MANIFEST, Tree, manifest_bytes

# Tools whose output lands in the tree byte for byte: a change of version may change the output.
TOOLS = ("datamodel-code-generator", "grpcio-tools")

@dataclass(frozen=True)
class BuildOptions:
    spec: Path
    out: Path
    package: str
    targets: tuple[str, ...]
    templates: Path | None = None
    # Per-target settings: the tables [tool.oipgen.<target>] of pyproject.toml (deploy: image, names, replicas...).
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dist_name: str | None = None
    dist_version: str | None = None

    @property
    def package_dir(self) -> Path:
        return self.out / self.package


class OptionsError(ValueError):
    pass


_DIST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?")


def validate(opts: BuildOptions) -> None:
    from .targets import PUBLIC, resolve

    if not all(is_safe_identifier(part) for part in opts.package.split(".")) or "." in opts.package:
        raise OptionsError(f"--package {opts.package!r} is not a safe Python package name")
    for t in opts.targets:
        if t != "all" and t not in PUBLIC:
            raise OptionsError(f"unknown target {t!r}; choose from {', '.join((*PUBLIC, 'all'))}")
    if opts.dist_name is not None and not _DIST_NAME.fullmatch(opts.dist_name):
        raise OptionsError(f"dist_name {opts.dist_name!r} is not a valid distribution name (PEP 508)")
    if opts.dist_version is not None and not _VERSION.fullmatch(opts.dist_version):
        raise OptionsError(f"dist_version {opts.dist_version!r} is not a valid version (PEP 440), like 1.2.0")
    if opts.templates is not None and not opts.templates.is_dir():
        raise OptionsError(f"--templates {opts.templates}: no such directory")
    if "deploy" in resolve(list(opts.targets)):
        from .targets.deploy import parse_settings

        try:
            parse_settings(opts.settings.get("deploy", {}), opts.package)
        except ValueError as e:
            raise OptionsError(str(e)) from None


def tool_versions() -> dict[str, str]:
    out = {}
    for tool in TOOLS:
        try:
            out[tool] = importlib.metadata.version(tool)
        except importlib.metadata.PackageNotFoundError:
            out[tool] = "missing"
    return out


def _hash_tree(total: hashlib._Hash, label: str, root: Path) -> None:
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        total.update(f"{label}/{f.relative_to(root).as_posix()}\0".encode())
        total.update(hashlib.sha256(f.read_bytes()).digest())


def inputs_hash(opts: BuildOptions) -> str:
    """A hash of everything the output depends on: spec inputs, templates, options and tool versions."""
    from .load import hash_files, spec_inputs
    from .render import builtin_runtime, template_dirs
    from .targets import resolve

    total = hashlib.sha256()
    total.update(f"oipgen {__version__}\n".encode())
    total.update(f"package {opts.package}\ntargets {','.join(resolve(list(opts.targets)))}\n".encode())
    total.update(f"dist {opts.dist_name or ''} {opts.dist_version or ''}\n".encode())
    for tool, version in sorted(tool_versions().items()):
        total.update(f"{tool} {version}\n".encode())
    _, spec_hash = hash_files(opts.spec, spec_inputs(opts.spec)) if opts.spec.is_dir() else ([], "none")
    total.update(f"spec {spec_hash}\n".encode())
    total.update(f"settings {json.dumps(opts.settings, sort_keys=True, default=str)}\n".encode())
    deploy = opts.settings.get("deploy", {})
    if isinstance(deploy.get("model_requirements"), str):  # the requirements file it names is an input too
        from .targets.deploy import parse_settings

        try:
            found: tuple[str, ...] = parse_settings(deploy, opts.package).model_requirements
        except ValueError as e:
            found = (str(e),)
        total.update(f"model requirements {json.dumps(found)}\n".encode())
    for i, d in enumerate(template_dirs(opts.templates)):
        _hash_tree(total, f"templates{i}", d)
    _hash_tree(total, "runtime", builtin_runtime())
    return total.hexdigest()


def build_tree(opts: BuildOptions) -> Tree:
    """Load the spec and render every requested target into memory, manifest included."""
    from .breaking import recorded_descriptors
    from .load import load_spec
    from .plan import make_plan
    from .render import Renderer, header_lines
    from .targets import Context, build, part_requirements, parts, requirements, resolve

    api = load_spec(opts.spec)
    header = header_lines()
    renderer = Renderer(
        opts.templates,
        {"api": api, "plan": make_plan(api), "package": opts.package, "header": header, "oipgen_version": __version__},
    )
    targets = resolve(list(opts.targets))
    ctx = Context(api=api, package=opts.package, renderer=renderer, header=header, settings=opts.settings,
                  parts=tuple(parts(targets)), dist_name=opts.dist_name, dist_version=opts.dist_version)
    tree = Tree()
    for name in targets:
        build(name, ctx, tree)
    inside = f"{BESIDE}{opts.package}/"
    if any(path.startswith(inside) or path == inside[:-1] for path in tree.files):
        raise RuntimeError(f"a target writes into the package folder through {inside}")
    meta = {
        "@generated": f"by oipgen {__version__}. DO NOT EDIT.",
        "oipgen": __version__,
        "package": opts.package,
        "targets": [t for t in targets if t != "package"],
        "spec_sha256": api.spec_hash,
        "spec_files": {f.path: f.sha256 for f in api.files},
        "inputs_sha256": inputs_hash(opts),
        "tools": tool_versions(),
        "runtime_requirements": requirements(targets),
        "parts": {part: part_requirements(part) for part in parts(targets)},
        # The gRPC descriptors, so that the next build can tell a wire break (oipgen.breaking.build_breaks).
        "descriptors": recorded_descriptors(api),
    }
    tree.add(MANIFEST, manifest_bytes(meta, tree))
    return tree
