"""Small extra specs, each spec/ with one change, so generation is tested beyond the one spec, and their goldens.

- `rpc_added`: an RPC `ServerLiveAgain` and its REST operation (`GET /v2/health/live_again`).
- `extension_removed`: the `cuda_shared_memory` extension gone: its tag, its three RPCs and its REST operations.
- `renamed_package`: the proto package `inference` renamed `acme.serving` (RPC paths change, field numbers do not).
- `grpc_only_added`: a gRPC-only RPC `WhoAmI` with messages of its own (`x-oip-grpc-only`), served by a data plane
  subclass (`serve --dataplane`, tests/server/core/test_dataplane_option.py).

A variant's golden is `tests/specs/<name>.diff`: the unified diff from the main golden record (`generated/oip`)
to the variant's build, every file (the manifest aside, whose hashes follow from the rest). A file the diff does
not name must be byte-identical to the main record's. `python tests/specs/variants.py` (run by `make goldens`)
rewrites the diffs after a change to spec/, templates/ or oipgen/.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SPEC = ROOT / "spec"
GENERATED = ROOT / "generated" / "oip"
MANIFEST = "_oipgen_manifest.json"  # derived from the inputs' hashes: not part of a variant's golden


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    if old not in text:
        raise ValueError(f"{path.name}: the anchor {old[:60]!r} is gone; update tests/specs/variants.py")
    path.write_text(text.replace(old, new), encoding="utf-8")


def _between(path: Path, start: str, end: str) -> None:
    """Remove the text from `start` up to (not including) the next `end`."""
    text = path.read_text(encoding="utf-8")
    i, j = text.find(start), text.find(end, text.find(start) + 1)
    if i < 0 or j < 0:
        raise ValueError(f"{path.name}: the anchors {start[:40]!r} .. {end[:40]!r} are gone")
    path.write_text(text[:i] + text[j:], encoding="utf-8")


def rpc_added(spec: Path) -> None:
    line = "  rpc ServerLive(ServerLiveRequest) returns (ServerLiveResponse) {}\n"
    added = "\n  // Liveness, again.\n  rpc ServerLiveAgain(ServerLiveRequest) returns (ServerLiveResponse) {}\n"
    _replace(spec / "grpc_service.proto", line, line + added)
    anchor = "\n  /v2/health/live:\n"
    operation = textwrap.indent(textwrap.dedent("""\
        /v2/health/live_again:
          get:
            operationId: server_live_again
            x-oip-rpc: ServerLiveAgain
            tags: [health]
            summary: Liveness, again.
            responses:
              '200':
                description: The server is live.
                content:
                  application/json:
                    schema:
                      $ref: '#/components/schemas/ServerLiveResponse'
        """), "  ")
    _replace(spec / "openapi.yaml", anchor, "\n" + operation + anchor[1:])


def extension_removed(spec: Path) -> None:
    proto = spec / "grpc_service.proto"
    _between(proto, "\n  // Registered CUDA shared-memory regions (CUDA shared memory extension).", "\n}\n")
    _replace(proto, "      returns (SystemSharedMemoryUnregisterResponse) {}\n\n}\n",
             "      returns (SystemSharedMemoryUnregisterResponse) {}\n}\n")
    openapi = spec / "openapi.yaml"
    _between(openapi, "  # -" + "-" * 52 + " CUDA shared memory\n", "\ncomponents:\n")
    _between(openapi, "    CudaSharedMemoryRegionStatus:\n", "    Base64Bytes:\n")
    # The document ends with Base64Bytes and CudaSharedMemoryRegisterRequest, the CUDA register body and its part.
    text = openapi.read_text(encoding="utf-8")
    tail = text[text.index("    Base64Bytes:\n"):]
    if tail.count("x-oip-message:") != 1 or "CudaSharedMemoryRegisterRequest" not in tail:
        raise ValueError("openapi.yaml no longer ends with the CUDA register schemas; update tests/specs/variants.py")
    openapi.write_text(text[:-len(tail)].rstrip("\n") + "\n", encoding="utf-8")
    _replace(openapi, "  - name: cuda_shared_memory\n    x-oip-extension: true\n"
                      "    description: CUDA shared memory extension (extension string `cuda_shared_memory`).\n", "")


def renamed_package(spec: Path) -> None:
    for name in ("grpc_service.proto", "model_config.proto"):
        _replace(spec / name, "package inference;", "package acme.serving;")
    text = (spec / "openapi.yaml").read_text(encoding="utf-8")
    for key in ("x-oip-message: inference.", "x-oip-map-value: inference."):
        text = text.replace(key, key.replace("inference.", "acme.serving."))
    (spec / "openapi.yaml").write_text(text, encoding="utf-8")


WHOAMI_RPC = """
  // Which server process answers this connection, and with which data plane.
  rpc WhoAmI(WhoAmIRequest) returns (WhoAmIResponse) {}
"""
WHOAMI_MESSAGES = """
message WhoAmIRequest {}

message WhoAmIResponse {
  // The process that answered.
  int64 pid = 1;
  // The class of its data plane.
  string plane = 2;
}
"""


def grpc_only_added(spec: Path) -> None:
    proto = spec / "grpc_service.proto"
    line = "  rpc ServerLive(ServerLiveRequest) returns (ServerLiveResponse) {}\n"
    _replace(proto, line, line + WHOAMI_RPC)
    proto.write_text(proto.read_text(encoding="utf-8") + WHOAMI_MESSAGES, encoding="utf-8")
    _replace(spec / "openapi.yaml", "\nx-oip-grpc-only:\n",
             "\nx-oip-grpc-only:\n  WhoAmI: A question about the process one connection reaches, for gRPC alone.\n")


VARIANTS: dict[str, Callable[[Path], None]] = {
    "rpc_added": rpc_added,
    "extension_removed": extension_removed,
    "renamed_package": renamed_package,
    "grpc_only_added": grpc_only_added,
}


def make_spec(name: str, dest: Path) -> Path:
    """A copy of spec/ with the variant's change, at `dest`."""
    shutil.copytree(SPEC, dest)
    VARIANTS[name](dest)
    return dest


def build(name: str, work: Path, package: str = "oip") -> Path:
    """Build the variant into `work/out/<package>` (with this checkout's oipgen); the package directory."""
    spec = make_spec(name, work / "spec")
    result = subprocess.run(
        [sys.executable, "-m", "oipgen", "build", "-q", "--spec", str(spec), "--out", str(work / "out"),
         "--package", package],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the {name} variant failed:\n{result.stdout}{result.stderr}")
    return work / "out" / package


def files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.name != MANIFEST
    }


def diff(main: dict[str, str], built: dict[str, str]) -> str:
    """The unified diff from `main` to `built`, file by file in path order (deterministic)."""
    out: list[str] = []
    for rel in sorted(set(main) | set(built)):
        before, after = main.get(rel), built.get(rel)
        if before == after:
            continue
        out += difflib.unified_diff(
            (before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if before is not None else "/dev/null",
            tofile=f"b/{rel}" if after is not None else "/dev/null",
        )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


def golden_path(name: str) -> Path:
    return HERE / f"{name}.diff"


def refresh() -> None:
    main = files(GENERATED)
    for name in VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            text = diff(main, files(build(name, Path(tmp))))
        golden_path(name).write_text(text, encoding="utf-8")
        print(f"  {golden_path(name).relative_to(ROOT)}: {text.count(chr(10))} lines")


if __name__ == "__main__":
    refresh()
