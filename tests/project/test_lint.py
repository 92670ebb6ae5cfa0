"""oipgen's own code stays ruff-clean and mypy-strict; the suite runs it so CI holds the line."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import BIN, ROOT
from typecheck import typecheck


def test_ruff() -> None:
    argv = [str(BIN / "ruff"), "check", "oipgen", "tests", "bench"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = subprocess.run([str(BIN / "mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_package_mypy_strict(tmp_path: Path) -> None:
    """The runtime modules and the rendered ones, type-checked together as a fresh build of the sources."""
    result = typecheck(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
