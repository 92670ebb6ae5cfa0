"""The package itself: `__init__.py` and the PEP 561 marker. Built with every target."""

from __future__ import annotations

from ..output import Tree
from . import Context


def build(ctx: Context, tree: Tree) -> None:
    tree.add("__init__.py", ctx.renderer.render("__init__.py.jinja"))
    tree.add("py.typed", ctx.renderer.render("py.typed.jinja"))
