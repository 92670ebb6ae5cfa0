"""The conformance matrix as a page and a chart, from the document bench/conformance_matrix.py writes:
conformance-matrix.json (every result), conformance-matrix.md (totals, the models each server cannot express, one
row per case and a column per server, then every failure of every server with the spec's words and the answer)
and conformance-matrix.png (totals per layer, and the share of failed cases per section).

    python bench/conformance_table.py [docs/conformance-matrix.json]     (rewrites the .md and .png beside it)
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "generated"))

from oip.conformance_results import CHOICES, SECTIONS  # noqa: E402 (the generated package, from generated/)

# The spec/README.md choice each golden case depends on (first pattern that matches): where the upstream documents
# disagree, a failure there is the other side of a documented choice.
GOLDEN_CHOICES = (
    ("server_ready", 5), ("server_live", 4), ("model_ready_unknown_version", 15), ("model_ready_*", 4),
    ("server_metadata", 6), ("*_unknown_version", 15), ("infer_datatype_bf16_raw", 7), ("infer_datatype_fp16_raw", 8),
    ("infer_error_fp16_*", 8), ("infer_error_bf16_json", 8), ("repository_index*", 11),
    ("infer_simple_binary_data_*", 12), ("*parameter_object", 20), ("*error*", 14), ("infer_*", 21),
)
# What a failure means where the answer differs by design rather than by a rule (matched in the failure's detail).
NOTES = (
    ("platform: expected", "`platform` is the server's own name for the model's backend (OIP: \"The "
     "framework/backend for the model\"); the golden answer has the example models' `oipgen_example`"),
)
TRANSPORT_NAMES = {"rest": "REST", "grpc": "gRPC", "all": "all forms"}


def annotate(document: dict[str, Any]) -> dict[str, Any]:
    """Give every result its layer and section (from its case in the catalogue) and its model ("" if none)."""
    catalogue = document["catalogue"]
    for record in document["servers"].values():
        for result in record["results"]:
            layer = "golden" if result["case"] in catalogue["golden"] else "protocol"
            result.setdefault("model", "")
            result["layer"] = layer
            result["section"] = catalogue[layer].get(result["case"], {}).get("section", "model-metadata")
    return document


def choice_of(layer: str, case: str, catalogue: dict[str, Any]) -> int | None:
    if layer == "protocol":
        return catalogue["protocol"].get(case, {}).get("choice")
    return next((n for pattern, n in GOLDEN_CHOICES if fnmatch.fnmatchcase(case, pattern)), None)


def totals(record: dict[str, Any]) -> dict[str, Counter[str]]:
    return {layer: Counter(r["outcome"] for r in record["results"] if r["layer"] == layer)
            for layer in ("golden", "protocol")}


def _count(counter: Counter[str]) -> str:
    return f"{counter['pass']} passed, {counter['fail']} failed, {counter['n/a']} n/a"


def totals_text(record: dict[str, Any], catalogue: dict[str, Any]) -> str:
    annotate({"catalogue": catalogue, "servers": {"one": record}})
    return "; ".join(f"{layer}: {_count(c)}" for layer, c in totals(record).items())


def _rows(document: dict[str, Any]) -> list[tuple[str, str]]:
    """Every case, golden first, as (layer, case)."""
    catalogue = document["catalogue"]
    return [("golden", c) for c in catalogue["golden"]] + [("protocol", c) for c in catalogue["protocol"]]


def _by_case(record: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for result in record["results"]:
        grouped.setdefault((result["layer"], result["case"]), []).append(result)
    return grouped


def cell(results: list[dict[str, Any]]) -> str:
    """One server's verdict on one case: pass, n/a, or FAIL with the forms and the share of models that failed."""
    if not results:
        return "-"
    failed = [r for r in results if r["outcome"] == "fail"]
    if not failed:
        return "pass" if any(r["outcome"] == "pass" for r in results) else "n/a"
    forms = sorted({r["transport"] for r in failed})
    every = sorted({r["transport"] for r in results if r["outcome"] != "n/a"})
    where = [] if forms == every else ["/".join(TRANSPORT_NAMES[t] for t in forms)]
    models = {r["model"] for r in results if r["model"] and r["outcome"] != "n/a"}
    if models:
        where.append(f"{len({r['model'] for r in failed})}/{len(models)} models")
    return "**FAIL**" + (f" ({', '.join(where)})" if where else "")


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def _words(layer: str, case: str, catalogue: dict[str, Any]) -> str:
    if layer == "protocol":
        return catalogue["protocol"][case]["rule"]
    entry = catalogue["golden"][case]
    return f"{entry['summary']} ({entry['source']})" if entry.get("source") else entry["summary"]


def failures(document: dict[str, Any], name: str) -> list[str]:
    """The evidence for each case `name` failed: the spec's words, what was expected, what the server answered."""
    record = document["servers"][name]
    catalogue = document["catalogue"]
    grouped = _by_case(record)
    lines: list[str] = []
    for layer, case in _rows(document):
        failed = [r for r in grouped.get((layer, case), []) if r["outcome"] == "fail"]
        if not failed:
            continue
        first = next((r for r in failed if "got" in r), failed[0])
        forms = ", ".join(TRANSPORT_NAMES[t] for t in sorted({r["transport"] for r in failed}))
        models = sorted({r["model"] for r in failed if r["model"]})
        scope = f"{forms}; {len(models)} models: {', '.join(models)}" if models else forms
        choice = choice_of(layer, case, catalogue)
        lines.append(f"- **{case}** ({scope}){f' · choice {choice}' if choice else ''}")
        lines.append(f"  - the spec: {_words(layer, case, catalogue)}")
        lines.append(f"  - expected: {_code(first.get('expected') or '')}")
        where = f"{first['model']}, " if first["model"] else ""
        lines.append(f"  - {record['label']} answered ({where}{TRANSPORT_NAMES[first['transport']]}): "
                     f"{_code(first.get('got') or first.get('detail', ''))}")
        if first.get("detail") and first.get("detail") != first.get("got"):
            lines.append(f"  - the difference: {first['detail']}")
        for needle, note in NOTES:
            if needle in first.get("detail", ""):
                lines.append(f"  - note: {note}")
    return lines


def markdown(document: dict[str, Any]) -> str:
    names = list(document["servers"])
    records = document["servers"]
    catalogue = document["catalogue"]
    out = [
        "# Conformance matrix",
        "",
        f"`make conformance-matrix` at commit {document['commit']} ({document['date']}): both layers of "
        "`python -m oip.conformance` against each server, each serving the example models of "
        "`spec/examples/models.yaml` in its own native form (`bench/conformance_native.py`). How the suite judges "
        "and what each case checks: [conformance.md](conformance.md). Every result: `conformance-matrix.json`.",
        "",
        "![conformance matrix](conformance-matrix.png)",
        "",
        "## Totals",
        "",
        "| server | version | golden cases | protocol cases |",
        "| --- | --- | --- | --- |",
    ]
    for name in names:
        record = records[name]
        version = str((record.get("metadata") or {}).get("version", "-"))
        if record["error"]:
            out.append(f"| {record['label']} | {version} | {record['error']} | |")
            continue
        counts = totals(record)
        out.append(f"| {record['label']} | {version} | {_count(counts['golden'])} | {_count(counts['protocol'])} |")
    out += ["", "## Models a server cannot express", ""]
    for name in names:
        cannot = records[name]["cannot"]
        text = "; ".join(f"`{m}`: {why}" for m, why in cannot.items()) if cannot else "none: it serves all of them"
        out.append(f"- **{records[name]['label']}**: {text}.")
    out += ["", "## The choices the table names", "",
            "Where the upstream documents disagree, spec/README.md (\"Choices where the sources disagree\") says "
            "which side the spec takes; a case that depends on such a choice names it, and a failure there is the "
            "other side of that choice rather than a plain error:", ""]
    used = sorted({c for layer, case in _rows(document) if (c := choice_of(layer, case, catalogue))})
    out += [f"- choice {n}: {CHOICES.get(n, '')}" for n in used]
    out += ["", "## Case by case", "",
            "`FAIL (REST, 3/17 models)`: failed over REST only, on 3 of the 17 models it applied to; `n/a`: the "
            "case did not apply (an extension the server does not list, a model it does not serve).", "",
            f"| case | layer | section | choice | {' | '.join(records[n]['label'] for n in names)} |",
            f"| --- | --- | --- | --- | {' | '.join('---' for _ in names)} |"]
    grouped = {name: _by_case(records[name]) for name in names}
    for layer, case in _rows(document):
        section = catalogue[layer][case]["section"]
        choice = choice_of(layer, case, catalogue) or ""
        cells = " | ".join(cell(grouped[n].get((layer, case), [])) for n in names)
        out.append(f"| `{case}` | {layer} | {SECTIONS.get(section, section)} | {choice} | {cells} |")
    for name in names:
        evidence = failures(document, name)
        out += ["", f"## What {records[name]['label']} answered where it failed", ""]
        out += evidence or ["No failure."]
    return "\n".join(out) + "\n"


def chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in document["servers"].items() if not r["error"]]
    labels = [document["servers"][n]["label"] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1, 1.3]})
    colours = {"pass": "#4c9a2a", "fail": "#c0392b", "n/a": "#bdc3c7"}
    for offset, layer in ((0, "golden"), (1, "protocol")):
        left_edge = [0.0] * len(names)
        for outcome in ("pass", "fail", "n/a"):
            values = [totals(document["servers"][n])[layer][outcome] for n in names]
            rows = [i * 2.6 + offset for i in range(len(names))]
            left.barh(rows, values, left=left_edge, color=colours[outcome], height=0.9,
                      label=outcome if offset == 0 else None)
            left_edge = [a + b for a, b in zip(left_edge, values, strict=True)]
    left.set_yticks([i * 2.6 + o for i in range(len(names)) for o in (0, 1)],
                    [f"{label} · {layer}" for label in labels for layer in ("golden", "protocol")])
    left.invert_yaxis()
    left.set_xlabel("results (cases x forms x models)")
    left.legend(loc="lower right")
    left.set_title("Totals per layer")
    sections = [s for s in SECTIONS if any(r["section"] == s for n in names for r in document["servers"][n]["results"])]
    shares = []
    for section in sections:
        row = []
        for name in names:
            counts = Counter(r["outcome"] for r in document["servers"][name]["results"] if r["section"] == section)
            applied = counts["pass"] + counts["fail"]
            row.append(counts["fail"] / applied if applied else float("nan"))
        shares.append(row)
    image = right.imshow(shares, cmap="RdYlGn_r", vmin=0, vmax=1, aspect="auto")
    right.set_xticks(range(len(names)), labels, rotation=20, ha="right")
    right.set_yticks(range(len(sections)), [SECTIONS[s] for s in sections], fontsize=8)
    for y, row in enumerate(shares):
        for x, value in enumerate(row):
            right.text(x, y, "n/a" if value != value else f"{value:.0%}", ha="center", va="center", fontsize=7)
    right.set_title("Share of applicable results that failed, per section")
    fig.colorbar(image, ax=right, fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def write(document: dict[str, Any], out: Path) -> Iterable[Path]:
    """Write the JSON document, the page and the chart into `out`; their paths."""
    paths = [out / "conformance-matrix.json", out / "conformance-matrix.md", out / "conformance-matrix.png"]
    saved = {**document, "servers": {name: {**record, "results": [
        {k: v for k, v in r.items() if k not in ("layer", "section") and (k != "model" or v)} for r in record["results"]
    ]} for name, record in document["servers"].items()}}
    paths[0].write_text(json.dumps(saved, ensure_ascii=False, separators=(",", ":")) + "\n")
    annotate(document)
    paths[1].write_text(markdown(document))
    chart(document, paths[2])
    return paths


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "conformance-matrix.json"
    data = annotate(json.loads(source.read_text()))
    paths = [source.with_suffix(".md"), source.with_suffix(".png")]
    paths[0].write_text(markdown(data))
    chart(data, paths[1])
    print(*paths, sep="\n")
