"""Target `server`: the server (FastAPI for REST, grpcio's thread pool server for gRPC), its data plane and model API,
`python -m <package>`, and the conformance suite: the runtime's `server/` folders copied, every template under
`templates/server/` rendered over the API model beside them (each wing's `__init__` names its rendered modules). The
spec's OpenAPI document (served at /openapi.json) and the golden cases of the conformance suite ship as JSON package
data."""

from __future__ import annotations

from ..output import Tree
from . import Context, copy_top_level_runtime, data_file, render_folder


def build(ctx: Context, tree: Tree) -> None:
    render_folder(ctx, tree, "server", extra=("__main__.py.jinja", "conformance.py.jinja"))
    copy_top_level_runtime(ctx, tree, "server")  # the conformance suite's engine
    tree.add("server/rest/openapi.json", data_file({"document": ctx.api.openapi}))
    cases = [
        {"name": case.name, "summary": case.summary, "operation": case.operation,
         "compare": case.raw.get("compare"), "rest": case.rest, "grpc": case.grpc, "source": case.source}
        for case in ctx.api.examples
    ]
    tree.add("conformance.json", data_file({"models": [m.raw for m in ctx.api.example_models], "cases": cases}))
