"""`make conformance-matrix`: both layers of the conformance suite (`oip.conformance`) against Triton 2.51,
MLServer 1.7.1, KServe 0.21.0 and our server, each serving the example models of spec/examples/models.yaml in its
own native form (bench/conformance_native.py), and the table and chart of the results (bench/conformance_table.py).

    python bench/conformance_matrix.py [--servers oipgen,triton,mlserver,kserve] [--out docs] [--only PATTERN ...]
                                       [--timeout S] [--work DIR]

Each server is started alone (bench/servers.py: loopback, free ports, its own process group), asked for every case
of both layers (the protocol layer over exactly the models it serves), and stopped. Triton runs with explicit model
control (`--model-control-mode=explicit --load-model=*`): in its default mode it lists `model_repository` but
refuses every load and unload. A server that is not set up (bash bench/setup.sh) is reported as not run. Writes
--out/conformance-matrix.json (every result; for each case that failed, what the server answered the first time),
conformance-matrix.md and conformance-matrix.png.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conformance_native
import servers
from servers import ROOT

sys.path.insert(0, str(ROOT / "generated"))

from oip import conformance, datatypes

ORDER = ("oipgen", "triton", "mlserver", "kserve")
OPTIONS = {"triton": ("--model-control-mode=explicit", "--load-model=*")}
START_TIMEOUT = 600.0  # Triton starts one Python-backend process per model


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip()


def run_server(name: str, cache: Path, work: Path, only: list[str] | None, timeout: float) -> dict[str, Any]:
    """Serve the example models natively on `name`, run both layers, stop; the server's record."""
    record: dict[str, Any] = {"label": servers.LABELS[name], "cannot": conformance_native.CANNOT[name],
                              "options": list(OPTIONS.get(name, ())), "results": [], "error": ""}
    why = servers.missing(name, cache)
    if why:
        record["error"] = f"not run: {why}"
        return record
    types = {d.name: d.model_config for d in datatypes.DATATYPES}
    served = conformance_native.write(name, conformance.MODELS, work / name / "models", types)
    record["served"] = served
    record["versions"] = servers.versions(name, cache)
    begin = time.monotonic()
    try:
        with servers.running(name, cache, work / name, START_TIMEOUT, models=tuple(served),
                             repository=work / name / "models", options=OPTIONS.get(name, ())) as server:
            record["metadata"] = server.metadata
            record["startup_s"] = round(server.startup_s, 1)
            results = conformance.run(url=f"http://{server.rest}", grpc=server.grpc, only=only, models=served,
                                      timeout=timeout)
    except RuntimeError as exc:
        record["error"] = str(exc)
        return record
    record["seconds"] = round(time.monotonic() - begin, 1)
    seen: set[tuple[str, str]] = set()
    record["results"] = [_compact(r, seen) for r in results]
    return record


def _compact(result: conformance.Result, seen: set[tuple[str, str]]) -> dict[str, Any]:
    """A result without what the report does not need or can derive (its layer and section are its case's); a
    failure with the difference, what was expected and what came the first time its case failed over its transport
    (the other models' failures of that case: the outcome only)."""
    out: dict[str, Any] = {"case": result.case, "transport": result.transport, "outcome": result.outcome}
    if result.model:
        out["model"] = result.model
    if result.not_applicable:
        out["detail"] = result.detail
    elif result.failed and (result.case, result.transport) not in seen:
        seen.add((result.case, result.transport))
        out.update(detail=result.detail, expected=result.expected, got=result.got)
    return out


def catalogue() -> dict[str, Any]:
    """What the report cites: each golden case's words and each protocol check's rule, section and choice."""
    from oip.conformance_golden import section_of
    from oip.conformance_protocol import CHECKS

    return {
        "golden": {c.name: {"summary": c.summary, "source": c.source, "transports": list(c.transports()),
                            "section": section_of(c.operation, conformance.ROUTES)} for c in conformance.CASES},
        "protocol": {c.id: {"rule": c.rule, "section": c.section, "choice": c.choice, "per_model": c.per_model,
                            "extension": c.extension, "transports": list(c.transports)} for c in CHECKS.values()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(ORDER), help="comma-separated (default: all four)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the table goes (default docs/)")
    parser.add_argument("--only", action="extend", nargs="+", metavar="PATTERN", help="only these cases")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--cache", type=Path, default=servers.BENCH / ".cache", help="bench/setup.sh's cache")
    args = parser.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        parser.error(f"unknown server(s) {', '.join(unknown)}; known: {', '.join(ORDER)}")
    import conformance_table

    with tempfile.TemporaryDirectory(prefix="conformance-matrix-") as scratch:
        work = args.work or Path(scratch)
        document = {"commit": _commit(), "date": datetime.date.today().isoformat(), "catalogue": catalogue(),
                    "servers": {}}
        for name in names:
            print(f"conformance-matrix: {servers.LABELS[name]} ...", flush=True)
            record = run_server(name, args.cache.resolve(), work, args.only, args.timeout)
            document["servers"][name] = record
            print(f"  {record['error'] or conformance_table.totals_text(record, document['catalogue'])}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in conformance_table.write(document, args.out):
        print(f"conformance-matrix: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
