"""`make bench`: oipgen against Triton, MLServer and KServe, on the same load, in one run.

Each server serves, single-process on CPU 0, `simple` (INT32 [1,16] x2 -> sum, difference), `identity_fp32` (FP32
[-1]) and `text` (BYTES: each string upper-cased); Triton and oipgen also `batched` (`simple` under dynamic batching,
max batch 8, 100 us), `decoupled` (100 responses per request) and the generate extension's `text_generate` and
`text_tokens` (bench/servers.py; the scenarios: bench/scenarios.py). The load generator (bench/loadgen.py) runs
on CPU 1, as does perf_analyzer where the server has what it needs (Triton's model configuration and statistics
extensions: Triton and oipgen) and can send the workload. For every small-request scenario, our server's answer is
recorded and replayed by the bare transport (uvicorn, grpcio: bench/floor.py, bench/grpc_floor.py) under the same
load: the floor our CPU per request is compared with. Per repeat, every server is
started (start-up time to ready, then its memory at rest before any inference), measured on every scenario, and
stopped (the large-payload scenarios each run on a server started for them, so that each one's peak memory is its
own); the servers take turns within a repeat so that drift in the machine's load hits them alike. The figures
are medians over the repeats. With every measurement go the load average, the bytes the server logged, and, where
the server has the statistics extension, the inferences it says it completed (a check on the load generators'
counts); with the run, the git commit and the versions of every server and load generator. Outputs (in --out;
default bench/results, and bench/.work/quick for --quick, so that a smoke run never replaces the committed
figures): results.json (every raw measurement), results.md (ratios against Triton first, then the
full table, memory, perf_analyzer, the targets), bench.png (throughput, latency and CPU per scenario).

    python bench/run.py [--quick] [--servers oipgen,triton,mlserver,kserve] [--repeats 3] [--duration 10]
                        [--scenarios simple_rest_c1,...] [--no-pa] [--no-floors] [--no-setup] [--out DIR]

--quick is a smoke run (1 repeat, 1 s windows, 100k-element identity). Everything is bounded: each measurement
by its window and a timeout, each server start by a timeout; Ctrl-C stops the servers this run started.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen as loadgen_mod
import pa
import report
import servers
from scenarios import BY_NAME, LOADGEN, SCENARIOS, Scenario
from servers import BENCH, CLIENT_CPU, SERVER_CPU

__all__ = ["BY_NAME", "SCENARIOS", "Scenario", "main"]




def load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def loadgen(server: servers.Running, scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement by bench/loadgen.py in its own process on the client CPU."""
    return {"tool": "loadgen", **servers.run_loadgen(
        server,
        scenario.workload,
        concurrency=scenario.concurrency,
        duration=args.duration * (2 if scenario.long else 1),
        warmup=args.warmup,
        elements=args.elements,
        request_timeout=args.request_timeout,
    )}


def observed(server: servers.Running, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `measure()` and add what the server shows of it: the load average at the start, the bytes it logged,
    the inferences its statistics extension counted (not a floor's: it has none), and its CPU over the whole
    measurement."""
    counted = server.name != "floor"
    load, logged = load_average(), servers.log_bytes(server)
    count = servers.inference_count(server) if counted else None
    cpu = loadgen_mod.cpu_seconds(server.pid)
    result = dict(measure())
    cpu = loadgen_mod.cpu_seconds(server.pid) - cpu
    after = servers.inference_count(server) if counted else None
    result.update(load_average=load, log_bytes=servers.log_bytes(server) - logged)
    if count is not None and after is not None:
        result["server_count"] = after - count
    answered = result.get("server_count") or result.get("completed")
    if answered:
        result["answered"] = answered
        result["log_bytes_per_request"] = result["log_bytes"] / answered
        if result.get("tool") == "perf_analyzer":
            result["server_cpu_us_per_infer"] = cpu / answered * 1e6
            if result.get("client_cpu_s") is not None:
                result["client_cpu_us_per_infer"] = result["client_cpu_s"] / answered * 1e6
    return result


def run_pa(server: servers.Running, scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    with pinned(CLIENT_CPU):
        try:
            return pa.run(args.cache, scenario.workload, server.rest, server.grpc, scenario.concurrency,
                          args.elements, window_ms=args.pa_window_ms, trials=args.pa_trials)  # fmt: skip
        except Exception as exc:  # one failed measurement is reported, the run goes on
            return {"tool": "perf_analyzer", "error": f"{type(exc).__name__}: {exc}"}


@contextlib.contextmanager
def pinned(cpu: str):  # type: ignore[no-untyped-def]
    """Children started inside run on `cpu` (the affinity is inherited)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(cpu)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    workdir = args.out / "logs"  # the servers' logs of this run (the peers log every request: 100+ MB)
    shutil.rmtree(workdir, ignore_errors=True)
    scenarios = [BY_NAME[name] for name in args.scenarios]
    for repeat in range(1, args.repeats + 1):
        everyone = args.servers
        order = everyone[repeat - 1 :] + everyone[: repeat - 1]  # take turns: nobody always goes first
        for name in order:
            base = {"server": name, "repeat": repeat, "load_average": load_average()}
            try:
                server = servers.start(name, args.cache, workdir)
            except RuntimeError as exc:
                records.append({**base, "scenario": "startup", "tool": "harness", "error": str(exc)})
                log(f"[{repeat}] {name}: {exc}")
                continue
            try:
                records.append(
                    {
                        **base,
                        "scenario": "startup",
                        "tool": "harness",
                        "startup_s": server.startup_s,
                        "ready_rss_mib": server.ready_rss_mib,
                        "idle_rss_mib": server.idle_rss_mib,
                        "idle_pss_mib": server.idle_pss_mib,
                        "server_metadata": server.metadata,
                        "log_bytes": servers.log_bytes(server),
                    }
                )
                log(
                    f"[{repeat}] {name}: ready in {server.startup_s:.2f} s; at rest {server.idle_pss_mib:.0f} MiB PSS,"
                    f" {server.idle_rss_mib:.0f} MiB RSS"
                )
                served = False  # whether this server has answered a scenario yet
                for scenario in scenarios:
                    if not servers.serves(name, scenario.workload):
                        records.append({**base, "scenario": scenario.name, "tool": LOADGEN,
                                        "not_applicable": f"{servers.LABELS[name]} does not serve model "
                                        f"'{servers.WORKLOAD_MODEL[scenario.workload]}' (bench/servers.py)"})
                        continue
                    if scenario.fresh and served:
                        servers.stop(server)
                        try:
                            server = servers.start(name, args.cache, workdir)
                        except RuntimeError as exc:
                            records.append({**base, "scenario": scenario.name, "tool": "loadgen", "error": str(exc)})
                            log(f"[{repeat}] {name}: {exc}")
                            break
                    served = True
                    result = observed(server, functools.partial(loadgen, server, scenario, args))
                    # The RSS at rest of the server this scenario ran on (started, settled, before any inference).
                    result["rest_rss_mib"] = server.idle_rss_mib
                    records.append({**base, "scenario": scenario.name, **result})
                    log(f"[{repeat}] {name} {scenario.name}: {_short(result)}")
                if args.pa:
                    if not pa.config_ok(server.rest):
                        records.append(
                            {
                                **base,
                                "scenario": "*",
                                "tool": "perf_analyzer",
                                "error": "GET /v2/models/simple/config is not 200: no model configuration "
                                "extension, which perf_analyzer needs",
                            }
                        )
                        log(f"[{repeat}] {name}: perf_analyzer skipped (no model configuration extension)")
                    else:
                        for scenario in scenarios:
                            reason = pa.NOT_APPLICABLE.get(scenario.workload)
                            if not servers.serves(name, scenario.workload):
                                continue
                            if reason:
                                result = {"tool": "perf_analyzer", "not_applicable": reason}
                            else:
                                result = observed(server, functools.partial(run_pa, server, scenario, args))
                            records.append({**base, "scenario": scenario.name, **result})
                            log(f"[{repeat}] {name} {scenario.name} perf_analyzer: {_short(result)}")
                if name == report.OURS and args.floors:
                    records += measure_floors(server, [s for s in scenarios if s.floor], args, repeat, log)
            finally:
                servers.stop(server)
    return records


def measure_floors(ours: servers.Running, scenarios: list[Scenario], args: argparse.Namespace, repeat: int,
                   log: Any) -> list[dict[str, Any]]:
    """Each scenario's floor (server "floor"): our server's answer to its workload, recorded, then answered by the
    bare transport (`servers.start_floor`) under the scenario's own load, from bench/loadgen.py: its CPU per
    request, and for a large tensor its peak memory over its memory at rest."""
    records: list[dict[str, Any]] = []
    folder = args.out / "logs" / "floors"
    folder.mkdir(parents=True, exist_ok=True)
    for scenario in scenarios:
        base = {"server": "floor", "repeat": repeat, "load_average": load_average(), "scenario": scenario.name}
        answer = folder / f"{scenario.workload}.json"
        try:
            servers.record_answer(ours, scenario.workload, args.elements, answer, args.request_timeout)
            floor = servers.start_floor(answer, folder)
        except RuntimeError as exc:
            records.append({**base, "tool": LOADGEN, "error": str(exc)})
            log(f"[{repeat}] floor {scenario.name}: {exc}")
            continue
        try:
            result = observed(floor, functools.partial(loadgen, floor, scenario, args))
        finally:
            servers.stop(floor)
        records.append({**base, **result, "rest_rss_mib": floor.idle_rss_mib})
        log(f"[{repeat}] floor {scenario.name}: {_short(result)}")
    return records


OBSERVABILITY_ROUNDS = 8  # per repeat: the windows each observability variant gets, in turns


def measure_observability(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Our server as shipped, with metrics and tracing off, and with every request traced (`args.variants`): a
    cost is a ratio of two throughputs, and on this noisy 2-core machine the speed of CPU 0 drifts by more than the
    costs measured over the tens of seconds that separate two servers' turns. So the three servers are up at once
    (idle but for their turn, all on CPU 0) and take turns in short windows, round after round, each round in
    another order; every window is a record, and the report takes the medians over the rounds."""
    if not args.variants:
        return []
    rounds = 1 if args.quick else OBSERVABILITY_ROUNDS * args.repeats
    short = argparse.Namespace(**{**vars(args), "duration": args.observability_window_s,
                                  "warmup": min(args.warmup, 0.5)})
    scenarios = [BY_NAME[name] for name in servers.VARIANT_SCENARIOS if name in args.scenarios]
    workdir = args.out / "logs"
    records: list[dict[str, Any]] = []
    running: dict[str, servers.Running] = {}
    try:
        for name in args.variants:
            try:
                running[name] = servers.start(name, args.cache, workdir)
            except RuntimeError as exc:
                records.append({"server": name, "repeat": 1, "load_average": load_average(), "scenario": "startup",
                                "tool": "harness", "error": str(exc)})
                log(f"{name}: {exc}")
        names = list(running)
        for turn in range(1, rounds + 1):
            order = names[(turn - 1) % len(names):] + names[:(turn - 1) % len(names)] if names else []
            for scenario in scenarios:
                for name in order:
                    base = {"server": name, "repeat": turn, "load_average": load_average()}
                    result = observed(running[name], functools.partial(loadgen, running[name], scenario, short))
                    records.append({**base, "scenario": scenario.name, **result})
                    log(f"[{turn}] {name} {scenario.name}: {_short(result)}")
    finally:
        for server in running.values():
            servers.stop(server)
    return records


def _short(result: dict[str, Any]) -> str:
    if "error" in result:
        return "ERROR " + str(result["error"])[:200]
    if "not_applicable" in result:
        return "not applicable"
    cpu, client = result.get("server_cpu_us_per_infer"), result.get("client_cpu_us_per_infer")
    return (
        f"{result['infer_per_s']:.1f} infer/s, p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms"
        + (f", {cpu:.0f} us CPU/infer" if cpu else "")
        + (f", client {client:.0f} us CPU/infer" if client is not None else "")
        + (f", server counted {result['server_count']}" if "server_count" in result else "")
        + (f", {result['errors']} errors" if result.get("errors") else "")
    )


def git_commit() -> dict[str, Any]:
    """The commit the run measured, and whether the work tree differed from it."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(BENCH.parent), *argv], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"sha": git("rev-parse", "HEAD") or None, "dirty": dirty}


def tool_versions(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Versions of every server's and load generator's packages, and of perf_analyzer (its wheel's version: the
    binary itself says 0.0.0)."""
    out = {name: servers.versions(name, args.cache) for name in (*args.servers, "loadgen")}
    out["loadgen"]["python"] = platform.python_version()
    wheels = sorted((args.cache / "perf_analyzer" / "wheel").glob("perf_analyzer-*.whl"))
    if args.pa and wheels:
        out["perf_analyzer"] = {"perf-analyzer": wheels[-1].name.split("-")[1]}
    return out


def floor(args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        "taskset",
        "-c",
        SERVER_CPU,
        sys.executable,
        str(BENCH / "floor.py"),
        "--elements",
        str(args.elements),
        "--repeat",
        str(3 if args.quick else 7),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    return dict(json.loads(done.stdout))


def wait_for_quiet(limit_load: float, max_wait: float, log: Any) -> None:
    """Wait (bounded) until the 1-minute load average is at most `limit_load`."""
    deadline = time.monotonic() + max_wait
    while load_average()[0] > limit_load and time.monotonic() < deadline:
        log(
            f"load average {load_average()}: waiting for <= {limit_load} "
            f"(up to {deadline - time.monotonic():.0f} s more)"
        )
        time.sleep(min(30.0, max(1.0, deadline - time.monotonic())))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--servers", default=",".join(servers.SERVERS), help="comma-separated (default: %(default)s)")
    p.add_argument("--scenarios", default=",".join(BY_NAME), help="comma-separated (default: all)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--duration", type=float, help="measurement window, seconds (identity JSON: twice)")
    p.add_argument("--warmup", type=float)
    p.add_argument("--elements", type=int, help="FP32 elements of the identity scenarios")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--no-pa", dest="pa", action="store_false", help="skip perf_analyzer")
    p.add_argument("--no-floors", dest="floors", action="store_false",
                   help="skip the bare transports' floors of the small-request scenarios")
    p.add_argument("--no-observability", dest="observability", action="store_false",
                   help="skip our server with metrics and tracing off, and with tracing on (the cost of each)")
    p.add_argument("--no-setup", dest="setup", action="store_false", help="do not run bench/setup.sh first")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("BENCH_CACHE", BENCH / ".cache")))
    p.add_argument("--out", type=Path,
                   help="the report's folder (default: bench/results; bench/.work/quick with --quick)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="LOAD",
        help="first wait (up to --wait-max s) until the load average is at most LOAD",
    )
    p.add_argument("--wait-max", type=float, default=900.0)
    args = p.parse_args(argv)
    quick = args.quick
    if args.out is None:  # a smoke run's figures are scratch: only a full run replaces the committed report
        args.out = BENCH / (".work/quick" if quick else "results")
    args.repeats = args.repeats or (1 if quick else 3)
    args.duration = args.duration or (1.0 if quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if quick else 2.0)
    args.elements = args.elements or (100_000 if quick else 1_000_000)
    # The observability variants' windows: a fraction of --duration, as they take turns (measure_observability)
    args.observability_window_s = max(min(args.duration, 1.0), args.duration / OBSERVABILITY_ROUNDS)
    args.pa_window_ms = 500 if quick else 3333
    args.pa_trials = 5 if quick else 3
    args.servers = [s for s in args.servers.split(",") if s]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.variants = []
    for name in args.servers:
        if name not in servers.SERVERS:
            p.error(f"unknown server {name!r}")
    for name in args.scenarios:
        if name not in BY_NAME:
            p.error(f"unknown scenario {name!r}")
    args.cache = args.cache.resolve()
    args.out = args.out.resolve()
    return args


def start_sink(log: Any) -> subprocess.Popen[str]:
    """The OTLP receiver the traced variant exports to, on the client CPU; its address goes in OTLP_ENV."""
    port = servers.free_port()
    sink = subprocess.Popen(
        ["taskset", "-c", CLIENT_CPU, sys.executable, str(BENCH / "otlp_sink.py"), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    assert sink.stdout is not None
    if sink.stdout.readline().strip() != "ready":
        raise RuntimeError("the OTLP sink did not start")
    os.environ[servers.OTLP_ENV] = f"http://127.0.0.1:{port}/v1/traces"
    log(f"OTLP sink on port {port}")
    return sink


def stop_sink(sink: subprocess.Popen[str] | None) -> dict[str, Any]:
    """Stop the sink; what it received ({"requests": N, "spans": M})."""
    if sink is None:
        return {}
    sink.terminate()
    try:
        out, _ = sink.communicate(timeout=15)
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        sink.kill()
        return {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    began = time.monotonic()
    commit = git_commit()  # what is measured: taken before, since the work tree may move during a long run
    try:
        if args.setup and (args.pa or any(name != "oipgen" for name in args.servers)):
            log("setting up the peers' environments and perf_analyzer (bench/setup.sh)")
            subprocess.run(["bash", str(BENCH / "setup.sh"), str(args.cache)], check=True, timeout=3600)
        usable = []
        for name in args.servers:
            reason = servers.missing(name, args.cache)
            if reason:
                log(f"{name} left out: {reason}")
            else:
                usable.append(name)
        args.servers = usable
        sink = None
        if args.observability and "oipgen" in args.servers:
            sink = start_sink(log)
        variants = [v for v in servers.OBSERVABILITY if args.observability and "oipgen" in args.servers]
        args.variants = [v for v in variants if not servers.missing(v, args.cache)]
        if args.wait_quiet:
            wait_for_quiet(args.wait_quiet, args.wait_max, log)
        load_before = load_average()
        log(f"load average {load_before}; floor of the 1M-element JSON identity")
        floor_result = floor(args)
        try:
            records = measure(args, log)
            records += measure_observability(args, log)
        finally:
            exported = stop_sink(sink)
        load_after = load_average()
    except KeyboardInterrupt:
        log("interrupted: the servers this run started are stopped")
        return 130
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "git": commit,
        "versions": tool_versions(args),
        "logging": servers.LOGGING,
        "reference": servers.REFERENCE,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "servers": args.servers,
        "variants": args.variants,
        "observability_rounds": 1 if args.quick else OBSERVABILITY_ROUNDS * args.repeats,
        "observability_window_s": args.observability_window_s,
        "otlp_sink": exported,
        "scenarios": args.scenarios,
        "repeats": args.repeats,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "elements": args.elements,
        "quick": args.quick,
        "elapsed_s": time.monotonic() - began,
        "server_cpu": SERVER_CPU,
        "client_cpu": CLIENT_CPU,
        "floors": args.floors,
    }
    document = {"meta": meta, "floor": floor_result, "records": records}
    (args.out / "results.json").write_text(json.dumps(document, indent=1) + "\n")
    summary = report.summarize(document)
    (args.out / "results.md").write_text(report.markdown(document, summary))
    chart = report.chart(document, summary, args.out / "bench.png")
    log(f"wrote {args.out / 'results.md'}, {args.out / 'results.json'}" + (f", {chart}" if chart else ""))
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
