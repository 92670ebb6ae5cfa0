"""The metrics' bookkeeping, in process (`oip.server.observe.metrics.Metrics`): what a scrape reads must be exactly what
happened, however it is counted on the hot path. Requests go through the REST app (ASGI, no sockets).

- Pending requests are those started less those the statistics counted as finished: a request in flight counts,
  queued or running, and stops counting when it ends, failed or not.
- Each thread counts in its own dictionaries: counts of many threads, some ended, scraped while they count, add up.
- As Triton, a loaded model version has every one of Triton's samples from the start, at zero.
- The latency histogram is the statistics' own: its count is the successes, its sum the records' durations, each
  request in the bucket its duration falls in.
- What `GET /metrics` serves is read as text: every one of Triton's samples is there, under Triton's name, with
  the value the requests made; nothing of the families is lost on the way to the exposition.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import re
import threading
import time
from typing import Any

import httpx
import pytest
from oip.server import DataPlane, Model, ModelFailure, ModelRepository, Settings, TensorSpec
from oip.server.observe.metrics import Metric, render
from oip.server.rest import create_app
from recorded import Recorder

TIMEOUT = 30.0
KEY = (("model", "gate"), ("version", "1"))


class Gate(Model):
    """FP32 [-1] in and out; each request waits until the test opens the gate, and fails if its input is < 0."""

    name = "gate"
    inputs = (TensorSpec("IN", "FP32", [-1]),)
    outputs = (TensorSpec("OUT", "FP32", [-1]),)

    def __init__(self) -> None:
        super().__init__(self.name)
        self.open = threading.Event()

    def infer(self, inputs: dict[str, Any], parameters: dict[str, Any]) -> Any:
        if not self.open.wait(TIMEOUT):
            raise ModelFailure("the gate never opened")
        if float(inputs["IN"][0]) < 0:
            raise ModelFailure("asked to fail")
        return {"OUT": inputs["IN"]}


def plane(model: Model, **settings: Any) -> DataPlane:
    repository = ModelRepository()
    repository.add(model)
    asyncio.run(repository.load_all())
    return DataPlane(repository, Settings(**settings))


def body(x: float) -> dict[str, Any]:
    return {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [x]}]}


def samples(families: list[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(s.labels.items()): s.value for f in families for s in f.samples if s.name == name}


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def exposition(text: str) -> tuple[dict[str, str], dict[str, dict[tuple[tuple[str, str], ...], float]]]:
    """The text format as served, names as written: family name -> TYPE, and sample name -> sorted labels ->
    value. Every line is a comment or a sample (a line of neither fails)."""
    types: dict[str, str] = {}
    served: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        assert found, f"not a sample line: {line!r}"
        labels = tuple(sorted(_LABEL.findall(found[2] or "")))
        assert labels not in served.setdefault(found[1], {}), f"sample written twice: {line!r}"
        served[found[1]][labels] = float(found[3])
    return types, served


def test_a_loaded_model_has_its_samples_before_it_serves() -> None:
    dp = plane(Gate())
    assert dp.metrics is not None
    families = {f.name: f for f in dp.metrics.families()}
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                 "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count"):
        assert samples([families[name]], name) == {KEY: 0}, name
    failures = samples([families["nv_inference_request_failure"]], "nv_inference_request_failure")
    assert failures == {(*KEY, ("reason", r)): 0 for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    text = render(families.values()).decode()
    assert '# TYPE nv_inference_count counter\nnv_inference_count{model="gate",version="1"} 0.0\n' in text
    assert "_total" not in text.split("# HELP oip_requests_total")[0]  # Triton's counters keep Triton's names


def test_a_label_value_holding_a_help_line_is_served_as_it_is() -> None:
    """Triton's counters are renamed on their HELP and TYPE lines only: a model named like a comment line keeps
    its name as a label value, and every family keeps one HELP and one TYPE line under Triton's name."""
    odd = Gate()
    odd.name = "# HELP nv_inference_count_total a model"
    repository = ModelRepository()
    repository.add(Gate())
    repository.add(odd)
    asyncio.run(repository.load_all())
    dp = DataPlane(repository, Settings())
    assert dp.metrics is not None
    text = render(dp.metrics.families()).decode()
    types, served = exposition(text)
    assert served["nv_inference_count"] == {KEY: 0, (("model", odd.name), ("version", "1")): 0}
    for name in ("nv_inference_count", "nv_inference_request_success", "nv_inference_request_failure"):
        assert types[name] == "counter" and text.count(f"\n# HELP {name} ") == 1, name
        assert not re.search(f"^# (HELP|TYPE) {name}_total", text, re.MULTILINE), name


@pytest.mark.parametrize("model_threads", [1, 4])  # queued for a model thread, or running
def test_pending_counts_the_requests_in_flight(model_threads: int) -> None:
    gate = Gate()
    dp = plane(gate, model_threads=model_threads)
    metrics = dp.metrics
    assert metrics is not None
    app = create_app(dp, dp.settings, metrics=dp.metrics, scrape=dp.metric_families)

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            calls = [asyncio.create_task(http.post("/v2/models/gate/infer", json=body(x))) for x in (1, 2, -1)]
            deadline = time.monotonic() + TIMEOUT
            while metrics.pending.get(KEY) != 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            during = metrics.pending.get(KEY)
            gauge = samples(metrics.families(), "nv_inference_pending_request_count")[KEY]
            assert during == gauge == 3
            gate.open.set()
            answers = await asyncio.gather(*calls)
        return [a.status_code for a in answers]

    assert asyncio.run(main()) == [200, 200, 500]
    assert metrics.pending[KEY] == 0
    families = metrics.families()
    assert samples(families, "nv_inference_pending_request_count")[KEY] == 0
    assert samples(families, "nv_inference_request_failure")[(*KEY, ("reason", "BACKEND"))] == 1
    assert samples(families, "nv_inference_request_success")[KEY] == 2
    counted = samples(families, "oip_requests_total")
    assert counted[(("code", "200"), ("operation", "model_infer"), ("transport", "rest"))] == 2
    assert counted[(("code", "500"), ("operation", "model_infer"), ("transport", "rest"))] == 1


def test_counts_of_many_threads_add_up_while_scraped() -> None:
    dp = plane(Gate())
    metrics = dp.metrics
    assert metrics is not None
    model = dp.repository.get("gate")
    threads, per_thread = 8, 2000
    go = threading.Event()

    def count() -> None:
        go.wait(TIMEOUT)
        for i in range(per_thread):
            metrics.count("grpc", "ModelInfer", "OK" if i % 2 else "NOT_FOUND")
            dp.repository.acquire(model)  # a request holding the model: pending until it lets go

    workers = [threading.Thread(target=count) for _ in range(threads)]
    for worker in workers:
        worker.start()
    go.set()
    scraped = []
    while any(worker.is_alive() for worker in workers):
        scraped.append(samples(metrics.families(), "oip_requests_total"))  # while they count
    for worker in workers:
        worker.join(TIMEOUT)
    ok = (("code", "OK"), ("operation", "ModelInfer"), ("transport", "grpc"))
    assert all(later.get(ok, 0) >= earlier.get(ok, 0) for earlier, later in itertools.pairwise(scraped))
    for _ in range(2):  # the ended threads' counts are kept
        assert metrics.requests == {("grpc", "ModelInfer", "OK"): threads * per_thread // 2,
                                    ("grpc", "ModelInfer", "NOT_FOUND"): threads * per_thread // 2}
        assert metrics.pending == {KEY: threads * per_thread}  # started, none finished
    for _ in range(threads * per_thread):
        dp.repository.release(model)
    assert metrics.pending == {KEY: 0}
    metrics.count("rest", "model_infer", 200)  # this thread's count beside them
    assert metrics.requests[("rest", "model_infer", "200")] == 1
    assert sum(metrics.requests.values()) == threads * per_thread + 1


def test_the_latency_histogram_is_the_statistics_own() -> None:
    gate = Gate()
    gate.open.set()
    buckets = (0.0005, 0.001, 0.002, 0.01)
    dp = plane(gate, metrics_buckets=buckets)
    metrics = dp.metrics
    assert metrics is not None
    seen = Recorder()
    dp.observers.append(seen)
    app = create_app(dp, dp.settings, metrics=dp.metrics, scrape=dp.metric_families)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for x in [1.0] * 40 + [-1.0] * 3:
                await http.post("/v2/models/gate/infer", json=body(x))

    asyncio.run(main())
    successes = [r for r in seen.requests if r.ok]
    assert len(successes) == 40 and len(seen.requests) == 43
    expected = [0] * (len(buckets) + 1)
    total = 0.0
    for record in successes:  # in the order the statistics added them: the same float sum
        seconds = record.total_ns / 1e9
        expected[bisect.bisect_left(buckets, seconds)] += 1
        total += seconds
    families = metrics.families()
    stats = dp.statistics.to_proto("gate", "1").inference_stats
    assert samples(families, "nv_inference_request_duration_seconds_count")[KEY] == stats.success.count == 40
    assert samples(families, "nv_inference_request_duration_seconds_sum")[KEY] == total
    assert sum(r.total_ns for r in successes) + sum(r.total_ns for r in seen.requests if not r.ok) == (
        stats.success.ns + stats.fail.ns)
    cumulative = samples(families, "nv_inference_request_duration_seconds_bucket")
    running = 0
    for bound, n in zip([*buckets, float("inf")], expected, strict=True):
        running += n
        le = "+Inf" if bound == float("inf") else repr(bound)
        assert cumulative[(*KEY, ("le", le))] == running, (le, cumulative)
    assert sum(expected) == 40


def test_the_served_text_has_every_sample_with_its_value() -> None:
    gate = Gate()
    gate.open.set()
    buckets = (0.5, 30.0)  # a request here takes well under 0.5 s: every success in the first bucket
    dp = plane(gate, metrics_buckets=buckets)
    app = create_app(dp, dp.settings, metrics=dp.metrics, scrape=dp.metric_families)

    async def main() -> tuple[list[int], httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers = [await http.post("/v2/models/gate/infer", json=body(x)) for x in (1.0, 2.0, -1.0)]
            bad = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT8", "data": [1]}]}
            answers.append(await http.post("/v2/models/gate/infer", json=bad))  # refused: REJECTED
            return [a.status_code for a in answers], await http.get("/metrics")

    codes, scraped = asyncio.run(main())
    assert codes == [200, 200, 500, 400]
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    types, served = exposition(scraped.text)
    stats = dp.statistics.to_proto("gate", "1")
    phases = stats.inference_stats
    labels = (("model", "gate"), ("version", "1"))
    expected_counters = {
        "nv_inference_request_success": 2,
        "nv_inference_count": 2,
        "nv_inference_exec_count": 2,
        "nv_inference_request_duration_us": phases.success.ns // 1000,
        "nv_inference_queue_duration_us": phases.queue.ns // 1000,
        "nv_inference_compute_input_duration_us": phases.compute_input.ns // 1000,
        "nv_inference_compute_infer_duration_us": phases.compute_infer.ns // 1000,
        "nv_inference_compute_output_duration_us": phases.compute_output.ns // 1000,
    }
    assert phases.success.count == 2 and phases.fail.count == 2 and stats.execution_count == 2
    for name, expected in expected_counters.items():
        assert types.get(name) == "counter", (name, types)  # Triton's name, no _total
        assert served.get(name) == {labels: expected}, (name, served.get(name))
    assert types.get("nv_inference_request_failure") == "counter"
    assert served.get("nv_inference_request_failure") == {
        (*labels[:1], ("reason", reason), *labels[1:]): n
        for reason, n in (("REJECTED", 1), ("CANCELED", 0), ("BACKEND", 1), ("OTHER", 0))}
    assert types.get("nv_inference_pending_request_count") == "gauge"
    assert served.get("nv_inference_pending_request_count") == {labels: 0}
    assert types.get("nv_inference_request_duration_seconds") == "histogram"
    assert served.get("nv_inference_request_duration_seconds_bucket") == {
        (("le", "0.5"), *labels): 2, (("le", "30.0"), *labels): 2, (("le", "+Inf"), *labels): 2}
    assert served.get("nv_inference_request_duration_seconds_count") == {labels: 2}
    (seconds,) = served["nv_inference_request_duration_seconds_sum"].values()
    assert seconds == pytest.approx(phases.success.ns / 1e9, rel=1e-9)
    assert served.get("oip_requests_total") == {
        (("code", "200"), ("operation", "model_infer"), ("transport", "rest")): 2,
        (("code", "400"), ("operation", "model_infer"), ("transport", "rest")): 1,
        (("code", "500"), ("operation", "model_infer"), ("transport", "rest")): 1}
    # Nothing else of the server's own: every nv_ and oip_ sample is one checked above.
    ours = sorted(name for name in served if name.startswith(("nv_", "oip_")))
    histogram = [f"nv_inference_request_duration_seconds_{part}" for part in ("bucket", "count", "sum")]
    assert ours == sorted([*expected_counters, "nv_inference_request_failure", "nv_inference_pending_request_count",
                           *histogram, "oip_requests_total"]), ours
