"""The benchmark harness (bench/) in quick mode against our server only, so that it cannot rot.

No MLServer, KServe or perf_analyzer is installed here: `make bench` does that. What runs: the load generator on
every workload (responses checked, server CPU and memory read), `bench/run.py --quick` end to end with its
report and chart, `bench/scale.py`'s checks, and the report's ratios and targets on made-up peer figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import loadgen  # noqa: E402
import report  # noqa: E402
import scale  # noqa: E402
import servers  # noqa: E402


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with servers.running("oipgen", BENCH / ".cache", tmp_path_factory.mktemp("bench")) as server:
        yield server


@pytest.mark.parametrize("workload", loadgen.WORKLOADS)
def test_loadgen_measures_every_workload(ours: servers.Running, workload: str) -> None:
    result = loadgen.run(
        workload,
        ours.rest,
        ours.grpc,
        concurrency=2,
        duration=0.3,
        warmup=0.1,
        elements=1000,
        server_pid=ours.pid,
        timeout=10,
    )
    assert "error" not in result, result
    assert result["requests"] > 0 and result["errors"] == 0, result
    assert result["infer_per_s"] > 0 and 0 < result["p50_ms"] <= result["p99_ms"], result
    assert result["server_cpu_us_per_infer"] is not None and result["peak_rss_mib"] > 10, result
    assert ours.startup_s > 0 and ours.ready_rss_mib > 10


def test_loadgen_reports_a_wrong_server(ours: servers.Running) -> None:
    """A server that does not answer what was asked makes the workload fail with the reason, not count."""
    result = loadgen.run(
        "simple_rest",
        ours.rest.replace(str(ours.http_port), str(servers.free_port())),
        ours.grpc,
        duration=0.2,
        warmup=0.0,
        timeout=5,
    )
    assert "error" in result and "requests" not in result


def test_run_quick_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--quick",
            "--servers",
            "oipgen",
            "--no-setup",
            "--no-pa",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--elements",
            "10000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((out / "results.json").read_text())
    scenarios = {r["scenario"] for r in document["records"] if "error" not in r}
    assert scenarios == {"startup", *(s.name for s in __import__("run").SCENARIOS)}, document["records"]
    assert document["floor"]["floor_ms"] > 0
    text = (out / "results.md").read_text()
    assert "| simple gRPC c=8 |" in text and "## Targets" in text and "fails" not in text, text
    assert (out / "bench.png").stat().st_size > 10_000


def _record(server: str, scenario: str, rate: float, cpu: float, **extra: float) -> dict[str, object]:
    return {
        "server": server,
        "scenario": scenario,
        "tool": "loadgen",
        "repeat": 1,
        "infer_per_s": rate,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "server_cpu_us_per_infer": cpu,
        "peak_rss_mib": 100.0,
        "idle_rss_mib": 90.0,
        "payload_bytes": 4_000_000,
        **extra,
    }


def test_report_ratios_and_targets(tmp_path: Path) -> None:
    records = []
    for server, factor in (("oipgen", 3.0), ("mlserver", 1.0), ("kserve", 1.0)):
        for scenario in report.TITLES:
            records.append(_record(server, scenario, 1000 * factor, 300 / factor))
        records.append(
            {
                "server": server,
                "scenario": "startup",
                "tool": "harness",
                "repeat": 1,
                "startup_s": 0.5 * (2 - factor / 3),
            }
        )
    records.append(
        {"server": "mlserver", "scenario": "identity_rest_binary", "tool": "loadgen", "repeat": 2, "error": "HTTP 500"}
    )
    meta = {
        "date": "today",
        "host": "here",
        "cpus": 2,
        "python": "3.11",
        "load_average_before": [0.1, 0.1, 0.1],
        "load_average_after": [0.2, 0.2, 0.2],
        "servers": ["oipgen", "mlserver", "kserve"],
        "scenarios": list(report.TITLES),
        "repeats": 1,
        "duration_s": 1.0,
        "warmup_s": 0.1,
        "elements": 1_000_000,
        "elapsed_s": 60.0,
        "server_cpu": "0",
        "client_cpu": "1",
    }
    document = {"meta": meta, "floor": {"floor_ms": 0.05}, "records": records}
    summary = report.summarize(document)
    text = report.markdown(document, summary)
    assert "3.00x infer/s, 3.00x CPU" in text, text
    met = {target: ok for target, _, ok in report.targets(document, summary)}
    assert met["simple REST JSON c=8: >= 2.5x MLServer infer/s"] is True
    assert met["simple gRPC c=8: >= 2x the better of MLServer and KServe"] is True
    assert met["1M REST JSON: server CPU within 1.3x of the serialization floor"] is False  # 0.1 ms vs 0.05 ms
    assert "(1 of 2 runs failed)" in text
    assert report.chart(document, summary, tmp_path / "chart.png") is not None


def test_scale_checks() -> None:
    payload = [
        {"workload": w, "payload_bytes": size, "server_cpu_us_per_infer": 100 + size / 1000, "errors": 0}
        for w in scale.PAYLOAD_WORKLOADS
        for size in scale.SIZES
    ]
    concurrency = [
        {"workload": w, "concurrency": c, "infer_per_s": 1000.0, "errors": 0}
        for w in scale.CONCURRENCY_WORKLOADS
        for c in scale.CONCURRENCY
    ]
    assert all(ok for _, _, ok in scale.checks(payload, concurrency))
    concurrency[-1] = {**concurrency[-1], "infer_per_s": 100.0}  # collapse at c=64
    payload[-1] = {**payload[-1], "server_cpu_us_per_infer": 10 * payload[-1]["server_cpu_us_per_infer"]}  # superlinear
    failed = [text for text, _, ok in scale.checks(payload, concurrency) if not ok]
    assert len(failed) == 2, failed


@pytest.mark.parametrize("workload", ["identity_grpc_raw", "identity_rest_binary", "identity_rest_json"])
def test_large_tensors_round_trip(ours: servers.Running, workload: str) -> None:
    """400 KB tensors: the large-message paths (gRPC raw views and appended raw outputs), checked byte for byte."""
    result = loadgen.run(workload, ours.rest, ours.grpc, concurrency=1, duration=0.3, warmup=0.0, elements=100_000,
                         server_pid=ours.pid, timeout=20)  # fmt: skip
    assert "error" not in result and result["requests"] > 0 and result["errors"] == 0, result


def test_large_malformed_grpc_request_is_invalid(ours: servers.Running) -> None:
    import grpc

    with grpc.insecure_channel(ours.grpc) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for body in (b"\x3a\xff\xff\xff\x0f" + bytes(100_000), b"\x0a\x06simple" + b"\xff" * 100_000):
            with pytest.raises(grpc.RpcError) as caught:
                call(body, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value


def test_allocator_tuning() -> None:
    """`serve` keeps large buffers on the heap (glibc's mallopt); the MALLOC_* environment variables win. Run in
    fresh interpreters, so the malloc settings of the test process never change."""
    import platform
    import subprocess
    import sys

    from serving import server_env

    def tune(**env: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", "from oip.server import app; print(app.tune_allocator())"],
            env={**server_env(), **env}, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert tune(MALLOC_ARENA_MAX="4") == "False"
    if platform.libc_ver()[0] == "glibc":
        assert tune() == "True"
