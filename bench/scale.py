"""`make bench-scale`: how our server's cost grows with the payload and with the concurrency.

- Payload: `identity_fp32` at c=1 over REST binary and gRPC raw, tensors from 1 KB to 64 MB (x4 steps): latency
  and server CPU per inference. The cost must grow linearly with the size: per-byte CPU at 64 MB within 2x of
  that at 1 MB, and the log-log slope of CPU per inference between 1 MB and 64 MB at most 1.2.
- Concurrency: `simple` over REST JSON and gRPC at 1 to 64 concurrent requests: throughput must hold (at every
  concurrency from 8 up, at least 80% of the best) and no request may fail.
- Workers: `simple` over REST JSON and gRPC with `--workers N` for each N of --workers (default 1, then doubling
  up to the server's cores), the server on --server-cpus and the load on --client-cpus, one load generator process
  per client core (`servers.run_loadgen_on`), WORKERS_CONCURRENCY requests at once per worker: throughput, CPU per
  inference and the speed-up over one worker. By default (`layout`) a quarter of the cores (at least one) carry
  the load and the rest the server; with fewer than 4 cores the server takes them all and the load shares the
  last one, which the report says: there a second worker can only take what the load generator leaves of that
  core, and the figure says how much of it becomes throughput, not how workers scale.
- Load and faults (bench/faults.py, the drivers of the fault suite): 64 clients mixing REST JSON, REST binary and
  gRPC on `simple`, every answer checked number by number, twice (--faults-duration each), with the server's RSS
  before and after each phase; then 200 slow clients sending a header a byte a second while 8 others are served:
  their p99, and what the server did with the slow connections (closed after its 10 s header timeout, 408).
Outputs in --out (default bench/results): scale.json, scale.md, scale.png. The server runs on CPU 0, the load on
CPU 1, as in bench/run.py; every point is bounded in time (--duration) and count.

    python bench/scale.py [--quick] [--duration 3] [--faults-duration 20] [--out DIR]
                          [--server-cpus 0,1,2,3,4,5] [--client-cpus 6,7] [--workers 1,2,4,6]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
import servers
from servers import BENCH

SIZES = tuple(1024 * 4**i for i in range(9))  # 1 KB .. 64 MB
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
PAYLOAD_WORKLOADS = ("identity_rest_binary", "identity_grpc_raw")
CONCURRENCY_WORKLOADS = ("simple_rest", "simple_grpc")
WORKERS_CONCURRENCY = 16  # requests at once per worker


def layout(cores: int) -> tuple[list[str], list[str]]:
    """The default cores (taskset's numbers) of the server and of the load generator on a machine of `cores`
    cores: the last quarter (at least one) for the load and the rest for the server; below 4 cores, every core for
    the server and the last one shared with the load."""
    every = [str(i) for i in range(cores)]
    if cores < 4:
        return every, every[-1:]
    load = max(1, cores // 4)
    return every[:-load], every[-load:]


def worker_counts(server_cpus: int) -> list[int]:
    """1, 2, 4... up to the server's cores (and that count itself)."""
    counts = [1]
    while counts[-1] * 2 <= server_cpus:
        counts.append(counts[-1] * 2)
    if counts[-1] != server_cpus:
        counts.append(server_cpus)
    return counts


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TB"


def _memory(r: dict[str, Any]) -> str:
    peak, before, after = r.get("peak_rss_mib"), r.get("rss_before_mib"), r.get("rss_after_mib")
    if peak is None:
        return "-"
    if before is None or after is None:  # a run from before these were recorded
        return f"peak {peak:.0f}"
    # the peak is reset after `before` is read, so memory freed in between can put it below: no growth, then
    return f"{before:.0f}, {peak:.0f} (+{max(peak - before, 0.0):.0f}), {after:.0f}"


def point(
    server: servers.Running, workload: str, concurrency: int, elements: int, duration: float, warmup: float
) -> dict[str, Any]:
    before = loadgen.rss_kib(server.pid) / 1024
    result = servers.run_loadgen(
        server, workload, concurrency=concurrency, duration=duration, warmup=warmup, elements=elements,
        request_timeout=60, extra=("--max-requests", "200000"), limit=duration + warmup + 180,
    )
    # The server's RSS before the point's first request and once it is done: the peak (VmHWM, reset after the
    # first answer) starts from what earlier points left resident, so a point's own cost is its peak's growth
    # over `rss_before_mib`, and what it leaves behind is `rss_after_mib` (the next point's start).
    result.update(rss_before_mib=before, rss_after_mib=loadgen.rss_kib(server.pid) / 1024)
    if "error" in result:
        return {"workload": workload, "concurrency": concurrency, **result}
    return result


def checks(payload: list[dict[str, Any]], concurrency: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    out: list[tuple[str, str, bool]] = []
    for workload in PAYLOAD_WORKLOADS:
        rows = {r["payload_bytes"]: r for r in payload if r["workload"] == workload and "error" not in r}
        errors = [r for r in payload if r["workload"] == workload and ("error" in r or r.get("errors"))]
        small, big = 1 << 20, max(rows, default=0)
        if (
            small in rows
            and big > small
            and rows[small].get("server_cpu_us_per_infer")
            and rows[big].get("server_cpu_us_per_infer")
        ):
            per_small = rows[small]["server_cpu_us_per_infer"] / small
            per_big = rows[big]["server_cpu_us_per_infer"] / big
            slope = math.log(rows[big]["server_cpu_us_per_infer"] / rows[small]["server_cpu_us_per_infer"]) / math.log(
                big / small
            )
            out.append(
                (
                    f"{workload}: CPU per byte at {_size(big)} within 2x of 1 MB's, log-log slope <= 1.2",
                    f"{per_big * 1e3:.3f} vs {per_small * 1e3:.3f} us/KB "
                    f"(x{per_big / per_small:.2f}), slope {slope:.2f}",
                    per_big <= 2 * per_small and slope <= 1.2,
                )
            )
        out.append(
            (
                f"{workload}: every size answered, no errors",
                f"{len(rows)} of {len({r['payload_bytes'] for r in payload if r['workload'] == workload})} sizes, "
                f"{len(errors)} with errors",
                not errors,
            )
        )
    for workload in CONCURRENCY_WORKLOADS:
        rows = [r for r in concurrency if r["workload"] == workload]
        good = [r for r in rows if "error" not in r]
        best = max((r["infer_per_s"] for r in good), default=0.0)
        high = [r for r in good if r["concurrency"] >= 8]
        worst = min((r["infer_per_s"] for r in high), default=0.0)
        failed = sum(int(r.get("errors", 0)) for r in good) + len(rows) - len(good)
        out.append(
            (
                f"{workload}: throughput holds from c=8 up (>= 80% of the best), no errors",
                f"worst {worst:,.0f} vs best {best:,.0f} infer/s ({worst / best:.0%}); {failed} errors"
                if best
                else "no data",
                bool(best) and worst >= 0.8 * best and failed == 0,
            )
        )
    return out


def chart(document: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for workload in PAYLOAD_WORKLOADS:
        rows = sorted(
            (r for r in document["payload"] if r["workload"] == workload and "error" not in r),
            key=lambda r: r["payload_bytes"],
        )
        x = [r["payload_bytes"] for r in rows]
        axes[0][0].plot(x, [r["p50_ms"] for r in rows], marker="o", label=f"{workload} p50")
        axes[0][0].plot(x, [r["p99_ms"] for r in rows], marker=".", linestyle=":", label=f"{workload} p99")
        axes[0][1].plot(x, [r["server_cpu_us_per_infer"] / 1000 for r in rows], marker="o", label=workload)
    if document["payload"]:
        xs = sorted({r["payload_bytes"] for r in document["payload"]})
        ref = [
            r
            for r in document["payload"]
            if r["workload"] == PAYLOAD_WORKLOADS[0]
            and r["payload_bytes"] == 1 << 20
            and r.get("server_cpu_us_per_infer")
        ]
        if ref:
            per_byte = ref[0]["server_cpu_us_per_infer"] / 1000 / (1 << 20)
            axes[0][1].plot(xs, [per_byte * x for x in xs], color="grey", linestyle="--", label="linear from 1 MB")
    for ax, label in ((axes[0][0], "latency ms"), (axes[0][1], "server CPU ms / inference")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tensor size (bytes), c=1")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for workload in CONCURRENCY_WORKLOADS:
        rows = sorted(
            (r for r in document["concurrency"] if r["workload"] == workload and "error" not in r),
            key=lambda r: r["concurrency"],
        )
        x = [r["concurrency"] for r in rows]
        axes[1][0].plot(x, [r["infer_per_s"] for r in rows], marker="o", label=workload)
        axes[1][1].plot(x, [r["p50_ms"] for r in rows], marker="o", label=f"{workload} p50")
        axes[1][1].plot(x, [r["p99_ms"] for r in rows], marker=".", linestyle=":", label=f"{workload} p99")
    for ax, label in ((axes[1][0], "infer/s"), (axes[1][1], "latency ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (simple)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    axes[1][0].set_ylim(bottom=0)
    meta = document["meta"]
    fig.suptitle(
        f"oipgen: cost against payload and concurrency - {meta['date']}, "
        f"load average {meta['load_average_before'][0]:.2f}" + (" (quick run)" if meta["quick"] else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fault_phase(server: servers.Running, phase: str, duration: float, *options: str) -> dict[str, Any]:
    """One phase of bench/faults.py in its own process on the client CPU; its figures, with the server's resident
    memory before and after (MiB)."""
    argv = ["taskset", "-c", servers.CLIENT_CPU, sys.executable, str(BENCH / "faults.py"), phase,
            "--rest", server.rest, "--grpc", server.grpc, "-d", str(duration), *options]
    result: dict[str, Any] = {"phase": phase, "rss_before_mib": loadgen.rss_kib(server.pid) / 1024}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120, check=False)
    except subprocess.TimeoutExpired:
        return {**result, "error": f"bench/faults.py {phase} did not finish within {duration + 120:.0f} s"}
    result["rss_after_mib"] = loadgen.rss_kib(server.pid) / 1024
    if done.returncode != 0 or not done.stdout.strip():
        return {**result, "error": f"bench/faults.py exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return {**result, **json.loads(done.stdout.strip().splitlines()[-1])}


def fault_checks(rows: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    mixed = [r for r in rows if r["phase"] == "mixed"]
    slow = [r for r in rows if r["phase"] == "slow"]
    out = []
    for n, r in enumerate(mixed, 1):
        ok = "error" not in r and r["errors"] == 0 and r["wrong"] == 0
        what = r.get("error") or f"{r['requests']:,} requests, {r['errors']} errors, {r['wrong']} wrong"
        out.append((f"mixed load phase {n}: no error, no wrong answer", what, ok))
    if len(mixed) == 2 and all("error" not in r for r in mixed):
        growth = mixed[1]["rss_after_mib"] - mixed[1]["rss_before_mib"]
        out.append(("second mixed phase grows RSS < 50 MB", f"{growth:+.1f} MiB", growth * 1.048576 < 50))
    for r in slow:
        ok = "error" not in r and r["probe"]["errors"] == 0 and r["probe"]["p99_ms"] < 1000
        what = r.get("error") or f"p99 {r['probe']['p99_ms']:.1f} ms, {r['probe']['errors']} errors"
        out.append(("others served beside 200 slow clients: p99 < 1 s", what, ok))
    return out


def fault_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Load and faults (bench/faults.py; load on CPU 1)", "",
             "| phase | clients | requests | per s | p50 / p99 ms | errors | wrong | server RSS MiB before -> after |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rss = f"{r['rss_before_mib']:.1f} -> {r.get('rss_after_mib', float('nan')):.1f}"
        if "error" in r:
            lines.append(f"| {r['phase']} | | fails: {r['error'][:100]} | | | | | {rss} |")
            continue
        if r["phase"] == "mixed":
            kinds = ", ".join(f"{k} {v['requests']:,}" for k, v in r["kinds"].items())
            lines.append(f"| mixed ({kinds}) | {r['clients']} | {r['requests']:,} | {r['per_s']:,.0f} | "
                         f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['errors']} | {r['wrong']} | {rss} |")
        else:
            probe, closed = r["probe"], r["slow_closed_after_s"]
            answers = ", ".join(f"{k}: {v}" for k, v in r["slow_answers"].items())
            lines.append(f"| {r['probes']} clients beside {r['slow_clients']} slow ones (closed "
                         f"{r['slow_closed_by_server']} times after {closed['median']:.1f} s; {answers}) | "
                         f"{r['probes']} | {probe['requests']:,} | {probe['per_s']:,.0f} | {probe['p50_ms']:.2f} / "
                         f"{probe['p99_ms']:.2f} | {probe['errors']} | {probe['wrong']} | {rss} |")
    return lines


def markdown(document: dict[str, Any]) -> str:
    meta = document["meta"]
    lines = [
        "# oipgen: how cost grows",
        "",
        f"{meta['date']}; load average {meta['load_average_before']} before, {meta['load_average_after']} after; "
        f"{meta['duration_s']:g} s per point. Server on CPU 0, load on CPU 1."
        + (" Quick smoke run." if meta["quick"] else ""),
        "",
        "Memory: the server's RSS before the point's first request, its peak during the point (in brackets the "
        "peak's growth over the RSS before: the point's own cost) and its RSS once the point is done (what the "
        "next point starts from).",
        "",
        "| workload | tensor | infer/s | p50 / p99 ms | server CPU ms / inference | us per KB "
        "| RSS MiB: before, peak (growth), after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in document["payload"]:
        if "error" in r:
            lines.append(
                f"| {r['workload']} | {_size(r.get('payload_bytes', 0))} | fails: {r['error'][:100]} | | | | |"
            )
            continue
        cpu = r.get("server_cpu_us_per_infer") or 0.0
        lines.append(
            f"| {r['workload']} | {_size(r['payload_bytes'])} | {r['infer_per_s']:,.1f} | {r['p50_ms']:.2f} / "
            f"{r['p99_ms']:.2f} | {cpu / 1000:.3f} | {cpu / (r['payload_bytes'] / 1024):.3f} | "
            f"{_memory(r)} |"
        )
    lines += [
        "",
        "| workload | concurrency | infer/s | p50 / p99 ms | server CPU us / inference | errors |",
        "|---|---|---|---|---|---|",
    ]
    for r in document["concurrency"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['concurrency']} | fails: {r['error'][:100]} | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['infer_per_s']:,.0f} | "
            f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} | "
            f"{(r.get('server_cpu_us_per_infer') or 0):.0f} | {r['errors']} |"
        )
    rows = document.get("workers", [])
    if rows:
        setup = document["meta"].get("workers", {})
        server_cpus, client_cpus = setup.get("server_cpus", []), setup.get("client_cpus", [])
        shared = sorted(set(server_cpus) & set(client_cpus))
        lines += ["", f"## Workers ({WORKERS_CONCURRENCY} requests at once per worker; server on CPUs "
                  f"{','.join(server_cpus)}, load on CPUs {','.join(client_cpus)}, one load generator per core)", ""]
        if shared:
            lines += [f"The load generator shares CPU {','.join(shared)} with the server: what more workers give "
                      "here is bounded by what the load leaves of the server's cores; this measures that, not how "
                      "the workers scale (run `make bench-scale` on a machine of 4 or more cores).", ""]
        lines += ["| workload | workers | infer/s | p50 / p99 ms | server CPU us / inference | speed-up over 1 |",
                  "|---|---|---|---|---|---|"]
        for workload in CONCURRENCY_WORKLOADS:
            mine = [r for r in rows if r["workload"] == workload]
            one = next((r for r in mine if r["workers"] == 1 and "error" not in r), None)
            for r in mine:
                if "error" in r:
                    lines.append(f"| {workload} | {r['workers']} | fails: {r['error'][:100]} | | | |")
                    continue
                gain = f"{r['infer_per_s'] / one['infer_per_s']:.2f}x" if one and one["infer_per_s"] else "-"
                lines.append(f"| {workload} | {r['workers']} | {r['infer_per_s']:,.0f} | {r['p50_ms']:.2f} / "
                             f"{r['p99_ms']:.2f} | {r['server_cpu_us_per_infer'] or 0:,.0f} | {gain} |")
    if document.get("faults"):
        lines += fault_lines(document["faults"])
    lines += ["", "| check | measured | met |", "|---|---|---|"]
    for text, what, ok in document["checks"]:
        lines.append(f"| {text} | {what} | {'yes' if ok else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short smoke run (sizes up to 1 MB, c up to 16)")
    p.add_argument("--duration", type=float)
    p.add_argument("--faults-duration", type=float, help="seconds of each mixed load phase (default 20, quick 5)")
    p.add_argument("--out", type=Path, default=BENCH / "results")
    default_server, default_client = layout(os.cpu_count() or 1)
    p.add_argument("--server-cpus", default=",".join(default_server),
                   help="the server's cores in the workers' measurement (default here: %(default)s)")
    p.add_argument("--client-cpus", default=",".join(default_client),
                   help="the load generator's cores, one process each (default here: %(default)s)")
    p.add_argument("--workers", help="comma-separated worker counts (default: 1, 2, 4... up to the server's cores)")
    args = p.parse_args(argv)
    server_cpus = [c for c in args.server_cpus.split(",") if c]
    client_cpus = [c for c in args.client_cpus.split(",") if c]
    counts = [int(n) for n in args.workers.split(",")] if args.workers else worker_counts(len(server_cpus))
    duration = args.duration or (0.5 if args.quick else 3.0)
    warmup = 0.2 if args.quick else 0.5
    sizes = SIZES[:6] if args.quick else SIZES
    levels = CONCURRENCY[:5] if args.quick else CONCURRENCY
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    load_before = [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    began = time.monotonic()
    payload: list[dict[str, Any]] = []
    concurrency: list[dict[str, Any]] = []
    workers: list[dict[str, Any]] = []
    fault_rows: list[dict[str, Any]] = []
    faults_duration = args.faults_duration or (5.0 if args.quick else 20.0)
    try:
        with servers.running("oipgen", BENCH / ".cache", out / "logs") as server:
            for workload in PAYLOAD_WORKLOADS:
                for size in sizes:
                    r = point(server, workload, 1, size // 4, duration, warmup)
                    r.setdefault("payload_bytes", size)
                    payload.append(r)
                    print(
                        f"{workload} {_size(size)}: "
                        + (
                            f"ERROR {r['error']}"
                            if "error" in r
                            else f"{r['infer_per_s']:,.1f}/s p50 {r['p50_ms']:.2f} ms, "
                            f"{r['server_cpu_us_per_infer'] or 0:,.0f} us CPU"
                        ),
                        flush=True,
                    )
            for workload in CONCURRENCY_WORKLOADS:
                for level in levels:
                    r = point(server, workload, level, 1, duration, warmup)
                    concurrency.append(r)
                    print(
                        f"{workload} c={level}: "
                        + (
                            f"ERROR {r['error']}"
                            if "error" in r
                            else f"{r['infer_per_s']:,.0f}/s p50 {r['p50_ms']:.2f} ms, {r['errors']} errors"
                        ),
                        flush=True,
                    )
        for count in counts:
            with servers.running("oipgen", BENCH / ".cache", out / "logs", options=("--workers", str(count)),
                                 cpus=",".join(server_cpus)) as server:
                for workload in CONCURRENCY_WORKLOADS:
                    r = {"workers": count, **servers.run_loadgen_on(
                        server, workload, client_cpus, concurrency=WORKERS_CONCURRENCY * count, duration=duration,
                        warmup=warmup, elements=1, request_timeout=60)}
                    workers.append(r)
                    cpu = r.get("server_cpu_us_per_infer") or 0
                    text = f"ERROR {r['error']}" if "error" in r else f"{r['infer_per_s']:,.0f}/s, {cpu:,.0f} us CPU"
                    print(f"--workers {count} {workload}: {text}", flush=True)
        with servers.running("oipgen", BENCH / ".cache", out / "logs") as server:
            for seed in (0, 1000):  # two identical phases: the second must not grow the server's memory
                fault_rows.append(fault_phase(server, "mixed", faults_duration, "-c", "64", "--seed", str(seed)))
            # Longer than the server's 10 s header timeout, so that every slow connection meets it.
            fault_rows.append(fault_phase(server, "slow", 12.0 if args.quick else 15.0, "--slow", "200"))
            for r in fault_rows:
                print(f"faults {r['phase']}: " + (f"ERROR {r['error']}" if "error" in r else json.dumps(
                    {k: r[k] for k in ("requests", "errors", "wrong", "p99_ms", "probe") if k in r})), flush=True)
    except KeyboardInterrupt:
        print("interrupted: the server this run started is stopped")
        return 130
    document = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "quick": args.quick,
            "duration_s": duration,
            "load_average_before": load_before,
            "load_average_after": [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]],
            "elapsed_s": time.monotonic() - began,
            "workers": {"server_cpus": server_cpus, "client_cpus": client_cpus, "counts": counts},
        },
        "payload": payload,
        "concurrency": concurrency,
        "workers": workers,
        "faults": fault_rows,
    }
    document["checks"] = checks(payload, concurrency) + fault_checks(fault_rows)
    (out / "scale.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "scale.md").write_text(markdown(document))
    chart(document, out / "scale.png")
    print((out / "scale.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
