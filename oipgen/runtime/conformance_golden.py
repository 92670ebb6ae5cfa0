"""The golden layer: replay the spec's golden cases (one REST/gRPC exchange each) against a server that serves the
example models, and compare the answers by the rules of spec/examples/models.yaml.

- REST: the status code must be equal. `events: [...]` expects a `text/event-stream` answer whose `data:`
  events are those JSON values, in order (compared as bodies are). `{"error": True}` as the expected body means
  "an Error body", a JSON object whose only key is `error`, a string. No expected body means an empty body.
  Otherwise the bodies must be equal as JSON values (`compare_json`).
- gRPC: the status code must be equal; on success the response message must equal the expected one (both printed
  with json_format, so defaults, 64-bit integers and bytes compare in one canonical form).
- `compare: keys` compares only the set of top-level keys (over gRPC with fields at their defaults printed).

A case that needs an example model the server does not serve (its readiness is not a 200 / ready) is NOT
APPLICABLE, and says which model: a server that serves some of the example models is judged on those.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from google.protobuf import json_format

from .conformance_results import (
    NOT_APPLICABLE,
    TRANSPORTS,
    Answer,
    Result,
    Route,
    Target,
    compare_json,
    compare_keys,
    print_message,
    show,
)

__all__ = ["Case", "listed_extensions", "needed_models", "read_cases", "run_golden", "section_of", "served_models"]

# The sections of the core protocol's RPCs; an extension's RPCs are in the extension's section.
_CORE_SECTIONS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "ServerMetadata": "server-metadata",
    "ModelMetadata": "model-metadata", "ModelInfer": "inference", "ModelStreamInfer": "inference",
}


@dataclass(frozen=True)
class Case:
    """One golden case: the request and the expected answer over REST and/or gRPC (None: no such form), and
    where its rule comes from (`source`, the case file's own words)."""

    name: str
    summary: str
    operation: str
    compare: str | None
    rest: dict[str, Any] | None
    grpc: dict[str, Any] | None
    source: str = ""

    def transports(self) -> tuple[str, ...]:
        return tuple(t for t in TRANSPORTS if getattr(self, t) is not None)


def read_cases(path: Path) -> tuple[tuple[dict[str, Any], ...], tuple[Case, ...]]:
    """The example models and the golden cases of the package data file at `path` (`conformance.json`)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    cases = tuple(
        Case(case["name"], case["summary"], case["operation"], case["compare"], case["rest"], case["grpc"],
             case.get("source", ""))
        for case in data["cases"]
    )
    return tuple(data["models"]), cases


def section_of(operation: str, routes: Mapping[str, Route]) -> str:
    """The section a case of `operation` (an RPC or a REST-only operation) checks."""
    if operation in _CORE_SECTIONS:
        return _CORE_SECTIONS[operation]
    for route in routes.values():
        if route.rpc == operation:
            return route.extension or "generate"
    return "inference"


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def needed_models(case: Case, models: Iterable[str]) -> list[str]:
    """The example models a case needs: those it names in a path, a request or an expected answer."""
    names = set(models)
    found: set[str] = set()
    for form in (case.rest, case.grpc):
        if form is None:
            continue
        found.update(part for part in str(form.get("path", "")).split("/") if part in names)
        found.update(s for s in _strings({k: v for k, v in form.items() if k != "path"}) if s in names)
    return sorted(found)


def listed_extensions(target: Target) -> list[str] | None:
    """The extensions the server lists in its metadata (None: its metadata could not be read)."""
    data: Any = None
    if target.http is not None and "server_metadata" in target.routes:
        route = target.routes["server_metadata"]
        answer = target.request(route.method, route.path)
        try:
            data = answer.json() if answer.status == 200 else None
        except ValueError:
            data = None
    elif target.stub is not None:
        answer = target.call("ServerMetadata", {})
        data = print_message(answer.message) if answer.status == "OK" and answer.message is not None else None
    listed = data.get("extensions") if isinstance(data, dict) else None
    return [e for e in listed if isinstance(e, str)] if isinstance(listed, list) else None


def served_models(target: Target, names: Iterable[str]) -> dict[str, bool]:
    """Whether the server serves each model: its readiness answers 200 over REST (ready: true over gRPC)."""
    served: dict[str, bool] = {}
    for name in names:
        if target.http is not None and "model_ready" in target.routes:
            route = target.routes["model_ready"]
            answer = target.request(route.method, route.path.format(model_name=quote(name, safe="")))
            served[name] = answer.status == 200
        elif target.stub is not None:
            answer = target.call("ModelReady", {"name": name})
            served[name] = answer.status == "OK" and bool(getattr(answer.message, "ready", False))
        else:
            served[name] = False
    return served


# ---------------------------------------------------------------------------------------------------------------
# Comparison of REST answers


def _summarize(problems: list[str], limit: int = 4) -> str:
    more = len(problems) - limit
    return "; ".join(problems[:limit]) + (f"; and {more} more" if more > 0 else "")


def _compare_body(spec: dict[str, Any], compare: str | None, body: bytes) -> list[str]:
    """The differences between a REST answer's body and the case's expected `response`."""
    if "response" not in spec:
        return [] if not body else [f"expected an empty body, got {show(body.decode('utf-8', 'replace'))}"]
    try:
        actual = json.loads(body)
    except ValueError:
        return [f"the body is not JSON: {show(body.decode('utf-8', 'replace'))}"]
    expected = spec["response"]
    if expected == {"error": True} and isinstance(expected.get("error"), bool):
        if not isinstance(actual, dict) or set(actual) != {"error"} or not isinstance(actual["error"], str):
            return ['expected an error body {"error": "<message>"}, got ' + show(actual)]
        return []
    if compare == "keys":
        if not isinstance(actual, dict):
            return [f"expected an object with keys {sorted(expected)}, got {show(actual)}"]
        return compare_keys(expected, actual)
    return compare_json(expected, actual)


def _compare_events(expected: list[Any], answer: Answer) -> list[str]:
    """The differences between a server-sent events answer and the expected `data` of its events."""
    kind = answer.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        return [f"expected a text/event-stream answer, got {kind or 'no content type'}"]
    events: list[Any] = []
    data: list[str] = []
    for line in answer.body.decode("utf-8", "replace").splitlines():
        if not line:
            if data:
                try:
                    events.append(json.loads("\n".join(data)))
                except ValueError:
                    return [f"event {len(events)} is not JSON: {show(chr(10).join(data))}"]
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        return [f"the last event is not ended by a blank line: {show(chr(10).join(data))}"]
    return compare_json(expected, events, "events")


def _expected_rest(spec: dict[str, Any]) -> str:
    if "events" in spec:
        return f"{spec['status']} with the events {show(spec['events'], 200)}"
    if "response" not in spec:
        return f"{spec['status']} with an empty body"
    if spec["response"] == {"error": True}:
        return f"{spec['status']} with {{\"error\": \"<message>\"}}"
    return f"{spec['status']} {show(spec['response'], 200)}"


# ---------------------------------------------------------------------------------------------------------------
# Replay


def _run_rest(target: Target, case: Case, section: str) -> Result:
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
    answer = target.request(spec["method"], spec["path"], content=content, headers=headers)
    result = partial(Result, case.name, "rest", section=section, expected=_expected_rest(spec))
    if answer.error:
        return result("fail", detail=answer.error, got=answer.error)
    shown = answer.text(2000)
    problems = []
    if answer.status != spec["status"]:
        problems.append(f"status {answer.status}, expected {spec['status']}")
    if "events" in spec:
        problems += _compare_events(spec["events"], answer)
    else:
        problems += _compare_body(spec, case.compare, answer.body)
    if problems:
        return result("fail", detail=_summarize(problems), response=shown, got=answer.text())
    return result("pass", response=shown)


def _run_grpc(target: Target, case: Case, section: str) -> Result:
    spec = case.grpc
    assert spec is not None
    want = str(spec["code"])
    result = partial(Result, case.name, "grpc", section=section)
    rpc = target.rpcs.get(case.operation)
    if rpc is None:
        return result("fail", detail=f"the case names an unknown RPC {case.operation!r}")
    if rpc.streaming:
        return result(NOT_APPLICABLE, detail=f"{rpc.name} streams; streaming cases are not replayed")
    try:
        request = json_format.ParseDict(spec.get("request", {}), rpc.request())
        expected = None
        if "response" in spec:
            expected = print_message(json_format.ParseDict(spec["response"], rpc.response()))
    except json_format.ParseError as exc:
        return result("fail", detail=f"the case does not parse as {rpc.name} messages: {exc}")
    result = partial(result, expected=want if expected is None else f"{want} {show(expected, 200)}")
    answer = target.call(rpc.name, request)
    shown = answer.text(2000)
    if answer.status != "OK":
        if answer.status == want:
            return result("pass", response=shown)
        detail = f"code {answer.status} ({answer.details}), expected {want}"
        return result("fail", detail=detail, response=shown, got=answer.text())
    if not isinstance(answer.message, rpc.response):
        wrong = f"the answer is a {type(answer.message).__name__}, not {rpc.response.__name__}"
        return result("fail", detail=wrong)
    actual = print_message(answer.message, defaults=case.compare == "keys")
    shown = f"OK {json.dumps(actual)}"
    if want != "OK":
        return result("fail", detail=f"code OK, expected {want}: {show(actual)}", response=shown,
                      got=shown[:300])
    problems: list[str] = []
    if case.compare == "keys":
        problems = compare_keys(spec["response"], actual)
    elif expected is not None:
        problems = compare_json(expected, actual)
    if problems:
        return result("fail", detail=_summarize(problems), response=shown, got=shown[:300])
    return result("pass", response=shown)


def run_golden(
    target: Target, cases: Sequence[Case], models: Iterable[str], transports: Sequence[str] = TRANSPORTS
) -> list[Result]:
    """Replay `cases` over the transports named (REST before gRPC, in case order). A transport without an address
    is NOT APPLICABLE, and so is a case of an extension the server does not list (when it lists any at all) and a
    case that needs an example model the server does not serve."""
    names = list(models)
    needs = {case.name: needed_models(case, names) for case in cases}
    wanted = sorted({m for ms in needs.values() for m in ms})
    served = served_models(target, wanted) if (target.http or target.stub) else {}
    listed = listed_extensions(target) if (target.http or target.stub) and cases else None
    owners = {route.rpc: route.extension for route in target.routes.values()}
    results: list[Result] = []
    for case in cases:
        section = section_of(case.operation, target.routes)
        missing = [m for m in needs[case.name] if not served.get(m, False)]
        extension = owners.get(case.operation)
        for transport in case.transports():
            if transport not in transports:
                continue
            if not target.has(transport):
                flag = "--url" if transport == "rest" else "--grpc"
                why = f"no {'REST' if transport == 'rest' else 'gRPC'} address given ({flag})"
                results.append(Result(case.name, transport, NOT_APPLICABLE, why, section=section))
            elif extension and listed is not None and extension not in listed:
                why = f"the server does not list the {extension} extension"
                results.append(Result(case.name, transport, NOT_APPLICABLE, why, section=section))
            elif missing:
                why = f"needs model {', '.join(missing)}, which the server does not serve"
                results.append(Result(case.name, transport, NOT_APPLICABLE, why, section=section))
            elif transport == "rest":
                results.append(_run_rest(target, case, section))
            else:
                results.append(_run_grpc(target, case, section))
    return results
