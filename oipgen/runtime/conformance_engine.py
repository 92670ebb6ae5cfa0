"""The conformance suite's engine: two layers of cases against any Open Inference Protocol server, over REST and
gRPC. `conformance.py` (rendered from the spec) holds the service's RPCs, its REST routes and the golden cases,
which ship as package data (`conformance.json`); see its docstring for the command line.

- The golden layer (`conformance_golden`) replays the spec's golden cases: for a server that serves the example
  models of spec/examples/models.yaml. A case whose model the server does not serve is NOT APPLICABLE, and the
  summary says which models were missing.
- The protocol layer (`conformance_protocol`, its checks in `conformance_checks` and `conformance_inference`)
  needs no particular model: it derives its cases from the server's own metadata, extensions and models.

Every result is PASS, FAIL (what was expected, what came) or NOT APPLICABLE (why), and names the section of the
protocol it checks. This engine is runtime code: it imports nothing but the package it ships in.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc as _grpc

from . import conformance_checks, conformance_inference  # noqa: F401  (they register the protocol layer's checks)
from .conformance_golden import Case, run_golden
from .conformance_protocol import CHECKS, Check, run_protocol
from .conformance_report import as_json, junit, text_report
from .conformance_results import CHOICES, LAYERS, SECTIONS, TRANSPORTS, Result, Route, Rpc, Target

__all__ = ["DEFAULT_GRPC", "DEFAULT_URL", "Suite"]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_GRPC = "127.0.0.1:8001"


class Suite:
    """Both layers of one spec: the golden `cases` and the example `models` they need, the service's RPCs by name
    (`rpcs`), its gRPC stub class (`stub`, called with a channel), its REST `routes` by operation id, and the
    command's name (`prog`)."""

    def __init__(
        self, cases: Sequence[Case], rpcs: Mapping[str, Rpc], stub: Callable[[_grpc.Channel], Any], prog: str,
        *, routes: Mapping[str, Route], models: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.cases = tuple(cases)
        self.rpcs = rpcs
        self.stub = stub
        self.prog = prog
        self.routes = routes
        self.models = tuple(models)

    @property
    def checks(self) -> tuple[Check, ...]:
        return tuple(CHECKS.values())

    def select(self, only: Iterable[str] | None = None) -> list[Case]:
        """The golden cases named by `only` (exact names or shell patterns such as `infer_simple_*`), or every
        case; ValueError for a pattern that matches no case of either layer."""
        return self._select(only)[0]

    def _select(self, only: Iterable[str] | None) -> tuple[list[Case], list[Check]]:
        if not only:
            return list(self.cases), list(self.checks)
        patterns = list(only)
        names = [c.name for c in self.cases] + [c.id for c in self.checks]
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
        if unknown:
            raise ValueError(f"no case matches {', '.join(unknown)}")

        def chosen(name: str) -> bool:
            return any(fnmatch.fnmatchcase(name, p) for p in patterns)

        return [c for c in self.cases if chosen(c.name)], [c for c in self.checks if chosen(c.id)]

    def run(
        self,
        url: str | None = None,
        grpc: str | None = None,
        only: Iterable[str] | None = None,
        *,
        layers: Sequence[str] = LAYERS,
        models: Sequence[str] | None = None,
        transports: Sequence[str] = TRANSPORTS,
        timeout: float = 10.0,
    ) -> list[Result]:
        """Run the layers named (golden cases, then protocol checks) over REST at `url` and gRPC at `grpc`
        (host:port); `only` picks cases of either layer by name or pattern, `models` names the models the protocol
        layer checks (default: those the server reports, or the example models it serves).

        A transport without an address is NOT APPLICABLE; a case without a form for a transport is not run over
        it. Golden results come in case order, REST before gRPC.
        """
        cases, checks = self._select(only)
        target = Target(url if "rest" in transports else None, grpc if "grpc" in transports else None, self.stub,
                        self.rpcs, self.routes, timeout)
        examples = [str(m["name"]) for m in self.models]
        results: list[Result] = []
        try:
            if "golden" in layers:
                results += run_golden(target, cases, examples, transports)
            if "protocol" in layers:
                results += run_protocol(target, checks, models, examples, transports)
        finally:
            target.close()
        return results

    def _parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=self.prog,
            description="Check an Open Inference Protocol server over REST and gRPC: the golden cases of the spec "
            "(for a server that serves the example models) and protocol cases derived from the server's own "
            "metadata. Each case is PASS, FAIL or NOT APPLICABLE, with the spec section it checks.",
        )
        parser.add_argument("--url", default=DEFAULT_URL, help=f"REST base URL (default {DEFAULT_URL})")
        parser.add_argument(
            "--grpc", default=DEFAULT_GRPC, metavar="HOST:PORT", help=f"gRPC address (default {DEFAULT_GRPC})"
        )
        parser.add_argument("--layer", choices=[*LAYERS, "all"], default="all",
                            help="golden cases, protocol cases or both (default: all)")
        parser.add_argument("--model", action="extend", nargs="+", metavar="NAME",
                            help="protocol layer: check these models (default: the ready models the server lists, "
                            "or the example models it serves)")
        parser.add_argument("--only", action="extend", nargs="+", metavar="NAME",
                            help="run only these cases (names or shell patterns, of either layer)")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--rest-only", action="store_true", help="REST only")
        which.add_argument("--grpc-only", action="store_true", help="gRPC only")
        parser.add_argument("--format", choices=["text", "json"], default="text",
                            help="text: a line per result and summaries; json: one document (default: text)")
        parser.add_argument("--junit", metavar="FILE", type=Path, help="also write the results as JUnit XML")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
        parser.add_argument("--list", action="store_true", help="list the cases and exit")
        parser.add_argument("--verbose", "-v", action="store_true",
                            help="show each case's rule or summary and every answer")
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        """The command line: run the cases, report, exit 1 if any failed."""
        parser = self._parser()
        args = parser.parse_args(argv)
        layers = LAYERS if args.layer == "all" else (args.layer,)
        try:
            cases, checks = self._select(args.only)
        except ValueError as exc:
            parser.error(str(exc))
        if args.list:
            if "golden" in layers:
                for case in cases:
                    print(f"{case.name:45} {'/'.join(case.transports()):9} {case.summary}")
            if "protocol" in layers:
                for item in checks:
                    scope = "per model" if item.per_model else "server"
                    print(f"{item.id:45} {'/'.join(item.transports):9} {SECTIONS[item.section]} ({scope})")
            return 0
        transports = ("rest",) if args.rest_only else ("grpc",) if args.grpc_only else TRANSPORTS
        results = self.run(args.url, args.grpc, args.only, layers=layers, models=args.model, transports=transports,
                           timeout=args.timeout)
        if args.junit:
            args.junit.write_bytes(junit(results, self.prog.split()[-1]))
        if args.format == "json":
            print(json.dumps(as_json(results, {"url": args.url, "grpc": args.grpc}), indent=1))
        else:
            self._print(results, args.verbose)
        return 1 if any(r.failed for r in results) else 0

    def _print(self, results: Sequence[Result], verbose: bool) -> None:
        summaries = {case.name: case.summary for case in self.cases}
        for run in _runs(results, fold=not verbose):
            result = run[0]
            if len(run) > 1:  # one line for a run of results NOT APPLICABLE for the same reason
                print(f"N/A  {'-':4} {result.case} ... {run[-1].name} ({len(run)} results): {result.detail}")
                continue
            print(result.line())
            if verbose:
                rule = summaries.get(result.case) or (CHECKS[result.case].rule if result.case in CHECKS else "")
                choice = ""
                if result.choice is not None:
                    choice = f" [spec/README.md, choice {result.choice}: {CHOICES.get(result.choice, '')}]"
                print(f"     {SECTIONS.get(result.section, result.section)}: {rule}{choice}")
                if result.response:
                    answer = result.response if len(result.response) <= 2000 else result.response[:1997] + "..."
                    print(f"     answer: {answer}")
        for line in text_report(results):
            print(line)


def _runs(results: Sequence[Result], fold: bool, least: int = 3) -> list[list[Result]]:
    """The results in order, runs of at least `least` consecutive NOT APPLICABLE results of one model with one
    reason together (when `fold`)."""
    runs: list[list[Result]] = []
    for result in results:
        last = runs[-1] if runs else None
        if (fold and last is not None and result.not_applicable and last[0].not_applicable
                and (last[0].model, last[0].detail) == (result.model, result.detail)):
            last.append(result)
        else:
            runs.append([result])
    return [run for group in runs for run in ([group] if len(group) >= least else [[r] for r in group])]
