"""perf_analyzer (the C++ load tool of the Triton client wheels), as it runs here.

Every real perf-analyzer wheel is built for glibc 2.38 and this machine has 2.36, so bench/setup.sh unpacks the
2.60.0 wheel and Debian 13's C/C++ runtime into the cache folder (never installed system-wide), and the binary is
started through that runtime's ld-linux. perf_analyzer needs the server's model configuration and statistics
extensions (`GET /v2/models/{m}/config`, `.../stats`, and their gRPC RPCs): `config_ok` checks the first.

perf_analyzer's own cost is measured with each run (its CPU time and peak memory, from wait4), because for large
tensors it, not the server, sets the pace: perf_analyzer 2.60 keeps a copy of every request's input tensors and
every response's output tensors for its profile export (InferContext::GetInputs / GetOutputs in
src/infer_context.cc, called for each request in sync mode, outside the latency it times). For a 4 MB identity that
is 8 MB of freshly faulted memory per request (about 12 ms of its CPU here, and gigabytes of RSS per run), so its
infer/s on those rows measures perf_analyzer. bench/run.py divides this CPU by the count of inferences the server's
statistics extension reports for the run, and marks the row client-bound.
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import loadgen

LIB = "debian13/usr/lib/x86_64-linux-gnu"

# Workloads perf_analyzer cannot send, and why (bench/run.py reports the reason instead of running it).
NOT_APPLICABLE = {
    "identity_rest_json": "perf_analyzer 2.60 writes a single JSON value for an FP32 [-1] input given `--shape` "
    '(on the wire: `"shape":[1000000],"data":[1.85e31]`), which Triton and oipgen both refuse (400)',
    "text_rest_json": "perf_analyzer 2.60 writes one JSON string for a BYTES input of 8 elements with "
    "`--input-tensor-format json`, which Triton and oipgen both refuse (400)",
    "generate": "perf_analyzer has no mode for the generate extension",
    "generate_stream": "perf_analyzer has no mode for the generate extension",
    "simple_contents_grpc": "perf_analyzer sends tensors in raw_input_contents only, never typed contents",
    "simple_params_rest": "perf_analyzer's --request-parameter is for gRPC only",
}

# How perf_analyzer sends each workload (see shared/research/bench-baselines.md for the arguments).
ARGS: dict[str, list[str]] = {
    "simple_rest": ["-i", "http", "-m", "simple", "--input-tensor-format", "json", "--output-tensor-format", "json"],
    "simple_grpc": ["-i", "grpc", "-m", "simple"],
    # the same in system shared memory (inputs and outputs): the server maps the regions perf_analyzer registers
    "simple_rest_shm": ["-i", "http", "-m", "simple", "--shared-memory", "system"],
    "simple_grpc_shm": ["-i", "grpc", "-m", "simple", "--shared-memory", "system"],
    "identity_rest_json": [
        "-i",
        "http",
        "-m",
        "identity_fp32",
        "--shape",
        "INPUT0:{elements}",
        "--input-tensor-format",
        "json",
        "--output-tensor-format",
        "json",
    ],
    "identity_rest_binary": ["-i", "http", "-m", "identity_fp32", "--shape", "INPUT0:{elements}"],
    "identity_grpc_raw": ["-i", "grpc", "-m", "identity_fp32", "--shape", "INPUT0:{elements}"],
    # the load generator's 8 strings (--input-data: `text_input_data`), binary over REST
    "text_rest_binary": ["-i", "http", "-m", "text", "--input-data", "{text_data}"],
    "text_grpc": ["-i", "grpc", "-m", "text", "--input-data", "{text_data}"],
    "batched_rest": ["-i", "http", "-m", "batched", "--input-tensor-format", "json", "--output-tensor-format", "json"],
    "batched_grpc": ["-i", "grpc", "-m", "batched"],
    # a decoupled model needs --async --streaming; it reports requests (final responses) and responses per second
    "decoupled_grpc": ["-i", "grpc", "-m", "decoupled", "--async", "--streaming"],
    "simple_params_grpc": ["-i", "grpc", "-m", "simple", *(
        arg for key, value in loadgen.PARAMETERS.items()
        for arg in ("--request-parameter", f"{key}:{str(value).lower() if isinstance(value, bool) else value}:"
                    f"{'bool' if isinstance(value, bool) else 'int' if isinstance(value, int) else 'string'}")
    )],
}


def text_input_data(folder: Path) -> Path:
    """The text workload's request (bench/loadgen.py's TEXT) as perf_analyzer's --input-data file."""
    path = folder / "text.json"
    strings = [s.decode() for s in loadgen.TEXT]
    path.write_text(json.dumps({"data": [{"INPUT0": {"content": strings, "shape": [len(strings)]}}]}))
    return path


def command(cache: Path) -> list[str] | None:
    """The argv prefix that runs perf_analyzer, or None when bench/setup.sh has not provided it."""
    lib = cache / LIB
    binary = cache / "perf_analyzer" / "perf_analyzer"
    loader = lib / "ld-linux-x86-64.so.2"
    if not (binary.exists() and loader.exists()):
        return None
    return [str(loader), "--library-path", str(lib), str(binary)]


def config_ok(rest: str, model: str = "simple") -> bool:
    """Whether the server answers `GET /v2/models/{model}/config` with 200 (perf_analyzer needs it)."""
    host, port = rest.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", f"/v2/models/{model}/config")
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def run(
    cache: Path,
    workload: str,
    rest: str,
    grpc: str,
    concurrency: int,
    elements: int = 1_000_000,
    window_ms: int = 3333,
    trials: int = 3,
    timeout: float = 180.0,
) -> dict[str, Any]:
    """One perf_analyzer measurement (sync mode, `trials` windows of `window_ms`); infer/s and latencies. When the
    windows disagree too much (a noisy machine), once more with 3 more windows; perf_analyzer's own CPU time and
    wall time then cover both attempts, as the server's counts around this call do."""
    result = _run_once(cache, workload, rest, grpc, concurrency, elements, window_ms, trials, timeout)
    if "stable measurement" not in result.get("error", ""):
        return result
    again = _run_once(cache, workload, rest, grpc, concurrency, elements, window_ms, trials + 3, timeout)
    for key in ("wall_s", "client_cpu_s", "client_sys_s"):
        if key in result and key in again:
            again[key] += result[key]
    if "client_maxrss_mib" in result and "client_maxrss_mib" in again:
        again["client_maxrss_mib"] = max(result["client_maxrss_mib"], again["client_maxrss_mib"])
    return again


def _run_once(
    cache: Path,
    workload: str,
    rest: str,
    grpc: str,
    concurrency: int,
    elements: int,
    window_ms: int,
    trials: int,
    timeout: float,
) -> dict[str, Any]:
    prefix = command(cache)
    result: dict[str, Any] = {"workload": workload, "concurrency": concurrency, "tool": "perf_analyzer"}
    if prefix is None:
        return {**result, "error": "perf_analyzer is not set up (bash bench/setup.sh)"}
    url = grpc if "grpc" in workload else rest
    with tempfile.TemporaryDirectory(prefix="oipgen-pa-") as tmp:
        args = [a.format(elements=elements, text_data=text_input_data(Path(tmp))) for a in ARGS[workload]]
        out = Path(tmp) / "pa.csv"
        argv = [
            *prefix,
            "-u",
            url,
            *args,
            "--concurrency-range",
            str(concurrency),
            "-p",
            str(window_ms),
            "-s",
            "100",
            "-r",
            str(trials),
            "-f",
            str(out),
        ]
        console = Path(tmp) / "console.txt"
        with console.open("w") as sink:
            began = time.monotonic()
            process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        returncode, usage = _wait(process, timeout)
        if returncode is None:
            return {**result, "error": f"perf_analyzer did not finish within {timeout:.0f} s"}
        result.update(
            wall_s=time.monotonic() - began,
            client_cpu_s=usage.ru_utime + usage.ru_stime,
            client_sys_s=usage.ru_stime,
            client_maxrss_mib=usage.ru_maxrss / 1024,
        )
        if returncode != 0 or not out.exists():
            lines = [line for line in console.read_text(errors="replace").splitlines() if line.strip()]
            errors = [line for line in lines if "rror" in line] or lines[-3:]
            return {**result, "error": f"exit {returncode}: " + " | ".join(errors[:3])[:500]}
        rows = list(csv.DictReader(out.open()))
    if not rows:
        return {**result, "error": "perf_analyzer wrote no result"}
    row = rows[0]
    try:
        figures = {
            "infer_per_s": float(row["Inferences/Second"]),
            "responses_per_s": float(row.get("Response Throughput") or row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000,
        }
    except (KeyError, ValueError) as exc:
        return {**result, "error": f"unexpected perf_analyzer CSV ({exc}): columns {sorted(row)}"}
    return {**result, **figures}


def _wait(process: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, os.struct_rusage]:
    """Wait (bounded) for `process`; its exit code (None: killed at the timeout) and its own resource usage."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage
        if time.monotonic() > deadline:
            process.send_signal(signal.SIGKILL)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            return None, usage
        time.sleep(0.05)
