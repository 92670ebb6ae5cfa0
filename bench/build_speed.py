"""`make bench-build`: how long oipgen takes, beside the floor measured in the same run.

- cold build: `oipgen build --target all` into an empty directory, in a new process;
- check: `oipgen build --check` on an up-to-date tree, in a new process;
- floor: the two generators oipgen drives, run the plain way on the same spec in new processes:
  `datamodel-codegen` (same options, builtin formatter) plus `python -m grpc_tools.protoc` (python, grpc, pyi).

Each figure is the median of several runs after a warm-up run. Targets: build within 2x the floor; check under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def median_of(runs: int, setup, argv_for) -> tuple[float, list[float]]:  # type: ignore[no-untyped-def]
    times = []
    for i in range(runs + 1):
        cwd = setup()
        t = timed(argv_for(cwd), cwd)
        if i:  # the first run warms the file cache
            times.append(t)
    return statistics.median(times), times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    spec = ROOT / "spec"
    scratch = Path(tempfile.mkdtemp(prefix="oipgen-bench-"))
    try:
        def fresh() -> Path:
            d = scratch / "cold"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            return d

        build, build_runs = median_of(args.runs, fresh, lambda d: [
            str(BIN / "oipgen"), "build", "--target", "all", "--spec", str(spec), "--out", str(d), "--quiet"])

        current = scratch / "current"
        subprocess.run([str(BIN / "oipgen"), "build", "--spec", str(spec), "--out", str(current), "--quiet"],
                       check=True)
        check, check_runs = median_of(args.runs, lambda: current, lambda d: [
            str(BIN / "oipgen"), "build", "--check", "--spec", str(spec), "--out", str(d), "--quiet"])

        def floor_argv(d: Path) -> list[str]:
            return [str(BIN / "datamodel-codegen"), "--input", str(spec / "openapi.yaml"), "--input-file-type",
                    "openapi", "--output", str(d / "models.py"), "--output-model-type", "pydantic_v2.BaseModel",
                    "--target-python-version", "3.11", "--use-annotated", "--field-constraints",
                    "--use-standard-collections", "--use-union-operator", "--use-type-alias",
                    "--disable-timestamp", "--formatters", "builtin"]

        def protoc_argv(d: Path) -> list[str]:
            protos = [p.name for p in sorted(spec.glob("*.proto"))]
            return [sys.executable, "-m", "grpc_tools.protoc", f"-I{spec}", f"--python_out={d}",
                    f"--grpc_python_out={d}", f"--pyi_out={d}", *protos]

        dcg, dcg_runs = median_of(args.runs, fresh, floor_argv)
        protoc, protoc_runs = median_of(args.runs, fresh, protoc_argv)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    floor = dcg + protoc
    rows = [
        ("oipgen build --target all (cold)", build, f"{build / floor:.2f}x the floor (target <= 2x)"),
        ("oipgen build --check (up to date)", check, f"target < 0.30 s: {'met' if check < 0.3 else 'NOT met'}"),
        ("floor: datamodel-codegen", dcg, ""),
        ("floor: python -m grpc_tools.protoc", protoc, ""),
        ("floor: both", floor, ""),
    ]
    print(f"median of {args.runs} runs each, after one warm-up run; new process per run\n")
    print(f"| {'what':36} | seconds | note |")
    print(f"| {'-' * 36} | ------- | ---- |")
    for what, seconds, note in rows:
        print(f"| {what:36} | {seconds:7.3f} | {note} |")
    if args.json:
        args.json.write_text(json.dumps({
            "build": build_runs, "check": check_runs, "datamodel_codegen": dcg_runs, "protoc": protoc_runs,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
