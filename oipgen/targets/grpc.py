"""Target `grpc`: protobuf messages, typed stubs and the gRPC service from grpcio-tools' protoc, and `convert`
(REST bodies and models to protobuf messages and back).

protoc reads the descriptor set held by the API model (not the .proto files again). Its output is adjusted in
two exact ways so the package can be vendored under any name and imported beside other copies of
`package inference` (tritonclient, MLServer, KServe):
- imports of sibling generated modules become relative;
- descriptors go into the package's own descriptor pool (`grpc/_pool.py`) rather than protobuf's default pool,
  where another copy of the same proto would collide. Full names and RPC paths on the wire are unchanged.

Beside the spec's messages it compiles the standard gRPC health service's (`grpc.health.v1`, `health_pb2`: the
runtime's `grpc/health/v1/health.proto`), which the server offers beside the protocol's service.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from ..bindings import all_param_cases, bindings
from ..load_proto import run_protoc
from ..output import Tree
from ..render import builtin_runtime
from . import Context, copy_top_level_runtime

_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_MESSAGES_MODULE = re.compile(r"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'[\w.]+'")
HEALTH_PROTO = "grpc/health/v1/health.proto"  # under the runtime folder; its name in the pool is the standard's


def module_names(ctx: Context) -> list[str]:
    return [f.removesuffix(".proto").replace("/", ".") for f in ctx.api.proto_files]


def build(ctx: Context, tree: Tree) -> None:
    modules = module_names(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = Path(tmp) / "spec.pb"
        descriptor_set.write_bytes(ctx.api.descriptor_set)
        produced = _protoc([f"--descriptor_set_in={descriptor_set}", *ctx.api.proto_files], stubs=True)
    sibling = re.compile(rf"^import ({'|'.join(re.escape(m + '_pb2') for m in modules)}) as (\w+)$", re.M)
    for rel, text in produced.items():
        if rel.endswith("_pb2_grpc.py") and rel != f"{ctx.api.service_module}_pb2_grpc.py":
            continue  # protoc writes one for every file, even those without a service
        text = sibling.sub(r"from . import \1 as \2", text)
        if rel.endswith("_pb2.py"):
            text = _private(rel, text)
        tree.add(f"grpc/{rel}", f"{ctx.header}\n{text.rstrip()}\n")
    # The health service's messages only: the server registers its methods itself (`server/grpc/health`).
    health = _protoc([f"-I{builtin_runtime()}", HEALTH_PROTO])
    for rel, text in health.items():
        if rel.endswith("_pb2.py"):
            text = _private(rel, text)
        tree.add(f"grpc/{Path(rel).name}", f"{ctx.header}\n{text.rstrip()}\n")
    tree.add("grpc/_pool.py", ctx.renderer.render("grpc/_pool.py.jinja"))
    for rel, source in ctx.renderer.runtime_files("grpc").items():  # wire
        tree.add(rel, ctx.renderer.copy(source))
    copy_top_level_runtime(ctx, tree, "grpc")  # convert_base
    tree.add("grpc/__init__.py", ctx.renderer.render("grpc/__init__.py.jinja", modules=modules))
    # grpcio-tools types the messages only; the service's stub is rendered from the API model.
    tree.add(f"grpc/{ctx.api.service_module}_pb2_grpc.pyi", ctx.renderer.render("grpc/service_pb2_grpc.pyi.jinja"))
    tree.add(
        "convert.py",
        ctx.renderer.render(
            "convert.py.jinja", bindings=bindings(ctx.api), param_cases=all_param_cases(ctx.api), modules=modules
        ),
    )


def _protoc(args: list[str], stubs: bool = False) -> dict[str, str]:
    """protoc's Python messages and their types (with `stubs`, its gRPC stubs too), by path."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        wanted = [f"--python_out={out}", f"--pyi_out={out}", *([f"--grpc_python_out={out}"] if stubs else [])]
        rc, err = run_protoc([*wanted, *args])
        if rc != 0:
            raise RuntimeError(f"protoc failed: {err.strip()}")
        return {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.py*"))}


def _private(rel: str, text: str) -> str:
    """A `_pb2` module whose descriptors go into the package's pool, its messages naming their real module."""
    if text.count(_DEFAULT_POOL) != 1:
        raise RuntimeError(f"unexpected protoc output in {rel}: cannot place it in the private pool")
    text = text.replace(_DEFAULT_POOL, "_pool.POOL.AddSerializedFile(")
    # Message classes name their real module (`oip.grpc.grpc_service_pb2`, wherever the package is vendored)
    # rather than the bare file name, so that messages pickle: Ray, multiprocessing.
    text, count = _MESSAGES_MODULE.subn(r"\1__name__", text)
    if count != 1:
        raise RuntimeError(f"unexpected protoc output in {rel}: cannot name the messages' module")
    return text.replace(
        "from google.protobuf import descriptor_pool as _descriptor_pool\n",
        "from . import _pool\n",
    )
