"""Our server against itself: two builds or settings of it (A and B) on one workload, in paired turns, so that a
change of a few percent can be told from this host's drift.

On a shared 2-core machine the speed of a core drifts by more than most changes are worth (10-15% between two
windows a minute apart), so two servers measured one after the other compare the host's moments as much as the
servers. Here both sides are up at once (idle but for their turn, both on the server CPU) and take turns in short
windows, round after round, every other round B first; each round gives a paired ratio B/A (throughput, server CPU
per inference) taken seconds apart. The report: each side's medians and the median, spread and sign of the paired
ratios. An A/A run (the same build on both sides) shows how far the ratios stray when nothing differs.

A side is a build and a way of starting it: `--a-package DIR` / `--b-package DIR` (a folder holding an `oip`
package, such as another checkout's generated/; default: this checkout's), `--a-env KEY=VALUE` / `--b-env ...`
(repeatable) and `--a-serve "FLAGS"` / `--b-serve "FLAGS"` (flags of `python -m oip serve`). What each server saw is
recorded: its `GET /v2` answer and, of the variables given, the values in its own environment (/proc).

    python bench/ab.py simple_grpc -c 8 [--rounds 8] [-d 3] [-w 1] --b-env GRPC_EXPERIMENTS=...
    python bench/ab.py text_rest_json -c 8 --a-package /tmp/base/generated      # the base commit's build as A
    python bench/ab.py text_grpc -c 1 --perf-analyzer --a-package /tmp/base/generated

With `--perf-analyzer` each turn is a perf_analyzer measurement (sync mode, three windows of `-d` seconds, pinned
to the client CPU, as `make bench` runs it) instead of bench/loadgen.py: a lighter client, so that a change to the
server's share of the latency (at c=1, say) shows; the server CPU per inference is its CPU over the turn divided
by the inferences its statistics extension counted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
import pa
import run
import servers
from servers import BENCH

SIDES = ("A", "B")


@dataclass
class Side:
    name: str
    package: Path | None
    env: dict[str, str]
    options: tuple[str, ...]

    def describe(self) -> str:
        parts = [f"package {self.package}" if self.package else "this checkout's build"]
        parts += [f"{key}={value}" for key, value in self.env.items()]
        if self.options:
            parts.append(shlex.join(self.options))
        return ", ".join(parts)


def _environ(pid: int, keys: list[str]) -> dict[str, str | None]:
    """The values of `keys` in process `pid`'s environment (None: not set)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return dict.fromkeys(keys)
    found = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key: (found[key.encode()].decode() if key.encode() in found else None) for key in keys}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def compare(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The summary of paired rounds (each: side -> loadgen result): each side's medians, and the paired ratios
    B/A of throughput and of server CPU per inference (median, lowest, highest, rounds where B did better)."""
    summary: dict[str, Any] = {}
    for side in SIDES:
        good = [r[side] for r in rounds if "error" not in r[side]]
        summary[side] = {
            "infer_per_s": _median([r["infer_per_s"] for r in good]),
            "server_cpu_us_per_infer": _median([r["server_cpu_us_per_infer"] for r in good
                                                if r.get("server_cpu_us_per_infer")]),
            "p50_ms": _median([r["p50_ms"] for r in good]),
            "errors": sum(1 for r in rounds if "error" in r[side]) + sum(r.get("errors", 0) for r in good),
        }
    paired = [r for r in rounds if "error" not in r["A"] and "error" not in r["B"]]
    for key, higher_is_better in (("infer_per_s", True), ("server_cpu_us_per_infer", False)):
        ratios = [r["B"][key] / r["A"][key] for r in paired if r["A"].get(key) and r["B"].get(key)]
        wins = sum(1 for ratio in ratios if (ratio > 1 if higher_is_better else ratio < 1))
        summary[f"ratio_{key}"] = {
            "median": _median(ratios), "low": min(ratios) if ratios else None,
            "high": max(ratios) if ratios else None, "b_better": wins, "rounds": len(ratios),
        }
    return summary


def markdown(document: dict[str, Any]) -> str:
    meta, summary = document["meta"], document["summary"]
    lines = [
        f"# A/B: {meta['workload']} c={meta['concurrency']}, {meta['rounds']} paired rounds of {meta['duration_s']} s"
        + (" (perf_analyzer: three windows a turn)" if meta.get("tool") == "perf_analyzer" else ""),
        "",
    ]
    for side in SIDES:
        lines.append(f"- {side}: {meta['sides'][side]['describe']}")
    lines += ["", "| side | infer/s | server CPU / inference | p50 | errors |", "|---|---|---|---|---|"]
    for side in SIDES:
        s = summary[side]
        cpu = f"{s['server_cpu_us_per_infer']:.0f} us" if s["server_cpu_us_per_infer"] else "-"
        ips = f"{s['infer_per_s']:,.0f}" if s["infer_per_s"] else "-"
        p50 = f"{s['p50_ms']:.3f} ms" if s["p50_ms"] else "-"
        lines.append(f"| {side} | {ips} | {cpu} | {p50} | {s['errors']} |")
    lines += ["", "| paired B/A | median | lowest | highest | rounds B better |", "|---|---|---|---|---|"]
    for key, label in (("infer_per_s", "infer/s"), ("server_cpu_us_per_infer", "server CPU / inference")):
        r = summary[f"ratio_{key}"]
        if r["median"] is None:
            lines.append(f"| {label} | - | - | - | 0 of 0 |")
            continue
        lines.append(f"| {label} | {r['median']:.3f} | {r['low']:.3f} | {r['high']:.3f} | "
                     f"{r['b_better']} of {r['rounds']} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=loadgen.WORKLOADS)
    p.add_argument("-c", "--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("-d", "--duration", type=float, default=3.0, help="each turn's measured window, seconds")
    p.add_argument("-w", "--warmup", type=float, default=1.0, help="each turn's warm-up, seconds")
    p.add_argument("--elements", type=int, default=1_000_000, help="FP32 elements of the identity workloads")
    p.add_argument("--request-timeout", type=float, default=30.0)
    for side in ("a", "b"):
        p.add_argument(f"--{side}-package", type=Path, help="the folder holding the `oip` package to run")
        p.add_argument(f"--{side}-env", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument(f"--{side}-serve", default="", metavar="FLAGS", help="flags of `python -m oip serve`")
    p.add_argument("--perf-analyzer", action="store_true",
                   help="drive each turn with perf_analyzer (three windows of -d seconds) instead of loadgen.py")
    p.add_argument("--cache", type=Path, default=BENCH / ".cache")
    p.add_argument("--json", type=Path, help="also write the rounds and the summary here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--rounds must be at least 1, --duration positive, --warmup not negative")
    if args.perf_analyzer:
        if args.workload not in pa.ARGS or args.workload in pa.NOT_APPLICABLE:
            p.error(f"perf_analyzer does not send {args.workload}: {pa.NOT_APPLICABLE.get(args.workload, 'no args')}")
        if pa.command(args.cache) is None:
            p.error("perf_analyzer is not set up: bash bench/setup.sh")
    args.sides = {}
    for side in SIDES:
        low = side.lower()
        package = getattr(args, f"{low}_package")
        if package is not None:
            package = package.resolve()
            if not (package / "oip" / "__init__.py").is_file():
                p.error(f"--{low}-package {package}: no oip package there (expected {package / 'oip'})")
        env: dict[str, str] = {}
        for item in getattr(args, f"{low}_env"):
            key, sep, value = item.partition("=")
            if not sep or not key:
                p.error(f"--{low}-env {item!r}: expected KEY=VALUE")
            env[key] = value
        args.sides[side] = Side(side, package, env, tuple(shlex.split(getattr(args, f"{low}_serve"))))
    return args


def _turn(server: servers.Running, args: argparse.Namespace) -> dict[str, Any]:
    """One side's turn: its figures, or {"error": ...}."""
    if not args.perf_analyzer:
        return servers.run_loadgen(
            server, args.workload, concurrency=args.concurrency, duration=args.duration, warmup=args.warmup,
            elements=args.elements, request_timeout=args.request_timeout,
        )

    def measure() -> dict[str, Any]:
        with run.pinned(servers.CLIENT_CPU):
            return pa.run(args.cache, args.workload, server.rest, server.grpc, args.concurrency, args.elements,
                          window_ms=round(args.duration * 1000), trials=3)

    return run.observed(server, measure)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    running: dict[str, servers.Running] = {}
    rounds: list[dict[str, dict[str, Any]]] = []
    seen: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="oip-ab-") as work:
        try:
            for name, side in args.sides.items():
                server = servers.start("oipgen", args.cache, Path(work), options=side.options, env=side.env,
                                       package=side.package, log_name=f"side-{name}")
                running[name] = server
                seen[name] = {"describe": side.describe(), "metadata": server.metadata,
                              "environ": _environ(server.pid, list(side.env)), "idle_rss_mib": server.idle_rss_mib}
            for turn in range(args.rounds):
                order = SIDES if turn % 2 == 0 else SIDES[::-1]
                results: dict[str, dict[str, Any]] = {}
                for name in order:
                    results[name] = _turn(running[name], args)
                rounds.append(results)
                log(f"[{turn + 1}/{args.rounds}] " + "; ".join(
                    f"{name} " + (f"ERROR {r['error'][:120]}" if "error" in r else
                                  f"{r['infer_per_s']:.0f} infer/s, {r.get('server_cpu_us_per_infer') or 0:.0f} us")
                    for name, r in sorted(results.items())))
        finally:
            for server in running.values():
                servers.stop(server)
    document = {
        "meta": {"workload": args.workload, "concurrency": args.concurrency, "rounds": args.rounds,
                 "duration_s": args.duration, "warmup_s": args.warmup,
                 "tool": "perf_analyzer" if args.perf_analyzer else "loadgen",
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                 "server_cpu": servers.SERVER_CPU, "client_cpu": servers.CLIENT_CPU, "sides": seen},
        "rounds": rounds,
        "summary": compare(rounds),
    }
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown(document), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
