"""Shared fixtures. The generated package `oip` is imported from generated/, as a vendored copy would be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec"
GENERATED = ROOT / "generated"
BIN = Path(sys.executable).parent

if str(GENERATED) not in sys.path:
    sys.path.insert(0, str(GENERATED))


def oipgen(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `oipgen` command as a user would."""
    return subprocess.run(
        [str(BIN / "oipgen"), *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="session")
def api():  # type: ignore[no-untyped-def]
    from oipgen.load import load_spec

    return load_spec(SPEC)
