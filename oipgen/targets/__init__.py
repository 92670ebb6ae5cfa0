"""Targets: each one reads the API model and adds files to the generated tree.

A target is a module with `FILES_DOC` (one line on what it writes) and `build(ctx, tree)`. Modules are imported
only when built, so that checking an up-to-date tree never imports a generator.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

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


class _TargetModule(Protocol):
    def build(self, ctx: Context, tree: Tree) -> None: ...


# name -> (targets it needs, module). `package` (the package's __init__ and markers) is always built.
TARGETS: dict[str, tuple[tuple[str, ...], str]] = {
    "package": ((), "oipgen.targets.package"),
    "models": (("package",), "oipgen.targets.models"),
    "grpc": (("package", "models"), "oipgen.targets.grpc"),
}
PUBLIC = tuple(t for t in TARGETS if t != "package")


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


def build(name: str, ctx: Context, tree: Tree) -> None:
    module = cast(_TargetModule, importlib.import_module(TARGETS[name][1]))
    module.build(ctx, tree)
