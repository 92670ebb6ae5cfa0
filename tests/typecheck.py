"""Type-check the package as it is generated from the current sources, runtime included.

The runtime modules (`oipgen/runtime/`) import generated siblings relatively, so mypy can only check them inside a
built package: build one into a temporary folder and run `mypy --strict` over it. `make lint` and the suite run
this; errors name the package path, which is the runtime path under `oipgen/runtime/` for copied modules.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Stub packages for grpcio's generated code are loosely typed; the package's own code is strict.
MYPY_INI = "[mypy]\nstrict = True\n\n[mypy-oip.grpc.*]\ndisallow_any_generics = False\n"


def typecheck(out: Path) -> subprocess.CompletedProcess[str]:
    build = subprocess.run(
        [str(BIN / "oipgen"), "build", "--target", "all", "--out", str(out), "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if build.returncode != 0:
        return build
    (out / "mypy.ini").write_text(MYPY_INI)
    return subprocess.run(
        [str(BIN / "mypy"), "--cache-dir", str(out / ".mypy_cache"), "-p", "oip"],
        cwd=out, capture_output=True, text=True, timeout=600,
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        result = typecheck(Path(tmp))
    sys.stdout.write(result.stdout + result.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
