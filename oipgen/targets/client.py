"""Target `client`: REST and gRPC clients, sync and async, rendered from every template under
`templates/client/` over the API model."""

from __future__ import annotations

from ..output import Tree
from . import Context, render_folder


def build(ctx: Context, tree: Tree) -> None:
    render_folder(ctx, tree, "client")
