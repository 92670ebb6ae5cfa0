"""The benchmark harness (bench/) in quick mode, so that it cannot rot.

What runs: the load generator on every workload against our server (responses checked, server CPU and memory read,
its count checked against the server's statistics), the floors (each kind of answer recorded from our server and
replayed by the bare transport, which the load generator checks as it checks a server), perf_analyzer on the
workloads it sends (its own counts against the server's), the requests the load generator writes as tritonclient
and KServe's client write them, `bench/run.py --quick` end to end with its report and chart on a few scenarios (one
of each kind: REST, gRPC, a stream, server-sent events), `bench/ab.py`'s paired turns of two builds or settings,
`bench/scale.py`'s checks, `bench/cost.py` through the server's HTTP layer, the report's ratios against
Triton, targets and client-bound marks on made-up figures, and Triton itself as `make bench` starts it, on every
workload (bench/setup.sh's Triton step alone: seconds and 370 MB the first time (with uv), cached in bench/.cache; then
about 30 s). MLServer and KServe are left to `make bench`.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import ROOT
from grpc_health.v1 import health_pb2, health_pb2_grpc

BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import ab  # noqa: E402
import loadgen  # noqa: E402
import report  # noqa: E402
import scale  # noqa: E402
import servers  # noqa: E402
import timeline  # noqa: E402


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


def test_loadgen_count_is_what_the_server_counted(ours: servers.Running) -> None:
    """Every request the load generator says completed, the server's statistics extension counted, no more."""
    before = servers.inference_count(ours)
    result = loadgen.run("simple_grpc", ours.rest, ours.grpc, concurrency=3, duration=0.3, warmup=0.1, timeout=10)
    after = servers.inference_count(ours)
    assert before is not None and after is not None
    assert result["completed"] >= result["requests"] > 0 and after - before == result["completed"], (result, before)


def test_memory_at_rest_is_measured_before_any_inference(ours: servers.Running) -> None:
    """The idle figures are read at start-up: a fresh server's statistics show no inference at that point, and
    PSS (shared pages split) is at most RSS."""
    assert 10 < ours.idle_pss_mib <= ours.idle_rss_mib, ours
    with servers.running("oipgen", BENCH / ".cache", Path(ours.log).parent / "fresh") as fresh:
        assert servers.inference_count(fresh) == 0
        stats = {model: servers.get_json(fresh.rest, f"/v2/models/{model}/stats") for model in servers.MODELS}
        # each model there, counted at 0 (not a statistics answer without the model, which would also add up to 0)
        assert all(s is not None and [e["inference_count"] for e in s["model_stats"]] == [0] for s in stats.values()), \
            stats
        assert 10 < fresh.idle_pss_mib <= fresh.idle_rss_mib
        assert fresh.metadata.get("name") and fresh.metadata.get("version")


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


@pytest.mark.parametrize("workload", ["simple_rest", "generate_stream", "text_grpc", "decoupled_grpc"])
def test_a_floor_replays_our_answer_as_it_was_sent(ours: servers.Running, workload: str, tmp_path: Path) -> None:
    """Each kind of answer (REST, server-sent events, gRPC unary, a gRPC stream), recorded from our server and served
    by the bare transport: the load generator checks the floor's answers as it checks a server's (values, event by
    event, message by message), and reads the floor's CPU."""
    answer = tmp_path / "answer.json"
    servers.record_answer(ours, workload, 1000, answer)
    recorded = json.loads(answer.read_text())
    assert recorded["transport"] == ("grpc" if "grpc" in workload else "rest")
    assert len(recorded["chunks"]) == {"generate_stream": 16, "decoupled_grpc": 101}.get(workload, 1)
    floor = servers.start_floor(answer, tmp_path)
    try:
        assert floor.process.poll() is None
        result = loadgen.run(workload, floor.rest, floor.grpc, concurrency=2, duration=0.3, warmup=0.1,
                             server_pid=floor.pid, timeout=10)
    finally:
        servers.stop(floor)
    assert "error" not in result and result["requests"] > 0 and result["errors"] == 0, result
    assert result["server_cpu_us_per_infer"] is not None and result["server_cpu_us_per_infer"] > 0, result


@pytest.mark.parametrize("workload", ["text_grpc", "batched_grpc"])
def test_a_grpc_floor_answers_where_our_server_does(ours: servers.Running, workload: str, tmp_path: Path) -> None:
    """Our server answers a unary call to an inline model in grpcio's polling thread, dynamically batched or not
    (any other model's in a pool thread: `text_tokens`, not inline): so does the floor replaying its answer (an
    answer in the polling thread starts no thread in the floor's process)."""
    assert not servers.answered_in_polling_thread("text_tokens")
    in_polling_thread = servers.answered_in_polling_thread(servers.WORKLOAD_MODEL[workload])
    assert in_polling_thread
    answer = tmp_path / "answer.json"
    servers.record_answer(ours, workload, 1000, answer)
    floor = servers.start_floor(answer, tmp_path)
    try:
        before = len(os.listdir(f"/proc/{floor.pid}/task"))
        result = loadgen.run(workload, floor.rest, floor.grpc, concurrency=2, duration=0.3, warmup=0.1, timeout=10)
        after = len(os.listdir(f"/proc/{floor.pid}/task"))
    finally:
        servers.stop(floor)
    assert result["requests"] > 0 and result["errors"] == 0, result
    assert (after == before) is in_polling_thread, (before, after)


def test_a_wrong_answer_is_not_recorded(ours: servers.Running, tmp_path: Path) -> None:
    """Recording checks the answer: a server that answers another model's answer (a floor replaying `simple`'s, asked
    for `text`) gives no floor to replay, nor one that does not answer at all."""
    simple = tmp_path / "simple.json"
    servers.record_answer(ours, "simple_grpc", 1000, simple)
    floor = servers.start_floor(simple, tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"recording text_grpc's answer failed.*wrong gRPC outputs"):
            servers.record_answer(floor, "text_grpc", 1000, tmp_path / "text.json", timeout=5)
    finally:
        servers.stop(floor)
    closed = servers.Running(ours.name, ours.process, ours.http_port, servers.free_port(), ours.log)
    with pytest.raises(RuntimeError, match="recording"):
        servers.record_answer(closed, "simple_grpc", 1000, tmp_path / "none.json", timeout=5)
    assert not (tmp_path / "text.json").exists() and not (tmp_path / "none.json").exists()


def test_requests_are_written_as_the_clients_write_them() -> None:
    """The typed-contents form of `simple` is byte for byte what KServe's client writes for inputs given as lists
    (`InferRequest.to_grpc`, from KServe's own package when bench/setup.sh has installed it); the parameters forms
    carry the parameters as tritonclient writes them (its own request builders)."""
    from tritonclient.grpc import service_pb2 as pb

    message, _, _ = loadgen.grpc_request("simple_contents_grpc", 16)
    assert not message.raw_input_contents and [i.contents.int_contents[:3] for i in message.inputs] == [
        [0, 1, 2], [1, 1, 1]]
    kserve = BENCH / ".cache" / "venv-kserve" / "bin" / "python"
    if kserve.exists():
        code = (
            "import sys; from kserve import InferInput, InferRequest\n"
            "inputs = [InferInput('INPUT0', [1, 16], 'INT32', list(range(16))),\n"
            "          InferInput('INPUT1', [1, 16], 'INT32', [1] * 16)]\n"
            "sys.stdout.buffer.write(InferRequest('simple', inputs).to_grpc().SerializeToString())"
        )
        done = subprocess.run([str(kserve), "-c", code], capture_output=True, timeout=120, check=True)
        assert pb.ModelInferRequest.FromString(done.stdout) == message
    params, _, _ = loadgen.grpc_request("simple_params_grpc", 16)
    assert {k: v.WhichOneof("parameter_choice") for k, v in params.parameters.items()} == {
        "request_tag": "string_param", "max_tokens": "int64_param", "stream": "bool_param"}
    rest = loadgen.rest_request("simple_params_rest", 16)
    length = int(rest.headers["Inference-Header-Content-Length"])
    header = json.loads(rest.body[:length])
    assert header["parameters"] == {"binary_data_output": True, **loadgen.PARAMETERS}
    assert len(rest.body) == length + 2 * 64  # both inputs binary, as tritonclient sends them by default


def perf_analyzer_set_up() -> Path:
    """The bench cache folder, with perf_analyzer in it (bench/setup.sh's perf_analyzer step, run when missing)."""
    import pa

    cache = BENCH / ".cache"
    if pa.command(cache) is None:
        done = subprocess.run(["bash", str(BENCH / "setup.sh"), str(cache)],
                              env={**os.environ, "BENCH_SETUP_ONLY": "perf_analyzer"},
                              capture_output=True, text=True, timeout=1200, check=False)
        assert done.returncode == 0, f"bench/setup.sh failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return cache


@pytest.mark.parametrize("workload", ["text_rest_binary", "text_grpc", "batched_rest", "batched_grpc",
                                      "decoupled_grpc", "simple_params_grpc"])
def test_perf_analyzer_sends_the_new_workloads(ours: servers.Running, workload: str) -> None:
    """perf_analyzer (from bench/setup.sh's perf_analyzer step) completes a run of each workload it can send
    against our server, and the server counted the inferences it reports."""
    import pa

    cache = perf_analyzer_set_up()
    before = servers.inference_count(ours)
    result = pa.run(cache, workload, ours.rest, ours.grpc, 2, window_ms=300, trials=6, timeout=300)
    after = servers.inference_count(ours)
    assert "error" not in result and result["infer_per_s"] > 0, result
    assert before is not None and after is not None and after - before > result["infer_per_s"] * 0.3 * 0.5
    if workload == "decoupled_grpc":  # requests and their 100 responses each
        assert result["responses_per_s"] == pytest.approx(100 * result["infer_per_s"], rel=0.05), result


QUICK_SCENARIOS = ("simple_grpc_c1", "identity_rest_binary", "text_rest_json_c1", "decoupled_grpc_c8",
                   "generate_stream_c8")


def test_run_quick_writes_the_report(tmp_path: Path) -> None:
    """`bench/run.py --quick` on one scenario of each kind (gRPC unary, a large tensor, REST JSON, a gRPC stream,
    server-sent events), floors included: every measurement and every floor answered, the report written."""
    out = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--quick",
            "--servers",
            "oipgen",
            "--scenarios",
            ",".join(QUICK_SCENARIOS),
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
    ours = {r["scenario"] for r in document["records"] if "error" not in r and r["server"] == "oipgen"}
    assert ours == {"startup", *QUICK_SCENARIOS}, document["records"]
    floors = {r["scenario"]: r for r in document["records"] if r["server"] == "floor"}
    small = {name for name in QUICK_SCENARIOS if __import__("scenarios").BY_NAME[name].floor}
    assert set(floors) == small and "identity_rest_binary" not in small
    for record in floors.values():  # the bare transport answered the recorded answers, checked as a server's are
        assert "error" not in record and record["requests"] > 0 and record["errors"] == 0, record
        assert record["server_cpu_us_per_infer"] > 0 and "server_count" not in record, record
    assert document["floor"]["floor_ms"] > 0
    meta = document["meta"]
    assert len(meta["git"]["sha"]) == 40 and meta["versions"]["oipgen"]["oipgen"] and meta["versions"]["loadgen"]
    measured = [r for r in document["records"] if r["tool"] == "loadgen" and r["server"] == "oipgen"]
    for record in measured:  # the server's own count, its log and the load average go with every measurement
        assert record["server_count"] == record["completed"] > 0, record
        assert record["log_bytes_per_request"] == 0 and len(record["load_average"]) == 3, record
    stream = next(r for r in measured if r["scenario"] == "decoupled_grpc_c8")
    assert stream["responses_per_request"] == 101 and stream["responses_per_s"] > 100 * stream["infer_per_s"]
    startup = next(r for r in document["records"] if r["scenario"] == "startup")
    assert startup["idle_pss_mib"] > 10 and startup["server_metadata"]["version"], startup
    text = (out / "results.md").read_text()
    assert "| simple gRPC c=1 |" in text and "## Targets" in text and "fails" not in text, text
    assert "| decoupled x100 gRPC stream c=8 | loadgen |" in text, text  # no Triton: ranked by loadgen
    assert "server CPU per request <= 1.3x the bare transport's" in text, text
    assert f"{len(measured)} of {len(measured)} measurements agree exactly" in text, text
    assert "Triton 2.51 was not part of this run" in text, text
    assert (out / "bench.png").stat().st_size > 10_000


def test_ab_runs_each_side_as_given(tmp_path: Path) -> None:
    """`bench/ab.py`: two servers in paired turns, each started as its side says: A from a copy of the package
    whose default server name was changed (so that the name in A's `GET /v2` shows which build answered), B with a
    serve flag and an environment variable; each side's answers counted, the paired ratios summarized."""
    package = tmp_path / "package"
    shutil.copytree(ROOT / "generated" / "oip", package / "oip", ignore=shutil.ignore_patterns("__pycache__"))
    settings = package / "oip" / "server" / "settings.py"
    text = settings.read_text()
    assert 'server_name: str = "oip"' in text
    settings.write_text(text.replace('server_name: str = "oip"', 'server_name: str = "copied-build"'))
    out = tmp_path / "ab.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "ab.py"), "simple_rest", "-c", "2", "--rounds", "2", "-d", "0.3", "-w", "0.1",
         "--a-package", str(package), "--b-serve", "--server-name b-side", "--b-env", "OIP_AB_MARK=seen",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    sides = document["meta"]["sides"]
    assert sides["A"]["metadata"]["name"] == "copied-build" and sides["B"]["metadata"]["name"] == "b-side"
    assert sides["A"]["environ"] == {} and sides["B"]["environ"] == {"OIP_AB_MARK": "seen"}
    assert len(document["rounds"]) == 2
    for paired in document["rounds"]:
        for side in ("A", "B"):
            assert "error" not in paired[side] and paired[side]["completed"] > 0, paired
            assert paired[side]["errors"] == 0 and paired[side]["server_cpu_us_per_infer"] > 0, paired
    assert document["summary"]["ratio_infer_per_s"]["rounds"] == 2
    assert "| paired B/A | median |" in done.stdout and "--server-name b-side" in done.stdout


def test_ab_takes_turns_with_perf_analyzer(tmp_path: Path) -> None:
    """`bench/ab.py --perf-analyzer`: each turn is a perf_analyzer run, whose inferences the server counted and
    whose server CPU per inference is over that count; a workload perf_analyzer cannot send is refused."""
    perf_analyzer_set_up()
    out = tmp_path / "ab.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "ab.py"), "simple_grpc", "-c", "1", "--rounds", "1", "-d", "0.3",
         "--perf-analyzer", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["meta"]["tool"] == "perf_analyzer" and "(perf_analyzer" in done.stdout
    for side in ("A", "B"):
        turn = document["rounds"][0][side]
        assert turn["tool"] == "perf_analyzer" and turn["server_count"] >= turn["infer_per_s"] * 0.3, turn
        assert turn["server_cpu_us_per_infer"] > 0, turn
    refused = subprocess.run([sys.executable, str(BENCH / "ab.py"), "text_rest_json", "--perf-analyzer"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "perf_analyzer does not send text_rest_json" in refused.stderr


def test_timeline_reads_each_cycle_on_the_reply_socket() -> None:
    """`bench/timeline.py`'s reading of a syscall recording: the socket is the one written the most bytes (an
    eventfd's 8-byte writes are not it), a read that returned nothing and a request's second read do not start a
    cycle, "after" is the writing thread's next wait only when that thread reads the next request after it, and
    "idle" is the reading thread's wait for a request, counted only when it began after the reply before it."""
    def enter(tid: int, at: float, number: int, fd: int) -> str:
        return f"{tid} {at:.6f}: raw_syscalls:sys_enter: NR {number} ({fd:x}, 7f00, 0, 0, 0, 0)"

    def leave(tid: int, at: float, number: int, result: int) -> str:
        return f"{tid} {at:.6f}:  raw_syscalls:sys_exit: NR {number} = {result}"

    sock, event = 0x13, 0xB
    lines = [
        "a line perf prints that is no event",
        enter(7, 1.000000, 47, sock), leave(7, 1.000002, 47, -11),  # EAGAIN: no request yet
        enter(7, 1.000010, 47, sock), leave(7, 1.000020, 47, 600),  # request 1 read
        enter(7, 1.000030, 47, sock), leave(7, 1.000040, 47, 31),  # its rest
        enter(8, 1.000050, 1, event), leave(8, 1.000051, 1, 8),  # another thread's eventfd
        enter(8, 1.000060, 232, 0xC), leave(8, 1.000900, 232, 1),  # another thread waits
        enter(7, 1.000220, 46, sock), leave(7, 1.000230, 46, 641),  # reply 1: server 200 us
        enter(7, 1.000280, 232, 0xC), leave(7, 1.000500, 232, 1),  # waits 50 us after the reply
        enter(7, 1.000510, 47, sock), leave(7, 1.000520, 47, 631),  # request 2: client 300 us
        enter(7, 1.000620, 46, sock), leave(7, 1.000630, 46, 641),  # reply 2: server 100 us
        enter(7, 1.000700, 47, sock), leave(7, 1.000720, 47, 631),  # request 3 (client 100 us), no wait before
        enter(7, 1.000800, 232, 0xC), leave(7, 1.000810, 232, 1),
        enter(7, 1.000900, 46, sock),  # no exit recorded: left out
    ]
    found = timeline.timeline(timeline.calls(lines))
    assert found == {"socket": sock, "cycles": 2, "server_us": 150.0, "after_us": 50.0, "client_us": 200.0,
                     "idle_us": 220.0}
    assert timeline.timeline([])["cycles"] == 0


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_timeline_records_our_server(tmp_path: Path) -> None:
    """`bench/timeline.py` end to end on our server: the cycles it read from the recording, each the server's share
    and the client's, span about the second recorded; our polling thread's work after each reply and its wait for
    the next request are found."""
    probe = subprocess.run(["perf", "record", "-q", "-e", "raw_syscalls:sys_enter", "-o", str(tmp_path / "probe"),
                            "--", "true"], capture_output=True, check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("perf cannot record system calls here: " + probe.stderr.decode(errors="replace")[-200:])
    out = tmp_path / "timeline.json"
    assert timeline.main(["simple_grpc", "-d", "1", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["server_us"] > 0 and found["client_us"] > 0, found
    assert found["after_us"] is not None and found["idle_us"] is not None, found
    cycle_s = (found["server_us"] + found["client_us"]) / 1e6
    assert 0.3 < found["cycles"] * cycle_s < 1.5, found  # the cycles recorded span about the second recorded


def test_ab_summary_pairs_the_rounds() -> None:
    """The paired ratios are B over A round by round (not a ratio of medians), and B is better on CPU when lower."""
    def side(rate: float, cpu: float) -> dict[str, float]:
        return {"infer_per_s": rate, "server_cpu_us_per_infer": cpu, "p50_ms": 1.0}

    rounds = [{"A": side(100, 200), "B": side(110, 190)}, {"A": side(50, 400), "B": side(60, 350)},
              {"A": side(200, 100), "B": side(180, 110)}, {"A": side(90, 210), "B": {"error": "down"}}]
    summary = ab.compare(rounds)  # type: ignore[arg-type]
    ratio = summary["ratio_infer_per_s"]
    assert ratio["rounds"] == 3 and ratio["b_better"] == 2
    assert ratio["median"] == pytest.approx(1.1) and ratio["low"] == pytest.approx(0.9)
    assert ratio["high"] == pytest.approx(1.2)
    cpu = summary["ratio_server_cpu_us_per_infer"]
    assert cpu["b_better"] == 2 and cpu["median"] == pytest.approx(0.95)
    assert summary["A"]["infer_per_s"] == 95 and summary["B"]["errors"] == 1


def test_ab_refuses_a_package_folder_without_the_package(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "ab.py"), "simple_rest", "--a-package", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "no oip package there" in done.stderr, done.stderr


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
    records: list[dict[str, object]] = []
    for server, factor in (("oipgen", 3.0), ("triton", 2.0), ("mlserver", 1.0), ("kserve", 1.0)):
        for scenario in report.TITLES:
            records.append(_record(server, scenario, 1000 * factor, 300 / factor))
        records.append(
            {
                "server": server,
                "scenario": "startup",
                "tool": "harness",
                "repeat": 1,
                "startup_s": 0.5 * (2 - factor / 3),
                "idle_rss_mib": 80.0 * factor,
                "idle_pss_mib": 50.0 * factor,
            }
        )
    records.append(
        {"server": "mlserver", "scenario": "identity_rest_binary", "tool": "loadgen", "repeat": 2, "error": "HTTP 500"}
    )
    for record in records:  # KServe logs a 92-byte line per request, the others nothing
        if record["tool"] == "loadgen":
            record.update(answered=100, log_bytes=9200 if record["server"] == "kserve" else 0)
    # perf_analyzer: one client-bound row (3x the server's CPU per inference), one not (a fifth of it)
    for scenario, client in (("identity_grpc_raw", 1200.0), ("simple_grpc_c8", 80.0)):
        pa_record = _record("oipgen", scenario, 50.0, 400.0, client_cpu_us_per_infer=client)
        records.append({**pa_record, "tool": "perf_analyzer"})
    meta = {
        "date": "today",
        "host": "here",
        "cpus": 2,
        "python": "3.11",
        "git": {"sha": "0123456789abcdef" * 2 + "01234567", "dirty": False},
        "versions": {"oipgen": {"oipgen": "0.1.0"}, "perf_analyzer": {"perf-analyzer": "2.60.0"}},
        "reference": "triton",
        "load_average_before": [0.1, 0.1, 0.1],
        "load_average_after": [0.2, 0.2, 0.2],
        "servers": ["oipgen", "triton", "mlserver", "kserve"],
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
    # the first table: every server against Triton (oipgen 3x its figures, MLServer and KServe half), memory too
    first = text.split("## Against Triton 2.51", 1)[1].split("##", 1)[0]
    assert text.index("## Against Triton 2.51") < text.index("## Every server"), text
    half = "**0.50x** · 0.50x CPU"
    assert f"| simple gRPC c=8 | 2,000 | **1.50x** · 1.50x CPU | {half} | {half} |" in first, first
    memory = "| memory at rest (PSS; lower is better) | 100 MiB | 1.50x the memory | 0.50x the memory |"
    assert memory + " 0.50x the memory |" in first, first
    assert "KServe 0.21.0 92.0. **Not held by KServe 0.21.0**." in text and "oipgen 0.0," in text, text
    assert "commit `0123456789ab`" in text and "perf-analyzer 2.60.0" in text, text
    pa_rows = [line for line in text.splitlines() if line.startswith("| oipgen | ") and "counted by" in line]
    assert len(pa_rows) == 2 and ("client-bound" in pa_rows[0]) != ("client-bound" in pa_rows[1]), pa_rows
    met = {target: ok for target, _, ok in report.targets(document, summary)}
    assert met["simple REST JSON c=8: >= 2.5x MLServer infer/s"] is True
    assert met["simple gRPC c=8: >= 2x the better of MLServer and KServe"] is True
    assert met["simple gRPC c=8: >= Triton's infer/s"] is True
    assert met["1M REST JSON: server CPU within 1.3x of the serialization floor"] is False  # 0.1 ms vs 0.05 ms
    # peak memory against the memory at rest before any inference: 100 MiB peak vs 240 MiB at rest + 4 x 3.8 MiB
    assert met["identity 1M FP32 gRPC raw: peak memory <= memory at rest + 4x payload"] is True
    records.append({**_record("oipgen", "identity_grpc_raw", 3000.0, 100.0), "peak_rss_mib": 260.0, "repeat": 2})
    records.append({**_record("oipgen", "identity_grpc_raw", 3000.0, 100.0), "peak_rss_mib": 260.0, "repeat": 3})
    met = {target: ok for target, _, ok in report.targets(document, report.summarize(document))}
    assert met["identity 1M FP32 gRPC raw: peak memory <= memory at rest + 4x payload"] is False
    assert "(1 of 2 runs failed)" in text
    assert report.chart(document, summary, tmp_path / "chart.png") is not None


def test_report_holds_every_scenario_to_triton_and_the_floor(tmp_path: Path) -> None:
    """Issue 30's targets from made-up figures: a new scenario against Triton's throughput and CPU (from the
    scenario's own load generator where both have its figures), `simple`'s ratios and latency, and our CPU per
    request over the bare transport's floor."""
    records: list[dict[str, object]] = []
    for scenario in report.TITLES:
        records.append(_record("oipgen", scenario, 3000.0, 120.0))
        records.append(_record("triton", scenario, 2000.0, 150.0))
        records.append(_record("floor", scenario, 9000.0, 100.0))
    # text gRPC c=8 is ranked by perf_analyzer: there ours is slower than Triton, with loadgen faster
    records.append({**_record("oipgen", "text_grpc_c8", 900.0, 200.0), "tool": "perf_analyzer"})
    records.append({**_record("triton", "text_grpc_c8", 1000.0, 150.0), "tool": "perf_analyzer"})
    records.append({**_record("floor", "simple_grpc_c8", 9000.0, 80.0), "repeat": 2})  # the floor's median: 90
    records.append({**_record("triton", "simple_grpc_c1", 3000.0, 150.0), "tool": "perf_analyzer"})
    for record in records:  # the bare transport's memory over its memory at rest, on the large gRPC tensor
        if record["scenario"] == "identity_grpc_raw":
            record.update(rest_rss_mib=60.0 if record["server"] == "floor" else 90.0)
            if record["server"] == "floor":
                record["peak_rss_mib"] = 80.0
    for record in records:
        if record["server"] == "triton" and record["scenario"] == "simple_grpc_c1" and record["tool"] == "loadgen":
            record["p50_ms"] = 0.5  # Triton's latency below ours
        if record["server"] == "floor" and record["scenario"] == "simple_grpc_c1":
            record["p50_ms"] = 0.45  # the bare transport's latency, below Triton's and ours
        if record["server"] == "floor" and record["scenario"] == "batched_grpc_c32":
            record["server_cpu_us_per_infer"] = 180.0  # the bare transport alone above Triton's CPU
    meta = {"date": "today", "host": "here", "cpus": 2, "python": "3.11", "git": {"sha": "0" * 40, "dirty": False},
            "versions": {}, "reference": "triton", "load_average_before": [0.1] * 3, "load_average_after": [0.2] * 3,
            "servers": ["oipgen", "triton"], "scenarios": list(report.TITLES), "repeats": 1, "duration_s": 1.0,
            "warmup_s": 0.1, "elements": 1_000_000, "elapsed_s": 60.0, "server_cpu": "0", "client_cpu": "1",
            "floors": True}
    document = {"meta": meta, "floor": {}, "records": records}
    summary = report.summarize(document)
    met = {target: (what, ok) for target, what, ok in report.targets(document, summary)}
    new = "text gRPC c=8: >= Triton's infer/s, <= its server CPU per inference"
    assert met[new] == ("0.90x infer/s, 1.33x the CPU (200 vs 150 us; perf_analyzer)", False)
    assert met["text REST JSON c=8: >= Triton's infer/s, <= its server CPU per inference"][1] is True
    assert met["simple REST JSON c=8: >= 1.5x Triton's infer/s"][1] is True  # 3000 vs 2000
    assert met["simple gRPC c=8: >= 1.3x Triton's infer/s"][1] is True
    assert met["identity 1M FP32 gRPC raw c=1: >= 1.5x Triton's infer/s"][1] is True
    assert met["simple REST JSON c=1: p50 latency <= Triton's"][1] is True  # 1.0 ms both
    assert met["simple gRPC c=1: p50 latency <= Triton's"] == (
        "1.000 vs 0.500 ms (loadgen); the bare transport alone: 0.450 ms", False)
    floor = "server CPU per request <= 1.3x the bare transport's"
    assert met[f"simple REST JSON c=8: {floor}"] == ("120 vs 100 us = 1.20x", True)
    assert met[f"simple gRPC c=8: {floor}"] == ("120 vs 90 us = 1.33x", False)
    assert not any(name.startswith("identity") and floor in name for name in met)
    batched = met["batched gRPC c=32: >= Triton's infer/s, <= its server CPU per inference"]
    assert batched == ("1.50x infer/s, 0.80x the CPU (120 vs 150 us; loadgen); the bare transport alone spends 180 us "
                       "per request, 1.20x Triton's 150 us", True)
    assert "bare transport alone" not in met[new][0]  # the floor below Triton's CPU: nothing to say
    memory = met["identity 1M FP32 gRPC raw: peak memory <= memory at rest + 4x payload"][0]
    assert memory.endswith("; the bare transport answering the same bytes grows 20.0 MiB, 5.2x the payload"), memory
    text = report.markdown(document, summary)
    row = next(line for line in text.splitlines() if line.startswith("| text gRPC c=8 |"))
    assert row.startswith("| text gRPC c=8 | perf_analyzer | 900 · 1.00 ms | 1,000 · 1.00 ms | 0.90x | 200 us | "
                          "150 us | 1.33x | 100 us | 1.20x | 0.67x |"), row
    row = next(line for line in text.splitlines() if line.startswith("| batched gRPC c=32 |"))
    assert row.endswith("| 180 us | 0.67x | 1.20x |"), row


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


def test_scale_lays_out_the_cores_and_says_when_the_load_shares_one() -> None:
    assert scale.layout(2) == (["0", "1"], ["1"])
    assert scale.layout(8) == (["0", "1", "2", "3", "4", "5"], ["6", "7"])
    assert scale.layout(16)[1] == ["12", "13", "14", "15"]
    assert scale.worker_counts(6) == [1, 2, 4, 6] and scale.worker_counts(2) == [1, 2]
    rows = [{"workers": n, "workload": w, "infer_per_s": 1000.0 * n, "p50_ms": 1.0, "p99_ms": 2.0,
             "server_cpu_us_per_infer": 100.0, "errors": 0} for n in (1, 2) for w in scale.CONCURRENCY_WORKLOADS]
    for server_cpus, client_cpus in (scale.layout(2), scale.layout(8)):
        document = {"meta": {"date": "today", "load_average_before": [0.1] * 3, "load_average_after": [0.1] * 3,
                             "duration_s": 1.0, "quick": True,
                             "workers": {"server_cpus": server_cpus, "client_cpus": client_cpus}},
                    "payload": [], "concurrency": [], "workers": rows, "checks": []}
        text = scale.markdown(document)
        assert "| simple_grpc | 2 | 2,000 | 1.00 / 2.00 | 100 | 2.00x |" in text, text
        assert ("The load generator shares CPU 1 with the server" in text) == (client_cpus == ["1"]), text


def test_load_from_several_processes_adds_up(ours: servers.Running) -> None:
    """One load generator per client core at once (here both on CPU 1): their requests add up, every one answered
    and counted by the server."""
    before = servers.inference_count(ours)
    result = servers.run_loadgen_on(ours, "simple_grpc", ["1", "1"], concurrency=3, duration=0.3, warmup=0.1,
                                    elements=16, request_timeout=10)
    after = servers.inference_count(ours)
    assert "error" not in result and result["errors"] == 0 and result["client_cpus"] == ["1", "1"], result
    assert before is not None and after is not None and after - before == result["completed"] > result["requests"]
    assert result["server_cpu_us_per_infer"] > 0 and result["infer_per_s"] > 0


def _identity(ours: servers.Running, workload: str, data: np.ndarray) -> np.ndarray:
    """`data` sent to identity_fp32 as `workload` sends it; the FP32 tensor the server answered."""
    import grpc
    import httpx
    from oip.grpc import grpc_service_pb2 as pb

    if workload == "identity_grpc_raw":
        request = pb.ModelInferRequest(model_name="identity_fp32")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[data.size])
        request.raw_input_contents.append(data.tobytes())
        with grpc.insecure_channel(ours.grpc) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                       request_serializer=pb.ModelInferRequest.SerializeToString,
                                       response_deserializer=pb.ModelInferResponse.FromString)
            reply = call(request, timeout=20)
        assert [tuple(o.shape) for o in reply.outputs] == [(data.size,)], reply.outputs
        return np.frombuffer(reply.raw_output_contents[0], dtype="<f4")
    url = f"http://{ours.rest}/v2/models/identity_fp32/infer"
    if workload == "identity_rest_json":
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [data.size], "data": data.tolist()}]}
        answer = httpx.post(url, json=body, timeout=20, trust_env=False)
        assert answer.status_code == 200, answer.text[:300]
        return np.asarray(answer.json()["outputs"][0]["data"], dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [data.size],
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    answer = httpx.post(url, content=header + data.tobytes(), timeout=20, trust_env=False, headers={
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 200, answer.text[:300]
    length = int(answer.headers["Inference-Header-Content-Length"])
    return np.frombuffer(answer.content[length:], dtype="<f4")


@pytest.mark.parametrize("workload", ["identity_grpc_raw", "identity_rest_binary", "identity_rest_json"])
def test_large_tensors_round_trip(ours: servers.Running, workload: str) -> None:
    """400 KB tensors: the large-message paths (gRPC raw views and appended raw outputs), checked byte for byte.
    The load generator checks its first answer and the size of the others (its requests are all alike); then
    eight different tensors, four at a time, each answer checked against its own request."""
    result = loadgen.run(workload, ours.rest, ours.grpc, concurrency=1, duration=0.3, warmup=0.0, elements=100_000,
                         server_pid=ours.pid, timeout=20)  # fmt: skip
    assert "error" not in result and result["requests"] > 0 and result["errors"] == 0, result
    tensors = [np.random.default_rng(seed).random(100_000, dtype=np.float32) for seed in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda data: _identity(ours, workload, data), tensors))
    for seed, (sent, answered) in enumerate(zip(tensors, answers, strict=True)):
        assert np.array_equal(answered, sent), f"tensor {seed}: the answer is not what was sent"


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
            [sys.executable, "-c", "from oip.server.process import allocator; print(allocator.tune_allocator())"],
            env={**server_env(), **env}, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert tune(MALLOC_ARENA_MAX="4") == "False"
    if platform.libc_ver()[0] == "glibc":
        assert tune() == "True"


def test_cost_runs_rest_requests_through_the_servers_http_layer() -> None:
    """bench/cost.py sends each REST request as bytes through the HTTP layer `serve` runs (`http_in_process`): a
    small inference is answered the direct way (no task), a chunked one the ASGI way, with the same answer; and
    cost.py itself measures workloads of each kind, every answer checked."""
    import asyncio

    import http_in_process
    from oip.server import Assembly, ModelRepository, Settings

    async def main() -> None:
        settings = Settings()
        repository = ModelRepository(BENCH / "servers" / "oipgen_repo")
        await repository.load_all()
        app = Assembly.build(repository, settings).rest_app()
        connection = http_in_process.Connection(app, settings)
        request = loadgen.rest_request("simple_rest", 16)
        head = f"POST {request.path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        direct = http_in_process.parse(await connection.request(
            f"{head}content-length: {len(request.body)}\r\n\r\n".encode() + request.body))
        assert not connection.protocol.tasks  # answered within the read: no ASGI task
        chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(request.body), request.body)
        chunked = http_in_process.parse(await connection.request(
            f"{head}transfer-encoding: chunked\r\n\r\n".encode() + chunks))
        assert direct[0] == chunked[0] == 200 and direct[2] == chunked[2]
        assert json.loads(direct[2])["outputs"][0]["data"] == (loadgen.SIMPLE_A + loadgen.SIMPLE_B)[0].tolist()
        connection.close()
        await repository.unload_all()

    asyncio.run(main())
    workloads = ("simple_rest", "text_rest_binary", "batched_rest", "generate", "generate_stream", "simple_grpc")
    done = subprocess.run([sys.executable, str(BENCH / "cost.py"), "--workloads", ",".join(workloads),
                           "--requests", "40"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(workloads)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="bench/cost.py --instructions needs valgrind")
def test_cost_counts_the_instructions_a_request_takes(tmp_path: Path) -> None:
    """`cost.py --instructions --package DIR` counts the instructions per request of the package in DIR: a copy of
    ours whose lean gRPC way does more work per request (a sum over 5,000 numbers) counts that much more than ours,
    and ours counts the same twice over (start-up and loading cancel out, a package's first run compiling it too)."""
    heavier = tmp_path / "heavier"
    shutil.copytree(ROOT / "generated" / "oip", heavier / "oip", ignore=shutil.ignore_patterns("__pycache__"))
    with (heavier / "oip" / "server" / "grpc" / "in_thread.py").open("a") as module:
        module.write("\n_lean_call = UnaryInfer.__call__\n"
                     "UnaryInfer.__call__ = lambda self, *a, **k: (sum(range(5000)), _lean_call(self, *a, **k))[1]\n")

    # As on a fresh checkout: Python may write bytecode, and the heavier copy has none yet.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def count(package: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(BENCH / "cost.py"), "--instructions", "--workloads", "simple_grpc",
                                 "--requests", "60", "--package", str(package)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    running = [count(ROOT / "generated"), count(heavier), count(ROOT / "generated")]
    counts = []
    for process in running:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        name, figure, unit = out.split()
        assert (name, unit) == ("simple_grpc", "instructions/request")
        counts.append(int(figure.replace(",", "")))
    ours, more, again = counts
    assert 20_000 < ours < 2_000_000
    assert abs(again - ours) < 0.05 * ours
    assert more - ours > 20_000  # 5,000 additions of the interpreter: several instructions each


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Triton as `make bench` runs it, from bench/setup.sh's Triton step (run here when bench/.cache lacks it)."""
    cache = BENCH / ".cache"
    if servers.missing("triton", cache):
        done = subprocess.run(
            ["bash", str(BENCH / "setup.sh"), str(cache)],
            env={**os.environ, "BENCH_SETUP_ONLY": "triton"},
            capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"bench/setup.sh failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    with servers.running("triton", cache, tmp_path_factory.mktemp("triton")) as server:
        yield server


def test_triton_serves_every_workload(triton: servers.Running) -> None:
    """Triton answers every workload with the right values (the load generator checks the first answer value by
    value), its stubs are counted in its memory, it logs nothing per request, and its count matches ours."""
    assert triton.metadata["name"] == "triton" and triton.metadata["version"] == "2.51.0", triton.metadata
    assert len(loadgen._tree(triton.pid)) >= 3  # tritonserver and one Python-backend stub per model
    assert 10 < triton.idle_pss_mib <= triton.idle_rss_mib
    logged = servers.log_bytes(triton)
    for workload in loadgen.WORKLOADS:
        before = servers.inference_count(triton)
        result = loadgen.run(workload, triton.rest, triton.grpc, concurrency=2, duration=0.3, warmup=0.1,
                             elements=1000, server_pid=triton.pid, timeout=10)  # fmt: skip
        assert "error" not in result and result["errors"] == 0 and result["requests"] > 0, result
        # Triton adds a request to its statistics after sending the answer: the last one may land a moment later
        counted = servers.inference_count(triton)
        for _ in range(20):
            if counted - before >= result["completed"]:  # type: ignore[operator]
                break
            time.sleep(0.05)
            counted = servers.inference_count(triton)
        assert counted - before == result["completed"], result  # type: ignore[operator]
    assert servers.log_bytes(triton) == logged


def _health(target: str, service: str) -> tuple[str, str]:
    """gRPC's own health client asking `target` about `service`: Check's serving status (or its error code, and
    then "") and Watch's first answer ("OK") or error code."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name, ""
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        try:
            next(iter(stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)))
            watch = "OK"
        except grpc.RpcError as exc:
            watch = exc.code().name
        return status, watch


def test_the_standard_grpc_health_service_answers_as_triton_s(ours: servers.Running,
                                                              triton: servers.Running) -> None:
    """Both servers, ready, answer gRPC's standard health `Check` SERVING for the whole server and the protocol's
    service, and refuse `Watch` UNIMPLEMENTED. One difference, on purpose (docs/server.md): Triton answers every
    service name alike, oipgen only those it serves (NOT_FOUND otherwise, as the health protocol asks)."""
    for service in ("", "inference.GRPCInferenceService"):
        assert _health(ours.grpc, service) == _health(triton.grpc, service) == ("SERVING", "UNIMPLEMENTED")
    assert _health(triton.grpc, "nope") == ("SERVING", "UNIMPLEMENTED")
    assert _health(ours.grpc, "nope") == ("NOT_FOUND", "")
