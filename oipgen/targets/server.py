"""Target `server`: the FastAPI + grpc.aio server, its data plane and model API, `python -m <package>`, and the
conformance suite, rendered from every template under `templates/server/` over the API model."""

from __future__ import annotations

from ..output import Tree
from . import Context, render_folder


def build(ctx: Context, tree: Tree) -> None:
    render_folder(ctx, tree, "server", extra=("__main__.py.jinja", "conformance.py.jinja"))
