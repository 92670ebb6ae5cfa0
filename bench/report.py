"""The report of a `make bench` run: ratios against Triton, medians, memory, perf_analyzer, the targets (markdown)
and the chart (PNG)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from scenarios import BY_NAME, LOADGEN, PERF_ANALYZER, TITLES
from servers import LABELS, REFERENCE

OURS = "oipgen"
FLOOR = "floor"  # the bare transport answering a scenario's recorded answer (bench/run.py's measure_floors)
FLOOR_TARGET = 1.3  # our CPU per request over the floor's, on small requests
# A load generator that spends more CPU per inference than the server (each on its own core) sets the pace.
CLIENT_BOUND = 1.0
METRICS = (
    "infer_per_s",
    "p50_ms",
    "p99_ms",
    "server_cpu_us_per_infer",
    "peak_rss_mib",
    "idle_rss_mib",
    "cpu0_busy",
    "mean_ms",
    "client_cpu_us_per_infer",
    "client_maxrss_mib",
    "log_bytes_per_request",
    "idle_pss_mib",
    "rest_rss_mib",
    "responses_per_s",
)


def title(scenario: str, elements: int = 1_000_000) -> str:
    """The scenario's title, with the identity tensor's real element count."""
    text = TITLES.get(scenario, scenario)
    return text if elements == 1_000_000 else text.replace("1M", f"{elements:,}")


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(document: dict[str, Any]) -> dict[str, Any]:
    """{(server, scenario, tool): medians and the errors}, keyed as "server|scenario|tool"."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in document["records"]:
        groups.setdefault(f"{record['server']}|{record['scenario']}|{record['tool']}", []).append(record)
    summary: dict[str, Any] = {}
    for key, records in groups.items():
        good = [r for r in records if "error" not in r]
        entry: dict[str, Any] = {
            "runs": len(records),
            "ok": len(good),
            "errors": sorted({str(r["error"]) for r in records if "error" in r}),
            "request_errors": sum(int(r.get("errors", 0)) for r in good),
        }
        reasons = sorted({str(r["not_applicable"]) for r in good if "not_applicable" in r})
        if reasons:
            entry["not_applicable"] = "; ".join(reasons)
        for metric in (*METRICS, "startup_s", "ready_rss_mib", "requests", "payload_bytes", "server_count"):
            values = [r[metric] for r in good if r.get(metric) is not None]
            if values:
                entry[metric] = _median(values)
                if metric in ("infer_per_s", "startup_s"):
                    entry[metric + "_range"] = (min(values), max(values))
        summary[key] = entry
    return summary


def get(summary: dict[str, Any], server: str, scenario: str, metric: str, tool: str = "loadgen") -> float | None:
    entry = summary.get(f"{server}|{scenario}|{tool}")
    return None if entry is None else entry.get(metric)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100 or digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _rate(entry: dict[str, Any]) -> str:
    """infer/s, with responses/s for a scenario whose requests have several."""
    rate, responses = entry.get("infer_per_s"), entry.get("responses_per_s")
    text = _num(rate, 1)
    if rate and responses and responses > rate * 1.5:
        text += f" ({_num(responses)} responses/s)"
    return text


def ranking_tool(summary: dict[str, Any], scenario: str, server: str, reference: str = REFERENCE) -> str:
    """The load generator whose figures compare `server` with `reference` on `scenario`: the scenario's own
    (bench/scenarios.py) where both have its figures, else bench/loadgen.py."""
    known = BY_NAME.get(scenario)
    tool = known.tool if known is not None else LOADGEN
    if tool != LOADGEN and all(get(summary, s, scenario, "infer_per_s", tool) for s in (server, reference)):
        return tool
    return LOADGEN


def _cell(summary: dict[str, Any], server: str, scenario: str) -> str:
    entry = summary.get(f"{server}|{scenario}|loadgen")
    if entry is None:
        return "not run"
    if "not_applicable" in entry:
        return "not served"
    if not entry["ok"]:
        return "fails: " + "; ".join(entry["errors"])[:160].replace("|", "/")
    text = (
        f"{_rate(entry)} · {_ms(entry.get('p50_ms'))} / {_ms(entry.get('p99_ms'))} ms · "
        f"{_num(entry.get('server_cpu_us_per_infer'))} us · {_num(entry.get('peak_rss_mib'))} MiB"
    )
    if entry["request_errors"]:
        text += f" · {entry['request_errors']} errors"
    if entry["errors"]:
        text += f" ({entry['runs'] - entry['ok']} of {entry['runs']} runs failed)"
    return text


def _ratio(ours: float | None, peer: float | None) -> str:
    if not ours or not peer:
        return "-"
    return f"{ours / peer:.2f}x"


def targets(document: dict[str, Any], summary: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met?) for the benchmark's targets (None: not measurable in this run)."""
    out: list[tuple[str, str, bool | None]] = []

    def rate(server: str, scenario: str) -> float | None:
        return get(summary, server, scenario, "infer_per_s")

    def check(text: str, ours: float | None, bound: float | None, what: str, higher: bool = True) -> None:
        if ours is None or bound is None:
            out.append((text, "not measured", None))
        else:
            out.append((text, what, ours >= bound if higher else ours <= bound))

    def capacity(server: str, scenario: str) -> float | None:
        """Inferences per second of server CPU (1 / CPU per inference): the rate a fully busy core would give."""
        cpu = get(summary, server, scenario, "server_cpu_us_per_infer")
        return 1e6 / cpu if cpu else None

    def busy(server: str, scenario: str) -> str:
        value = get(summary, server, scenario, "cpu0_busy")
        return "?" if value is None else f"{value:.0%}"

    ours, ml = rate(OURS, "simple_rest_c8"), rate("mlserver", "simple_rest_c8")
    check("simple REST JSON c=8: >= 2.5x MLServer infer/s", ours, ml and 2.5 * ml,
          f"{_num(ours)} vs {_num(ml)} infer/s = {_ratio(ours, ml)} (server CPU busy "
          f"{busy(OURS, 'simple_rest_c8')} vs {busy('mlserver', 'simple_rest_c8')})")  # fmt: skip
    ours, ml = capacity(OURS, "simple_rest_c8"), capacity("mlserver", "simple_rest_c8")
    check("  the same as capacity (1 / server CPU per inference)", ours, ml and 2.5 * ml,
          f"{_num(ours)} vs {_num(ml)} infer/s per core = {_ratio(ours, ml)}")  # fmt: skip
    ours = rate(OURS, "simple_grpc_c8")
    peers = [v for v in (rate("mlserver", "simple_grpc_c8"), rate("kserve", "simple_grpc_c8")) if v]
    best = max(peers) if peers else None
    check("simple gRPC c=8: >= 2x the better of MLServer and KServe", ours, best and 2 * best,
          f"{_num(ours)} vs {_num(best)} infer/s = {_ratio(ours, best)} (server CPU busy "
          f"{busy(OURS, 'simple_grpc_c8')})")  # fmt: skip
    ours = capacity(OURS, "simple_grpc_c8")
    peers = [v for v in (capacity("mlserver", "simple_grpc_c8"), capacity("kserve", "simple_grpc_c8")) if v]
    best = max(peers) if peers else None
    check("  the same as capacity (1 / server CPU per inference)", ours, best and 2 * best,
          f"{_num(ours)} vs {_num(best)} infer/s per core = {_ratio(ours, best)}")  # fmt: skip
    cpu = get(summary, OURS, "identity_rest_binary", "server_cpu_us_per_infer")
    check(
        "4 MB REST binary: server CPU <= 5 ms per inference", cpu, 5000.0, f"{_ms(cpu and cpu / 1000)} ms", higher=False
    )
    ours, ks = rate(OURS, "identity_grpc_raw"), rate("kserve", "identity_grpc_raw")
    check(
        "4 MB gRPC raw: >= KServe infer/s", ours, ks, f"{_num(ours, 1)} vs {_num(ks, 1)} infer/s = {_ratio(ours, ks)}"
    )
    ours, ml = rate(OURS, "identity_rest_json"), rate("mlserver", "identity_rest_json")
    check(
        "1M REST JSON: >= 1.5x MLServer infer/s",
        ours,
        ml and 1.5 * ml,
        f"{_num(ours, 2)} vs {_num(ml, 2)} infer/s = {_ratio(ours, ml)}",
    )
    floor = document.get("floor", {}).get("floor_ms")
    cpu = get(summary, OURS, "identity_rest_json", "server_cpu_us_per_infer")
    cpu_ms = cpu / 1000 if cpu else None
    check(
        "1M REST JSON: server CPU within 1.3x of the serialization floor",
        cpu_ms,
        floor and 1.3 * floor,
        f"{_ms(cpu_ms)} ms vs floor {_ms(floor)} ms = {_ratio(cpu_ms, floor)}",
        higher=False,
    )
    startup = get(summary, OURS, "startup", "startup_s", tool="harness")
    check("start-up under 1 s", startup, 1.0, f"{startup:.2f} s" if startup else "-", higher=False)
    ours, tr = rate(OURS, "simple_grpc_c8"), rate(REFERENCE, "simple_grpc_c8")
    check("simple gRPC c=8: >= Triton's infer/s", ours, tr,
          f"{_num(ours)} vs {_num(tr)} infer/s = {_ratio(ours, tr)}")  # fmt: skip
    out += _targets_against_triton(document, summary)
    for scenario in ("identity_rest_binary", "identity_grpc_raw"):
        idle = _at_rest(summary, OURS, scenario)
        peak = get(summary, OURS, scenario, "peak_rss_mib")
        payload = get(summary, OURS, scenario, "payload_bytes")
        bound = idle + 4 * payload / 2**20 if idle is not None and payload else None
        floor_peak = get(summary, FLOOR, scenario, "peak_rss_mib")
        floor_rest = get(summary, FLOOR, scenario, "rest_rss_mib")
        floor_text = ""
        if floor_peak is not None and floor_rest is not None and payload:
            growth = floor_peak - floor_rest
            floor_text = (f"; the bare transport answering the same bytes grows {_num(growth, 1)} MiB, "
                          f"{growth / (payload / 2**20):.1f}x the payload")
        check(
            f"{title(scenario, document['meta']['elements']).split(' c=')[0]}: peak memory <= memory at rest "
            "+ 4x payload",
            peak,
            bound,
            f"peak {_num(peak)} MiB, at rest {_num(idle)} MiB + 4 x {_num(payload and payload / 2**20, 1)} MiB "
            f"= {_num(bound)} MiB" + floor_text,
            higher=False,
        )
    return out


def _pair(summary: dict[str, Any], scenario: str, metric: str) -> tuple[float | None, float | None, str]:
    """Ours and Triton's `metric` on `scenario`, from the load generator that ranks them, and its name."""
    tool = ranking_tool(summary, scenario, OURS)
    return get(summary, OURS, scenario, metric, tool), get(summary, REFERENCE, scenario, metric, tool), tool


def _floor_against_triton(summary: dict[str, Any], scenario: str) -> str:
    """Where the bare transport stands against Triton on `scenario` (bench/loadgen.py's figures of both), when it
    spends more CPU per request than Triton does per inference: no Python server on that transport can meet a
    target of Triton's CPU there."""
    floor = get(summary, FLOOR, scenario, "server_cpu_us_per_infer")
    triton = get(summary, REFERENCE, scenario, "server_cpu_us_per_infer")
    if not floor or not triton or floor <= triton:
        return ""
    return (f"; the bare transport alone spends {_num(floor)} us per request, {floor / triton:.2f}x Triton's "
            f"{_num(triton)} us")


def _targets_against_triton(document: dict[str, Any], summary: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 30's targets, as ratios from this run: Triton's throughput and CPU per inference on every new
    scenario, `simple` beyond Triton's, the large gRPC identity, and small requests near the transport's floor."""
    out: list[tuple[str, str, bool | None]] = []
    scenarios = [name for name in document["meta"]["scenarios"] if name in BY_NAME]

    def ratio_target(text: str, scenario: str, bound: float) -> None:
        ours, triton, tool = _pair(summary, scenario, "infer_per_s")
        if not ours or not triton:
            out.append((text, "not measured", None))
            return
        out.append((text, f"{_num(ours, 1)} vs {_num(triton, 1)} infer/s = {ours / triton:.2f}x ({tool})"
                    + _floor_against_triton(summary, scenario), ours >= bound * triton))

    for name in scenarios:
        if not BY_NAME[name].new:
            continue
        rates, cpus = _pair(summary, name, "infer_per_s"), _pair(summary, name, "server_cpu_us_per_infer")
        text = f"{title(name)}: >= Triton's infer/s, <= its server CPU per inference"
        if not (rates[0] and rates[1] and cpus[0] and cpus[1]):
            out.append((text, "not measured", None))
            continue
        out.append((text, f"{rates[0] / rates[1]:.2f}x infer/s, {cpus[0] / cpus[1]:.2f}x the CPU "
                    f"({_num(cpus[0])} vs {_num(cpus[1])} us; {rates[2]})" + _floor_against_triton(summary, name),
                    rates[0] >= rates[1] and cpus[0] <= cpus[1]))
    for scenario, bound in (("simple_rest_c8", 1.5), ("simple_grpc_c8", 1.3), ("identity_grpc_raw", 1.5)):
        if scenario in scenarios:
            ratio_target(f"{title(scenario, document['meta']['elements'])}: >= {bound}x Triton's infer/s", scenario,
                         bound)
    for scenario in ("simple_rest_c1", "simple_grpc_c1"):
        if scenario not in scenarios:
            continue
        ours, triton, tool = _pair(summary, scenario, "p50_ms")
        text = f"{title(scenario)}: p50 latency <= Triton's"
        floor = get(summary, FLOOR, scenario, "p50_ms")
        floor_text = ""
        if floor is not None and tool == LOADGEN:  # the floor is measured by loadgen only
            floor_text = f"; the bare transport alone: {floor:.3f} ms"
        out.append((text, "not measured", None) if ours is None or triton is None else
                   (text, f"{ours:.3f} vs {triton:.3f} ms ({tool})" + floor_text, ours <= triton))
    for name in scenarios:
        if not BY_NAME[name].floor or BY_NAME[name].fresh:  # CPU over the floor: the small requests
            continue
        ours = get(summary, OURS, name, "server_cpu_us_per_infer")
        floor = get(summary, FLOOR, name, "server_cpu_us_per_infer")
        text = f"{title(name)}: server CPU per request <= {FLOOR_TARGET}x the bare transport's"
        out.append((text, "not measured", None) if not ours or not floor else
                   (text, f"{_num(ours)} vs {_num(floor)} us = {ours / floor:.2f}x", ours <= FLOOR_TARGET * floor))
    return out


def _scenario_table(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Every scenario: ours against Triton (throughput and server CPU per inference, from the load generator that
    ranks them) and our CPU per request against the bare transport's floor (both from bench/loadgen.py)."""
    meta = document["meta"]
    if OURS not in meta["servers"]:
        return []
    lines = [
        "## Every scenario: oipgen, Triton and the transport's floor",
        "",
        "infer/s and server CPU per inference of oipgen and Triton from the load generator named (perf_analyzer "
        "where it can send the workload to both; bench/loadgen.py otherwise: bench/scenarios.py), with the ratios "
        "(infer/s: ours over Triton's, higher is better; CPU: ours over Triton's, lower is better). Floor: the bare "
        "transport (uvicorn for REST, grpcio for gRPC) answering our server's recorded answer under the same load, "
        "its CPU per request and ours over it (bench/loadgen.py for both; target <= "
        f"{FLOOR_TARGET}x), and the floor's CPU over Triton's (above 1.00x: the bare transport alone spends more than "
        "Triton, so no Python server on it can match Triton's CPU there). perf_analyzer's latency of a decoupled "
        "model is that of the first response.",
        "",
        "| scenario | load | oipgen infer/s · p50 | Triton infer/s · p50 | infer/s ratio | oipgen CPU | Triton CPU "
        "| CPU ratio | floor CPU | oipgen CPU / floor | floor CPU / Triton's |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in meta["scenarios"]:
        tool = ranking_tool(summary, name, OURS)
        cells = []
        for server in (OURS, REFERENCE):
            entry = summary.get(f"{server}|{name}|{tool}") or {}
            cells.append(f"{_rate(entry)} · {_ms(entry.get('p50_ms'))} ms" if entry.get("infer_per_s") else "-")
        rates = [get(summary, s, name, "infer_per_s", tool) for s in (OURS, REFERENCE)]
        cpus = [get(summary, s, name, "server_cpu_us_per_infer", tool) for s in (OURS, REFERENCE)]
        ours_lg = get(summary, OURS, name, "server_cpu_us_per_infer")
        floor = get(summary, FLOOR, name, "server_cpu_us_per_infer")
        triton_lg = get(summary, REFERENCE, name, "server_cpu_us_per_infer")
        label = "perf_analyzer" if tool == PERF_ANALYZER else "loadgen"
        lines.append(
            f"| {title(name, meta['elements'])} | {label} | {cells[0]} | {cells[1]} | {_ratio(rates[0], rates[1])} | "
            f"{_num(cpus[0])} us | {_num(cpus[1])} us | {_ratio(cpus[0], cpus[1])} | "
            + (f"{_num(floor)} us | {_ratio(ours_lg, floor)} | {_ratio(floor, triton_lg)} |" if floor
               else "- | - | - |")
        )
    return [*lines, ""]


def _versions(meta: dict[str, Any]) -> str:
    parts = []
    for name, packages in meta.get("versions", {}).items():
        listed = ", ".join(f"{k} {v}" for k, v in packages.items())
        parts.append(f"{LABELS.get(name, name).split()[0]}: {listed or '?'}")
    return "; ".join(parts)


def _against_reference(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The first table: every server's infer/s and CPU per inference as ratios against the reference (Triton)."""
    meta = document["meta"]
    reference = meta.get("reference", REFERENCE)
    others = [s for s in meta["servers"] if s != reference]
    if reference not in meta["servers"]:
        return [f"{LABELS.get(reference, reference)} was not part of this run: no ratios against it.", ""]
    label = LABELS.get(reference, reference)
    head = ["scenario", f"{label} infer/s", *(LABELS.get(s, s) for s in others)]
    lines = [
        f"## Against {label}",
        "",
        f"Each cell: the server's infer/s over {label}'s, then {label}'s server CPU per inference over the "
        "server's (both higher is better: above 1.00x beats it). Load: bench/loadgen.py, or perf_analyzer where "
        "the scenario is ranked by it ((pa) beside Triton's figure; a server perf_analyzer cannot measure is then "
        "compared by bench/loadgen.py, marked (loadgen)).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for scenario in meta["scenarios"]:
        known = BY_NAME.get(scenario)
        tool = known.tool if known is not None else LOADGEN
        base = get(summary, reference, scenario, "infer_per_s", tool) or get(summary, reference, scenario,
                                                                             "infer_per_s")
        marked = " (pa)" if tool == PERF_ANALYZER and get(summary, reference, scenario, "infer_per_s", tool) else ""
        row = [title(scenario, meta["elements"]), _num(base, 1) + marked]
        for server in others:
            used = ranking_tool(summary, scenario, server, reference)
            rate = _ratio(get(summary, server, scenario, "infer_per_s", used),
                          get(summary, reference, scenario, "infer_per_s", used))
            cpu = _ratio(
                get(summary, reference, scenario, "server_cpu_us_per_infer", used),
                get(summary, server, scenario, "server_cpu_us_per_infer", used),
            )
            note = " (loadgen)" if used != tool else ""
            row.append("-" if rate == "-" else f"**{rate}** · {cpu} CPU{note}")
        lines.append("| " + " | ".join(row) + " |")
    at_rest = _num(get(summary, reference, "startup", "idle_pss_mib", "harness"))
    row = ["memory at rest (PSS; lower is better)", f"{at_rest} MiB"]
    for server in others:
        row.append(
            _ratio(
                get(summary, server, "startup", "idle_pss_mib", "harness"),
                get(summary, reference, "startup", "idle_pss_mib", "harness"),
            ).replace("x", "x the memory")
        )
    lines += ["| " + " | ".join(row) + " |", ""]
    return lines


def _at_rest(summary: dict[str, Any], server: str, scenario: str) -> float | None:
    """The RSS at rest (before any inference) of the server `scenario` ran on: a large-payload scenario runs on a
    server started for it (bench/run.py), so that its peak is its own."""
    rest = get(summary, server, scenario, "rest_rss_mib")
    return rest if rest is not None else get(summary, server, "startup", "idle_rss_mib", "harness")


def _memory(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    meta = document["meta"]
    large = [s for s in ("identity_grpc_raw", "identity_rest_binary", "identity_rest_json") if s in meta["scenarios"]]
    peaks = [f"{title(s, meta['elements']).split(' c=')[0]}: peak RSS" for s in large]
    head = ["server", "at rest: PSS", "at rest: RSS", *peaks]
    lines = [
        "## Memory",
        "",
        "At rest: the server's whole process tree once ready and settled, before any inference (PSS counts shared "
        "pages once: the fair figure across processes). Peak: the tree's highest RSS during the scenario's "
        "warm-up and window (VmHWM after a reset), and in brackets its growth over the RSS at rest of the server it "
        "ran on (each of these scenarios runs on a server started for it, so that what an earlier scenario left "
        "resident is not counted as its own).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for server in meta["servers"]:
        idle = get(summary, server, "startup", "idle_rss_mib", "harness")
        row = [
            LABELS.get(server, server),
            _num(get(summary, server, "startup", "idle_pss_mib", "harness")) + " MiB",
            _num(idle) + " MiB",
        ]
        for scenario in large:
            peak = get(summary, server, scenario, "peak_rss_mib")
            rest = _at_rest(summary, server, scenario)
            row.append("-" if peak is None else f"{_num(peak)} MiB (+{_num(peak - rest if rest else None)})")
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def _logging(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    meta = document["meta"]
    cells, broken = [], []
    for server in meta["servers"]:
        measured = [r for r in document["records"] if r["server"] == server and r.get("answered")]
        answered = sum(r["answered"] for r in measured)
        per_request = sum(r["log_bytes"] for r in measured) / answered if answered else None
        cells.append(f"{LABELS.get(server, server)} " + ("-" if per_request is None else f"{per_request:.1f}"))
        if per_request is not None and per_request >= 10:  # a line per request, not a stray warning
            broken.append(LABELS.get(server, server))
    verdict = f"**Not held by {', '.join(broken)}**." if broken else "Held by every server."
    return [
        "## Logging",
        "",
        f"One policy for every server: {meta.get('logging', '?')}. Measured: the bytes each server wrote to its "
        f"log during the measurements, per request answered: {', '.join(cells)}. {verdict}",
        "",
    ]


def _counts(document: dict[str, Any]) -> list[str]:
    """The load generators' counts against the inferences the servers' statistics extension reports."""
    checked = [r for r in document["records"] if "server_count" in r and r.get("tool") == "loadgen"]
    wrong = [r for r in checked if r["server_count"] != r.get("completed")]
    lines = [
        "## Counts checked by the servers",
        "",
        f"Where a server has the statistics extension, every measurement compares the inferences the server says it "
        f"completed with the load generator's count. bench/loadgen.py: {len(checked) - len(wrong)} of {len(checked)} "
        "measurements agree exactly.",
    ]
    for r in wrong:
        lines.append(
            f"- {LABELS.get(r['server'], r['server'])} {r['scenario']} (repeat {r['repeat']}): loadgen completed "
            f"{r.get('completed')}, the server counted {r['server_count']}"
        )
    return [*lines, ""]


def _bound(entry: dict[str, Any]) -> str:
    """A client-bound mark when the tool spent at least CLIENT_BOUND times the server's CPU per inference."""
    client, server = entry.get("client_cpu_us_per_infer"), entry.get("server_cpu_us_per_infer")
    if client is None or not server or client < CLIENT_BOUND * server:
        return ""
    return f" (**client-bound**: its CPU per inference is {client / server:.1f}x the server's)"


def _perf_analyzer(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    meta = document["meta"]
    rows = []
    for server in meta["servers"]:
        skipped = summary.get(f"{server}|*|perf_analyzer")
        if skipped is not None:
            rows.append(f"| {LABELS.get(server, server)} | all | not run: {'; '.join(skipped['errors'])} | | | |")
            continue
        for scenario in meta["scenarios"]:
            entry = summary.get(f"{server}|{scenario}|perf_analyzer")
            if entry is None:
                continue
            reasons = sorted({str(r["not_applicable"]) for r in document["records"] if r["server"] == server
                              and r["scenario"] == scenario and "not_applicable" in r})  # fmt: skip
            own = "-"
            if reasons:
                cell = "not applicable: " + "; ".join(reasons)
            elif entry["ok"]:
                cell = (
                    f"{_num(entry.get('infer_per_s'), 1)} · {_ms(entry.get('p50_ms'))} / "
                    f"{_ms(entry.get('p99_ms'))} ms"
                )
                cpu = entry.get("client_cpu_us_per_infer")
                if cpu is not None:
                    own = (
                        f"{_num(cpu)} us · {_num(entry.get('client_maxrss_mib'))} MiB · "
                        f"{_num(entry.get('server_count'))} counted by the server"
                    )
                cell += _bound(entry)
            else:
                cell = "fails: " + "; ".join(entry["errors"])[:200].replace("|", "/")
            ours = summary.get(f"{server}|{scenario}|loadgen") or {}
            lg = (
                f"{_num(ours.get('infer_per_s'), 1)} · {_ms(ours.get('p50_ms'))} / {_ms(ours.get('p99_ms'))} ms"
                if ours.get("ok")
                else "-"
            )
            lg += _bound(ours) if ours.get("ok") else ""
            label = f"{LABELS.get(server, server)} | {title(scenario, meta['elements'])}"
            rows.append(f"| {label} | {cell} | {own} | {lg} |")
    if not rows:
        return ["## perf_analyzer", "", "perf_analyzer was not run (--no-pa).", ""]
    return [
        "## perf_analyzer",
        "",
        "perf_analyzer (sync mode, the server's statistics read around each window) beside bench/loadgen.py on the "
        "same server in the same run. Its own cost per inference is its CPU time (wait4) over the inferences the "
        "server's statistics extension counted during the run; its peak memory is its maximum RSS. A tool that "
        "spends more CPU per inference than the server (each has its own core) is **client-bound**: that row "
        "measures the tool. "
        "perf_analyzer 2.60 copies every request's inputs and every response's outputs into records it keeps for "
        "its profile export (src/infer_context.cc, GetInputs / GetOutputs), so on large tensors it is client-bound.",
        "",
        "| server | scenario | perf_analyzer `infer/s · p50 / p99` | perf_analyzer's own CPU per inference · peak "
        "memory · server's count | loadgen, same run |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def _cost(rates: dict[str, float | None], server: str, bound: float) -> str:
    """Throughput `server` lost against metrics and tracing off, and whether that is under `bound`."""
    bare, rate = rates.get("oipgen_bare"), rates.get(server)
    if not bare or not rate:
        return "-"
    lost = 1 - rate / bare
    return f"{lost:+.1%} ({'met' if lost < bound else 'not met'})"


def _observability(document: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Our server as shipped (metrics on, tracing off) beside metrics and tracing off and beside tracing on."""
    meta = document["meta"]
    if not meta.get("variants"):
        return []
    # Runs since the three take turns measure "as shipped" beside the other two; earlier ones took the default's
    shipped = "oipgen_metrics" if "oipgen_metrics" in meta["variants"] else OURS
    columns = [("oipgen_bare", "metrics and tracing off"), (shipped, "metrics on (default)"),
               ("oipgen_traced", "metrics on, every request traced (OTLP/HTTP)")]
    turns = (
        f" The three servers are up at once and take turns: {meta['observability_rounds']} round(s) of "
        f"{meta['observability_window_s']:g} s windows, each round in another order; medians over the rounds."
        if shipped != OURS else ""
    )
    lines = [
        "## The cost of observability",
        "",
        "Our server as shipped (metrics on, tracing off), with both off, and with tracing on: every request sampled "
        "and exported over OTLP/HTTP to a receiver on the client's CPU "
        f"(it received {meta.get('otlp_sink', {}).get('spans', '?')} spans). Cells: infer/s · server CPU per "
        "inference; cost: throughput lost against both off (targets: metrics under 5%, tracing under 20%)." + turns,
        "",
        "| scenario | " + " | ".join(label for _, label in columns) + " | metrics cost | tracing cost |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in ("simple_rest_c8", "simple_grpc_c8"):
        if scenario not in meta["scenarios"]:
            continue
        cells, rates = [], {}
        for server, _ in columns:
            rate = get(summary, server, scenario, "infer_per_s")
            rates[server] = rate
            cells.append(f"{_num(rate)} · {_num(get(summary, server, scenario, 'server_cpu_us_per_infer'))} us")
        lines.append(f"| {title(scenario)} | " + " | ".join(cells) + f" | {_cost(rates, shipped, 0.05)} | "
                     f"{_cost(rates, 'oipgen_traced', 0.20)} |")
    return [*lines, ""]


def markdown(document: dict[str, Any], summary: dict[str, Any]) -> str:
    meta = document["meta"]
    names = meta["servers"]
    peers = [s for s in names if s != OURS]
    git = meta.get("git", {})
    lines = [
        "# oipgen benchmark",
        "",
        f"{meta['date']} on {meta['host']} ({meta['cpus']} CPUs, Python {meta['python']}), commit "
        f"`{(git.get('sha') or '?')[:12]}`{' (with uncommitted changes)' if git.get('dirty') else ''}; "
        f"load average {meta['load_average_before']} before, {meta['load_average_after']} after. "
        f"Servers on CPU {meta['server_cpu']}, load on CPU {meta['client_cpu']}; {meta['repeats']} repeat(s) of "
        f"{meta['duration_s']:g} s windows after {meta['warmup_s']:g} s of warm-up (identity REST JSON: twice the "
        f"window), identity tensors of {meta['elements']:,} FP32 elements. Took {meta['elapsed_s'] / 60:.1f} min."
        + (" **Quick smoke run: not figures to quote.**" if meta.get("quick") else ""),
        "",
        f"Versions: {_versions(meta)}.",
        "",
        *_scenario_table(document, summary),
        *_against_reference(document, summary),
        "## Every server",
        "",
        "Cells: `infer/s · p50 / p99 latency · server CPU per inference · peak server memory` (medians; same "
        "client, bench/loadgen.py, for every server). Ratios: our infer/s over the peer's (higher is better) and "
        "the peer's CPU per inference over ours (higher: we spend less).",
        "",
    ]
    head = [
        "scenario",
        *(LABELS.get(s, s) for s in names),
        *(f"oipgen vs {LABELS.get(p, p).split()[0]}" for p in peers),
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario in meta["scenarios"]:
        row = [title(scenario, meta["elements"]), *(_cell(summary, s, scenario) for s in names)]
        for peer in peers:
            rate = _ratio(get(summary, OURS, scenario, "infer_per_s"), get(summary, peer, scenario, "infer_per_s"))
            cpu = _ratio(
                get(summary, peer, scenario, "server_cpu_us_per_infer"),
                get(summary, OURS, scenario, "server_cpu_us_per_infer"),
            )
            row.append(f"{rate} infer/s, {cpu} CPU")
        lines.append("| " + " | ".join(row) + " |")
    row = ["start-up to ready (s) · RSS at ready"]
    for server in names:
        entry = summary.get(f"{server}|startup|harness")
        if entry is None or not entry["ok"]:
            row.append("fails" if entry else "-")
        else:
            lo, hi = entry["startup_s_range"]
            row.append(f"{entry['startup_s']:.2f} ({lo:.2f}-{hi:.2f}) · {_num(entry.get('ready_rss_mib'))} MiB")
    for peer in peers:
        ours, theirs = (
            get(summary, OURS, "startup", "startup_s", "harness"),
            get(summary, peer, "startup", "startup_s", "harness"),
        )
        row.append(f"{theirs / ours:.2f}x faster" if ours and theirs else "-")
    lines += ["| " + " | ".join(row) + " |", ""]
    lines += _memory(document, summary) + _logging(document, summary) + _counts(document)
    lines += _perf_analyzer(document, summary) + _observability(document, summary)
    floor = document.get("floor", {})
    if "parse_ms" in floor:
        lines += [
            "## Serialization floor (CPU 0, median)",
            "",
            f"{floor['elements']:,} FP32 elements, request body {floor['request_bytes'] / 1e6:.1f} MB: orjson parse "
            f"{floor['parse_ms']:.1f} ms + to numpy {floor['to_numpy_ms']:.1f} ms + orjson dump "
            f"{min(floor['dump_f64_ms'], floor['dump_f32_ms']):.1f} ms "
            f"(float64 view {floor['dump_f64_ms']:.1f}, float32 "
            f"{floor['dump_f32_ms']:.1f}, via tolist {floor['dump_tolist_ms']:.1f}) = **{floor['floor_ms']:.1f} ms** "
            f"({floor['floor_tolist_ms']:.1f} ms with tolist). "
            f"A raw copy of the same tensor: {floor['raw_copy_ms']:.2f} ms.",
            "",
        ]
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for text, what, met in targets(document, summary):
        lines.append(f"| {text} | {what} | {'yes' if met else 'no' if met is not None else '-'} |")
    lines.append("")
    return "\n".join(lines)


def chart(document: dict[str, Any], summary: dict[str, Any], path: Path) -> Path | None:
    """Per scenario, one bar per server (bench/loadgen.py's figures, and the floor's CPU): throughput, latency (p50
    bar, p99 tick) and server CPU per inference, on log scales; then start-up and memory at rest."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    meta = document["meta"]
    names, scenarios = meta["servers"], meta["scenarios"]
    rows = (
        ("infer_per_s", "infer/s"),
        ("p50_ms", "latency ms (p50 bar, p99 tick)"),
        ("server_cpu_us_per_infer", "server CPU us / inference"),
    )
    fig = plt.figure(figsize=(max(10.0, 0.75 * len(scenarios) * (len(names) + 1) / 2 + 3), 13))
    grid = fig.add_gridspec(len(rows) + 1, 2)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bars = [*names, FLOOR] if meta.get("floors") else list(names)
    width = 0.8 / len(bars)
    positions = range(len(scenarios))
    for row, (metric, label) in enumerate(rows):
        ax = fig.add_subplot(grid[row, :])
        for i, server in enumerate(bars):
            if server == FLOOR and metric != "server_cpu_us_per_infer":
                continue
            xs, values = [], []
            for x, scenario in zip(positions, scenarios, strict=True):
                value = get(summary, server, scenario, metric)
                if value:
                    xs.append(x + (i - (len(bars) - 1) / 2) * width)
                    values.append(value)
                    if metric == "p50_ms":
                        p99 = get(summary, server, scenario, "p99_ms")
                        if p99:
                            ax.plot([xs[-1] - width / 2, xs[-1] + width / 2], [p99, p99], color="black", linewidth=1)
            ax.bar(xs, values, width, color=colors[i % len(colors)], label=LABELS.get(server, server))
        ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(list(positions), [title(s, meta["elements"]) for s in scenarios], fontsize=7, rotation=30,
                      ha="right")
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        if row == 0:
            ax.legend(fontsize=7, ncol=len(bars))
    for col, (metric, label, unit) in enumerate((("startup_s", "start-up to ready", "s"),
                                                 ("idle_pss_mib", "memory at rest, PSS", "MiB"))):
        ax = fig.add_subplot(grid[len(rows), col])
        for i, server in enumerate(names):
            value = get(summary, server, "startup", metric, "harness")
            if value is not None:
                ax.bar(i, value, color=colors[i % len(colors)])
                ax.text(i, value, f"{value:.2f}" if unit == "s" else f"{value:.0f}", ha="center", va="bottom",
                        fontsize=7)
        ax.set_title(f"{label} ({unit})", fontsize=8)
        ax.set_xticks(range(len(names)), [LABELS.get(n, n).split()[0] for n in names], fontsize=7)
    fig.suptitle(
        f"oipgen vs {', '.join(LABELS.get(n, n) for n in names if n != OURS)} - {meta['date']}, "
        f"commit {(meta.get('git', {}).get('sha') or '?')[:10]}, "
        f"load average {meta['load_average_before'][0]:.2f}" + (" (quick run)" if meta.get("quick") else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Rewrite results.md and bench.png from a results.json: `python bench/report.py [bench/results/results.json]`."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).resolve().parent / "results" / "results.json"
    document = json.loads(path.read_text())
    summary = summarize(document)
    (path.parent / "results.md").write_text(markdown(document, summary))
    chart(document, summary, path.parent / "bench.png")
    print((path.parent / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
