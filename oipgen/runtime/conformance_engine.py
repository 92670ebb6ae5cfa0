"""The conformance runner's engine: replay golden cases against any Open Inference Protocol server and compare
the answers. `conformance.py` (rendered from the spec) holds the service's RPC table and reads the cases, which
ship as package data (`conformance.json`); see its docstring for the rules and the command line.

- REST: the status code must be equal. `events: [...]` expects a `text/event-stream` answer whose `data:`
  events are those JSON values, in order (compared as bodies are). `{"error": True}` as the expected body means
  "an Error body", a JSON object whose only key is `error`, a string. No expected body means an empty body.
  Otherwise the bodies must be equal as JSON values (`compare_json`).
- gRPC: the status code must be equal; on success the response message must equal the expected one (both printed
  with json_format, so defaults, 64-bit integers and bytes compare in one canonical form).
- `compare: keys` compares only the set of top-level keys (over gRPC with fields at their defaults printed).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import grpc as _grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import Message

__all__ = [
    "DEFAULT_GRPC", "DEFAULT_URL", "TRANSPORTS", "Case", "Result", "Rpc", "Suite", "compare_json", "compare_keys",
    "read_cases", "summary",
]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_GRPC = "127.0.0.1:8001"
TRANSPORTS: tuple[str, ...] = ("rest", "grpc")

Outcome = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Rpc:
    """An RPC of the service: its request and response message types, and whether it streams."""

    name: str
    request: type[Message]
    response: type[Message]
    streaming: bool




@dataclass(frozen=True)
class Case:
    """One golden case: the request and the expected answer over REST and/or gRPC (None: no such form)."""

    name: str
    summary: str
    operation: str
    compare: str | None
    rest: dict[str, Any] | None
    grpc: dict[str, Any] | None

    def transports(self) -> tuple[str, ...]:
        return tuple(t for t in TRANSPORTS if getattr(self, t) is not None)


@dataclass(frozen=True)
class Result:
    """The outcome of one case over one transport; `detail` says what differed (or why it was skipped)."""

    case: str
    transport: str
    outcome: Outcome
    detail: str = ""
    response: str = ""  # what the server answered, for --verbose

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    @property
    def skipped(self) -> bool:
        return self.outcome == "skip"

    def line(self) -> str:
        text = f"{self.outcome.upper():4} {self.transport:4} {self.case}"
        return f"{text}: {self.detail}" if self.detail and not self.passed else text


# ---------------------------------------------------------------------------------------------------------------
# Comparison


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: str) -> str:
    return path or "the body"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def compare_json(expected: Any, actual: Any, path: str = "") -> list[str]:
    """The differences between two JSON values (empty when equal): numbers compare by value, so 2 equals 2.0,
    but a boolean never equals a number; object key order does not matter; a missing key is a difference."""
    kind = _kind(expected)
    if kind != _kind(actual):
        return [f"{_where(path)}: expected {kind} {_show(expected)}, got {_kind(actual)} {_show(actual)}"]
    if kind == "object":
        problems: list[str] = []
        for key in expected:
            if key not in actual:
                problems.append(f"{_where(path)}: missing key {key!r} (expected {_show(expected[key])})")
            else:
                problems += compare_json(expected[key], actual[key], f"{path}.{key}" if path else str(key))
        for key in actual:
            if key not in expected:
                problems.append(f"{_where(path)}: unexpected key {key!r} = {_show(actual[key])}")
        return problems
    if kind == "array":
        if len(expected) != len(actual):
            return [
                f"{_where(path)}: expected {len(expected)} items {_show(expected)}, got {len(actual)} {_show(actual)}"
            ]
        problems = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            problems += compare_json(e, a, f"{path}[{i}]")
        return problems
    if expected != actual:
        return [f"{_where(path)}: expected {_show(expected)}, got {_show(actual)}"]
    return []


def _summarize(problems: list[str], limit: int = 4) -> str:
    more = len(problems) - limit
    return "; ".join(problems[:limit]) + (f"; and {more} more" if more > 0 else "")


def _compare_body(spec: dict[str, Any], compare: str | None, body: bytes) -> list[str]:
    """The differences between a REST answer's body and the case's expected `response`."""
    if "response" not in spec:
        return [] if not body else [f"expected an empty body, got {_show(body.decode('utf-8', 'replace'))}"]
    try:
        actual = json.loads(body)
    except ValueError:
        return [f"the body is not JSON: {_show(body.decode('utf-8', 'replace'))}"]
    expected = spec["response"]
    if expected == {"error": True} and isinstance(expected.get("error"), bool):
        if not isinstance(actual, dict) or set(actual) != {"error"} or not isinstance(actual["error"], str):
            return ['expected an error body {"error": "<message>"}, got ' + _show(actual)]
        return []
    if compare == "keys":
        if not isinstance(actual, dict):
            return [f"expected an object with keys {sorted(expected)}, got {_show(actual)}"]
        return compare_keys(expected, actual)
    return compare_json(expected, actual)


def _compare_events(expected: list[Any], answer: httpx.Response) -> list[str]:
    """The differences between a server-sent events answer and the expected `data` of its events."""
    kind = answer.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        return [f"expected a text/event-stream answer, got {kind or 'no content type'}"]
    events: list[Any] = []
    data: list[str] = []
    for line in answer.text.splitlines():
        if not line:
            if data:
                try:
                    events.append(json.loads("\n".join(data)))
                except ValueError:
                    return [f"event {len(events)} is not JSON: {_show(chr(10).join(data))}"]
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        return [f"the last event is not ended by a blank line: {_show(chr(10).join(data))}"]
    return compare_json(expected, events, "events")


def compare_keys(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = [f"missing key {key!r}" for key in expected if key not in actual]
    return problems + [f"unexpected key {key!r}" for key in actual if key not in expected]


# ---------------------------------------------------------------------------------------------------------------
# Transports


def _run_rest(client: httpx.Client, case: Case) -> Result:
    spec = case.rest
    assert spec is not None
    content: bytes | None = None
    headers: dict[str, str] = {}
    if "body" in spec:
        content = json.dumps(spec["body"]).encode()
        headers["Content-Type"] = "application/json"
    elif "raw_body" in spec:
        content = str(spec["raw_body"]).encode()
        headers["Content-Type"] = "application/json"
    try:
        answer = client.request(spec["method"], spec["path"], content=content, headers=headers)
    except httpx.HTTPError as exc:
        return Result(case.name, "rest", "fail", f"{spec['method']} {spec['path']} failed: {exc!r}")
    shown = f"{answer.status_code} {answer.content.decode('utf-8', 'replace')}"
    problems = []
    if answer.status_code != spec["status"]:
        problems.append(f"status {answer.status_code}, expected {spec['status']}")
    if "events" in spec:
        problems += _compare_events(spec["events"], answer)
    else:
        problems += _compare_body(spec, case.compare, answer.content)
    if problems:
        return Result(case.name, "rest", "fail", _summarize(problems), shown)
    return Result(case.name, "rest", "pass", response=shown)


def _print_message(message: Message, defaults: bool = False) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=defaults
    )


def _run_grpc(stub: Any, rpcs: Mapping[str, Rpc], case: Case, timeout: float) -> Result:
    spec = case.grpc
    assert spec is not None
    rpc = rpcs.get(case.operation)
    if rpc is None:
        return Result(case.name, "grpc", "fail", f"the case names an unknown RPC {case.operation!r}")
    if rpc.streaming:
        return Result(case.name, "grpc", "skip", f"{rpc.name} streams; streaming cases are not replayed")
    try:
        request = json_format.ParseDict(spec.get("request", {}), rpc.request())
        expected = None
        if "response" in spec:
            expected = _print_message(json_format.ParseDict(spec["response"], rpc.response()))
    except json_format.ParseError as exc:
        return Result(case.name, "grpc", "fail", f"the case does not parse as {rpc.name} messages: {exc}")
    method = cast(Any, getattr(stub, rpc.name))
    want = str(spec["code"])
    try:
        answer = method(request, timeout=timeout)
    except _grpc.RpcError as exc:
        call = cast(_grpc.Call, exc)
        got = call.code().name
        shown = f"{got} {call.details()}"
        if got == want:
            return Result(case.name, "grpc", "pass", response=shown)
        return Result(case.name, "grpc", "fail", f"code {got} ({call.details()}), expected {want}", shown)
    if not isinstance(answer, rpc.response):
        wrong = f"the answer is a {type(answer).__name__}, not {rpc.response.__name__}"
        return Result(case.name, "grpc", "fail", wrong)
    actual = _print_message(answer, defaults=case.compare == "keys")
    shown = f"OK {json.dumps(actual)}"
    if want != "OK":
        return Result(case.name, "grpc", "fail", f"code OK, expected {want}: {_show(actual)}", shown)
    problems: list[str] = []
    if case.compare == "keys":
        problems = compare_keys(spec["response"], actual)
    elif expected is not None:
        problems = compare_json(expected, actual)
    if problems:
        return Result(case.name, "grpc", "fail", _summarize(problems), shown)
    return Result(case.name, "grpc", "pass", response=shown)


# ---------------------------------------------------------------------------------------------------------------
# Running


def read_cases(path: Path) -> tuple[tuple[dict[str, Any], ...], tuple[Case, ...]]:
    """The example models and the golden cases of the package data file at `path` (`conformance.json`)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    cases = tuple(
        Case(case["name"], case["summary"], case["operation"], case["compare"], case["rest"], case["grpc"])
        for case in data["cases"]
    )
    return tuple(data["models"]), cases


def summary(results: Sequence[Result]) -> str:
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results)
    skipped = sum(r.skipped for r in results)
    text = f"{passed} passed, {failed} failed"
    return f"{text}, {skipped} skipped" if skipped else text


class Suite:
    """The golden cases of one spec and how to replay them: `cases`, the service's RPCs by name (`rpcs`), its gRPC
    stub class (`stub`, called with a channel) and the command's name (`prog`)."""

    def __init__(
        self, cases: Sequence[Case], rpcs: Mapping[str, Rpc], stub: Callable[[_grpc.Channel], Any], prog: str
    ) -> None:
        self.cases = tuple(cases)
        self.rpcs = rpcs
        self.stub = stub
        self.prog = prog

    def select(self, only: Iterable[str] | None = None) -> list[Case]:
        """The cases named by `only` (exact names or shell patterns such as `infer_simple_*`), or every case."""
        if not only:
            return list(self.cases)
        patterns = list(only)
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in self.cases)]
        if unknown:
            raise ValueError(f"no case matches {', '.join(unknown)}")
        return [c for c in self.cases if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]

    def run(
        self,
        url: str | None = None,
        grpc: str | None = None,
        only: Iterable[str] | None = None,
        *,
        transports: Sequence[str] = TRANSPORTS,
        timeout: float = 10.0,
    ) -> list[Result]:
        """Replay the cases (all, or those `only` names) over REST at `url` and gRPC at `grpc` (host:port).

        A case whose transport has no address (None) is skipped; a case without a form for a transport is not run
        over it. Results come in case order, REST before gRPC.
        """
        cases = self.select(only)
        client = httpx.Client(base_url=url, timeout=timeout, trust_env=False) if url and "rest" in transports else None
        channel = None
        stub = None
        if grpc and "grpc" in transports:
            channel = _grpc.insecure_channel(
                grpc, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            )
            stub = self.stub(channel)
        results: list[Result] = []
        try:
            for case in cases:
                for transport in case.transports():
                    if transport not in transports:
                        continue
                    if transport == "rest":
                        if client is None:
                            results.append(Result(case.name, "rest", "skip", "no REST address given (--url)"))
                        else:
                            results.append(_run_rest(client, case))
                    elif stub is None:
                        results.append(Result(case.name, "grpc", "skip", "no gRPC address given (--grpc)"))
                    else:
                        results.append(_run_grpc(stub, self.rpcs, case, timeout))
        finally:
            if client is not None:
                client.close()
            if channel is not None:
                channel.close()
        return results

    def main(self, argv: Sequence[str] | None = None) -> int:
        """The command line: replay the cases, print one line per case and transport, exit 1 if any failed."""
        parser = argparse.ArgumentParser(
            prog=self.prog,
            description="Replay the Open Inference Protocol golden cases against a server that serves the example "
            "models, over REST and gRPC, and report PASS/FAIL per case and transport.",
        )
        parser.add_argument("--url", default=DEFAULT_URL, help=f"REST base URL (default {DEFAULT_URL})")
        parser.add_argument(
            "--grpc", default=DEFAULT_GRPC, metavar="HOST:PORT", help=f"gRPC address (default {DEFAULT_GRPC})"
        )
        parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these cases (names or shell patterns)")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--rest-only", action="store_true", help="replay the REST forms only")
        which.add_argument("--grpc-only", action="store_true", help="replay the gRPC forms only")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
        parser.add_argument("--list", action="store_true", help="list the cases and exit")
        parser.add_argument("--verbose", "-v", action="store_true", help="show each case's summary and every answer")
        args = parser.parse_args(argv)
        try:
            cases = self.select(args.only)
        except ValueError as exc:
            parser.error(str(exc))
        if args.list:
            for case in cases:
                print(f"{case.name:45} {'/'.join(case.transports()):9} {case.summary}")
            return 0
        transports = ("rest",) if args.rest_only else ("grpc",) if args.grpc_only else TRANSPORTS
        summaries = {case.name: case.summary for case in cases}
        results = self.run(args.url, args.grpc, [c.name for c in cases], transports=transports, timeout=args.timeout)
        for result in results:
            print(result.line())
            if args.verbose:
                print(f"     {summaries[result.case]}")
                if result.response:
                    answer = result.response if len(result.response) <= 2000 else result.response[:1997] + "..."
                    print(f"     answer: {answer}")
        print(summary(results))
        return 1 if any(r.failed for r in results) else 0
