"""The Makefile: `make help` describes every target, and a smoke benchmark never writes the committed results."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_make_help_lists_every_target_with_its_description() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE)
    assert {"build", "test", "serve", "docs", "dist", "help"} <= set(targets)
    result = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    described = dict(re.findall(r"^  make (\S+) +(\S.*)$", result.stdout, re.MULTILINE))
    assert sorted(described) == sorted(targets), result.stdout
    # each description is the first line of the target's `## target:` comment, whole
    for target, text in described.items():
        assert f"## {target}: {text}\n" in makefile, target
    # and a plain `make` is help, not a build
    plain = subprocess.run(["make", "--no-print-directory", "-n"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert plain.stdout.startswith("awk "), plain.stdout


def test_a_quick_benchmark_writes_to_a_scratch_folder(tmp_path: Path) -> None:
    """`make bench BENCH_ARGS=--quick` reports into bench/.work/quick (git-ignored); only a full run writes the
    committed bench/results; --out still wins."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    run = importlib.import_module("run")  # bench/run.py, beside the modules it imports as siblings
    assert Path(run.__file__).resolve() == ROOT / "bench" / "run.py"
    assert run.parse_args(["--quick"]).out == (ROOT / "bench" / ".work" / "quick").resolve()
    assert run.parse_args([]).out == (ROOT / "bench" / "results").resolve()
    assert run.parse_args(["--quick", "--out", str(tmp_path)]).out == tmp_path.resolve()
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/.work/quick/results.md"], cwd=ROOT)
    assert ignored.returncode == 0
