"""Targets: each one reads the API model and adds files to the generated tree.

A target is a module with `build(ctx, tree)`. Modules are imported only when built, so that checking an
up-to-date tree never imports a generator. What each part of the output needs at run time is listed here, with
the version ranges the suite tests, and goes into the manifest.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from ..api import Api
    from ..output import Tree
    from ..render import Renderer


@dataclass(frozen=True)
class Context:
    api: Api
    package: str
    renderer: Renderer
    header: str
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # [tool.oipgen.<target>] tables
    parts: tuple[str, ...] = ()  # the parts of the package being built (REQUIREMENTS' keys)
    dist_name: str | None = None  # `dist`: the distribution's name and version, when configured
    dist_version: str | None = None


class _TargetModule(Protocol):
    def build(self, ctx: Context, tree: Tree) -> None: ...


# name -> (targets it needs, module). `package` (the package's __init__ and markers) is always built.
TARGETS: dict[str, tuple[tuple[str, ...], str]] = {
    "package": ((), "oipgen.targets.package"),
    "models": (("package",), "oipgen.targets.models"),
    "grpc": (("package", "models"), "oipgen.targets.grpc"),
    "server": (("package", "models", "grpc"), "oipgen.targets.server"),
    "client": (("package", "models", "grpc"), "oipgen.targets.client"),
    "deploy": (("package", "models", "grpc", "server"), "oipgen.targets.deploy"),
    "dist": (("package",), "oipgen.targets.dist"),
}

# The parts of the generated package, each with what its code imports at run time beyond the parts it builds on.
# This is the one place these requirements live: the manifest lists them and `dist` makes them extras.
#   core    models, datatypes, codec, bodies (always there)
#   rest    the REST clients (client/ but client/grpc.py)
#   grpc    the protobuf messages and stubs, convert, the gRPC clients
#   server  the REST + gRPC server, `python -m <package> serve`, the conformance suite
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "core": ("numpy>=1.26,<3", "ml-dtypes>=0.4,<0.6", "pydantic>=2.7,<3", "orjson>=3.10,<4"),
    "rest": ("httpx>=0.27,<1",),
    # The stubs' floors: protoc of grpcio-tools 1.76 writes protobuf 6.31.1 gencode, which checks the runtime
    # is 6.31.1 or newer within major 6 (7 accepts it too), and a grpc stub that wants grpcio 1.76 or newer.
    "grpc": ("protobuf>=6.31.1,<8", "grpcio>=1.76.0,<2"),
    # OpenTelemetry 1.36: its exporters end their retries when the server stops (1.35's gRPC exporter held the
    # stop 6 to 10 s past the graceful shutdown; older exporters need protobuf < 6).
    "server": (
        "fastapi>=0.110,<1", "uvicorn[standard]>=0.29,<1", "httpx>=0.27,<1", "prometheus-client>=0.20,<1",
        "opentelemetry-api>=1.36,<2", "opentelemetry-sdk>=1.36,<2", "opentelemetry-exporter-otlp-proto-http>=1.36,<2",
        "opentelemetry-exporter-otlp-proto-grpc>=1.36,<2",
    ),
}
# The parts each part builds on.
PART_NEEDS: dict[str, tuple[str, ...]] = {"core": (), "rest": ("core",), "grpc": ("core",),
                                          "server": ("core", "grpc")}
# The parts each target's files belong to.
TARGET_PARTS: dict[str, tuple[str, ...]] = {
    "package": (),
    "models": ("core",),
    "grpc": ("grpc",),
    "server": ("server",),
    "client": ("rest", "grpc"),
    "dist": (),
    "deploy": (),  # files beside the package, for the engines that run it; the package does not import them
}
PUBLIC = tuple(t for t in TARGETS if t != "package")
# The runtime's modules at the package's top level belong to `models` (the core part), except these, which the
# target named ships with the part it builds: the conformance runner's engine (httpx and grpc) and the converters'
# rules (protobuf).
TOP_LEVEL_RUNTIME: dict[str, str] = {
    **{f"conformance_{part}.py": "server" for part in (
        "engine", "results", "golden", "protocol", "checks", "inference", "tensors", "report")},
    "convert_base.py": "grpc",
}


def resolve(names: list[str]) -> list[str]:
    """The targets to build for `names` (or `all`), dependencies first, in a fixed order."""
    wanted: set[str] = set()

    def add(name: str) -> None:
        if name in wanted:
            return
        wanted.add(name)
        for dep in TARGETS[name][0]:
            add(dep)

    for name in names:
        for n in PUBLIC if name == "all" else (name,):
            add(n)
    return [t for t in TARGETS if t in wanted]


def parts(targets: list[str]) -> list[str]:
    """The parts of the package the built targets make up, in REQUIREMENTS' order."""
    built = {p for t in targets for p in TARGET_PARTS[t]}
    return [p for p in REQUIREMENTS if p in built]


def part_requirements(part: str) -> list[str]:
    """Everything `part` needs, the parts it builds on included."""
    return sorted({r for p in (*PART_NEEDS[part], part) for r in REQUIREMENTS[p]})


def requirements(targets: list[str]) -> list[str]:
    """Everything the package built from `targets` needs, all parts together."""
    return sorted({r for p in parts(targets) for r in part_requirements(p)})


def render_folder(ctx: Context, tree: Tree, folder: str, extra: tuple[str, ...] = ()) -> None:
    """Copy every runtime module under `folder/` and render every template there (built-in or overridden), plus
    the named `extra` templates that exist, each to the same path without `.jinja`."""
    for rel, source in ctx.renderer.runtime_files(folder).items():
        tree.add(rel, ctx.renderer.copy(source))
    available = ctx.renderer.env.list_templates(extensions=["jinja"])
    names = sorted(t for t in available if t.startswith(f"{folder}/"))
    names += [t for t in extra if t in available]
    from ..bindings import bindings

    plan = {b.schema: b for b in bindings(ctx.api)}
    for name in names:
        tree.add(name.removesuffix(".jinja"), ctx.renderer.render(name, bindings=plan))


def copy_top_level_runtime(ctx: Context, tree: Tree, target: str) -> None:
    """Copy the runtime's top-level modules that belong to `target` (`TOP_LEVEL_RUNTIME`, `models` the rest)."""
    for rel, source in ctx.renderer.runtime_files("").items():
        if TOP_LEVEL_RUNTIME.get(rel, "models") == target:
            tree.add(rel, ctx.renderer.copy(source))


def data_file(payload: dict[str, Any]) -> str:
    """Package data: a JSON document read by the package at import, with the `@generated` mark as its first key.
    Deterministic: keys keep the order of the spec's files, and the formatting is fixed."""
    from .. import __version__

    marked = {"@generated": f"by oipgen {__version__}. DO NOT EDIT.", **payload}
    return json.dumps(marked, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def build(name: str, ctx: Context, tree: Tree) -> None:
    module = cast(_TargetModule, importlib.import_module(TARGETS[name][1]))
    module.build(ctx, tree)
