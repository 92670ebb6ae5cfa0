"""Target `server`: the FastAPI + grpc.aio server, its data plane and model API, `python -m <package>`, and the
conformance suite, rendered from every template under `templates/server/` over the API model."""

from __future__ import annotations

from ..bindings import bindings
from ..output import Tree
from . import Context

_EXTRA = ("__main__.py.jinja", "conformance.py.jinja")


def build(ctx: Context, tree: Tree) -> None:
    names = sorted(t for t in ctx.renderer.env.list_templates(extensions=["jinja"]) if t.startswith("server/"))
    names += [t for t in _EXTRA if t in ctx.renderer.env.list_templates(extensions=["jinja"])]
    plan = {b.schema: b for b in bindings(ctx.api)}
    for name in names:
        tree.add(name.removesuffix(".jinja"), ctx.renderer.render(name, bindings=plan))
