"""How the conformance suite reports: one line per result, a summary per section, the models the golden cases
needed and the server did not serve, and the totals; or the same as one JSON document (`--format json`); and a
JUnit XML file for CI (`--junit FILE`: one test suite per layer, a NOT APPLICABLE case is a skipped test)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree

from .conformance_results import SECTIONS, Result

__all__ = ["as_json", "junit", "sections", "summary", "text_report", "unserved"]

_NEEDS = re.compile(r"^needs model (.+), which the server does not serve$")


def summary(results: Sequence[Result]) -> str:
    """`N passed, M failed` and, when there are any, `, K not applicable`."""
    counts = Counter(r.outcome for r in results)
    text = f"{counts['pass']} passed, {counts['fail']} failed"
    return f"{text}, {counts['n/a']} not applicable" if counts["n/a"] else text


def sections(results: Sequence[Result]) -> dict[str, dict[str, int]]:
    """Passed, failed and not applicable per section, in SECTIONS' order."""
    table: dict[str, dict[str, int]] = {}
    for key in [*SECTIONS, *sorted({r.section for r in results} - set(SECTIONS))]:
        counts = Counter(r.outcome for r in results if r.section == key)
        if counts:
            table[key] = {"passed": counts["pass"], "failed": counts["fail"], "not_applicable": counts["n/a"]}
    return table


def unserved(results: Sequence[Result]) -> dict[str, int]:
    """The models golden cases needed and the server does not serve, with how many cases (not forms) each."""
    cases: dict[str, set[str]] = {}
    for r in results:
        found = _NEEDS.match(r.detail) if r.not_applicable else None
        if found:
            for model in found.group(1).split(", "):
                cases.setdefault(model, set()).add(r.case)
    return {model: len(names) for model, names in sorted(cases.items())}


def text_report(results: Sequence[Result], notes: dict[str, str] | None = None) -> list[str]:
    """The lines after the results: per section, per layer, the unserved models, and the totals (last)."""
    table = sections(results)
    width = max([len("section"), *(len(SECTIONS.get(key, key)) for key in table)])
    lines = ["", f"{'section':{width}} {'passed':>6} {'failed':>6} {'n/a':>6}"]
    for key, counts in table.items():
        lines.append(f"{SECTIONS.get(key, key):{width}} {counts['passed']:6} {counts['failed']:6} "
                     f"{counts['not_applicable']:6}")
    layers = [(layer, [r for r in results if r.layer == layer]) for layer in ("golden", "protocol")]
    lines.append("; ".join(f"{layer}: {summary(rs)}" for layer, rs in layers if rs))
    missing = unserved(results)
    if missing:
        total = len({r.case for r in results if r.not_applicable and _NEEDS.match(r.detail)})
        listed = ", ".join(f"{model} ({count})" for model, count in missing.items())
        lines.append(f"{total} cases need models the server does not serve: {listed}")
    for note in (notes or {}).values():
        lines.append(note)
    lines.append(summary(results))
    return lines


def as_json(results: Sequence[Result], server: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole run as JSON data: totals, per layer, per section, unserved models, every result."""
    counts = Counter(r.outcome for r in results)
    return {
        "summary": {"passed": counts["pass"], "failed": counts["fail"], "not_applicable": counts["n/a"]},
        "layers": {layer: dict(Counter(r.outcome for r in results if r.layer == layer)) for layer in
                   ("golden", "protocol")},
        "sections": {SECTIONS.get(k, k): v for k, v in sections(results).items()},
        "unserved_models": unserved(results),
        "server": server or {},
        "results": [r.as_dict() for r in results],
    }


def junit(results: Sequence[Result], name: str) -> bytes:
    """JUnit XML: a test suite per layer, a test case per result (classname: the section)."""
    root = ElementTree.Element("testsuites", name=name)
    for layer in ("golden", "protocol"):
        chosen = [r for r in results if r.layer == layer]
        if not chosen:
            continue
        counts = Counter(r.outcome for r in chosen)
        suite = ElementTree.SubElement(root, "testsuite", name=f"{name}.{layer}", tests=str(len(chosen)),
                                       failures=str(counts["fail"]), skipped=str(counts["n/a"]), errors="0")
        for r in chosen:
            case = ElementTree.SubElement(suite, "testcase", classname=SECTIONS.get(r.section, r.section),
                                          name=f"{r.name} ({r.transport})")
            if r.failed:
                failure = ElementTree.SubElement(case, "failure", message=r.detail)
                failure.text = f"expected: {r.expected}\ngot: {r.got or r.response}"
            elif r.not_applicable:
                ElementTree.SubElement(case, "skipped", message=r.detail)
    ElementTree.indent(root)
    return bytes(ElementTree.tostring(root, encoding="utf-8", xml_declaration=True))
