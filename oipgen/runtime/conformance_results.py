"""The conformance suite's vocabulary: what a case is made of and what it finds (`Result`), the spec sections cases
name, how answers are compared (`compare_json`, `compare_keys`), and the transport helpers both layers call
(`Target`: one REST client and one gRPC stub, and what they answered as an `Answer`).

Outcomes: PASS, FAIL (with what was expected and what came) and NOT APPLICABLE (with the reason: the server does
not list the extension, the model is not served, no address was given for the transport).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import grpc as _grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import Message

__all__ = [
    "CHOICES", "LAYERS", "NOT_APPLICABLE", "SECTIONS", "TRANSPORTS", "Answer", "Outcome", "Result", "Route", "Rpc",
    "Target", "compare_json", "compare_keys", "print_message", "show",
]

TRANSPORTS: tuple[str, ...] = ("rest", "grpc")
LAYERS: tuple[str, ...] = ("golden", "protocol")
Outcome = Literal["pass", "fail", "n/a"]
NOT_APPLICABLE: Outcome = "n/a"

# The sections cases name: the Open Inference Protocol's own sections (its REST and gRPC documents share them),
# and the extensions, by the name a server lists them under.
SECTIONS: dict[str, str] = {
    "health": "OIP: Health (Server Live, Server Ready, Model Ready)",
    "server-metadata": "OIP: Server Metadata",
    "model-metadata": "OIP: Model Metadata",
    "inference": "OIP: Inference (request and response objects, ModelInfer)",
    "request-input": "OIP: Request Input",
    "request-output": "OIP: Request Output",
    "tensor-data": "OIP: Tensor Data and Tensor Data Types",
    "errors": "OIP: JSON Error Objects (REST status and body, gRPC status)",
    "model_repository": "extension: model_repository",
    "model_configuration": "extension: model_configuration",
    "statistics": "extension: statistics",
    "binary_tensor_data": "extension: binary_tensor_data",
    "classification": "extension: classification",
    "parameters": "extension: parameters",
    "system_shared_memory": "extension: system_shared_memory",
    "cuda_shared_memory": "extension: cuda_shared_memory",
    "generate": "Triton's generate extension",
}

# The spec's choices where the upstream documents disagree (spec/README.md, "Choices where the sources
# disagree"), by number, as a case that depends on one names it.
CHOICES: dict[int, str] = {
    4: "health answers carry JSON bodies; not ready is 503; model ready of an unknown model is 404 / NOT_FOUND",
    5: "the server-ready key is `ready`",
    6: "server metadata is GET /v2, without a trailing slash",
    7: "BF16 is a datatype",
    8: "FP16 and BF16 travel raw only, never as JSON `data` (400)",
    11: "the repository index body is optional; the answer is a bare array",
    12: "`binary_data_output` follows Triton's code",
    14: "errors are {\"error\": \"<message>\"} with a status by kind: 400 invalid request, 404 unknown model or "
        "version, 405 wrong method (the OIP documents say only \"typically 400\")",
    15: "versions are opaque strings; a version the model does not have is 404 / NOT_FOUND",
    19: "required fields; JSON `null` is no value",
    20: "parameters are scalars only",
    21: "the response `id` is the request's, and absent when the request had none",
}


@dataclass(frozen=True)
class Rpc:
    """An RPC of the service: its request and response message types, and whether it streams."""

    name: str
    request: type[Message]
    response: type[Message]
    streaming: bool


@dataclass(frozen=True)
class Route:
    """A REST operation of the spec: method, path template, the RPC (or REST-only operation) it is the form of,
    and the extension that owns it (None: core protocol)."""

    method: str
    path: str
    rpc: str
    extension: str | None


@dataclass(frozen=True)
class Result:
    """The outcome of one case over one transport (for a per-model case, for one model).

    `detail` says what differed (FAIL) or why the case does not apply (NOT APPLICABLE); `expected` and `got` are
    the two sides of a failure; `response` is what the server answered (for --verbose and the matrix's evidence).
    """

    case: str
    transport: str
    outcome: Outcome
    detail: str = ""
    response: str = ""
    section: str = ""
    layer: str = "golden"
    model: str = ""
    expected: str = ""
    got: str = ""
    choice: int | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    @property
    def not_applicable(self) -> bool:
        return self.outcome == NOT_APPLICABLE

    @property
    def name(self) -> str:
        """The case, with the model it ran on: `infer.id[simple]`."""
        return f"{self.case}[{self.model}]" if self.model else self.case

    def line(self) -> str:
        text = f"{self.outcome.upper():4} {self.transport:4} {self.name}"
        return f"{text}: {self.detail}" if self.detail and not self.passed else text

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case, "layer": self.layer, "section": self.section, "model": self.model,
            "transport": self.transport, "outcome": self.outcome, "detail": self.detail, "expected": self.expected,
            "got": self.got, "choice": self.choice, "response": self.response,
        }


# ---------------------------------------------------------------------------------------------------------------
# Comparison


def show(value: Any, limit: int = 80) -> str:
    """A value as short JSON text (bytes as their repr), cut at `limit` characters."""
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
        return [f"{_where(path)}: expected {kind} {show(expected)}, got {_kind(actual)} {show(actual)}"]
    if kind == "object":
        problems: list[str] = []
        for key in expected:
            if key not in actual:
                problems.append(f"{_where(path)}: missing key {key!r} (expected {show(expected[key])})")
            else:
                problems += compare_json(expected[key], actual[key], f"{path}.{key}" if path else str(key))
        for key in actual:
            if key not in expected:
                problems.append(f"{_where(path)}: unexpected key {key!r} = {show(actual[key])}")
        return problems
    if kind == "array":
        if len(expected) != len(actual):
            return [
                f"{_where(path)}: expected {len(expected)} items {show(expected)}, got {len(actual)} {show(actual)}"
            ]
        problems = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            problems += compare_json(e, a, f"{path}[{i}]")
        return problems
    if expected != actual:
        return [f"{_where(path)}: expected {show(expected)}, got {show(actual)}"]
    return []


def compare_keys(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = [f"missing key {key!r}" for key in expected if key not in actual]
    return problems + [f"unexpected key {key!r}" for key in actual if key not in expected]


def print_message(message: Message, defaults: bool = False) -> dict[str, Any]:
    """A protobuf message as JSON data, with the proto's field names (and its fields at their defaults)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=defaults
    )


# ---------------------------------------------------------------------------------------------------------------
# Talking to the server


@dataclass
class Answer:
    """What the server answered: REST status, headers and body, or gRPC code, details and message. `status` is
    0 (REST) or "" (gRPC) when the call itself failed (`error` says how: refused, timed out)."""

    status: int | str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    message: Message | None = None
    details: str = ""
    error: str = ""

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON."""
        return json.loads(self.body)

    def error_body(self) -> bool:
        """Whether the body is an Error object: `{"error": "<message>"}` and nothing else."""
        try:
            body = self.json()
        except ValueError:
            return False
        return isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)

    def text(self, limit: int = 300) -> str:
        """The answer in one line, for a report: `404 {"error": ...}`, `NOT_FOUND: details`, `OK {...}`."""
        if self.error:
            text = self.error
        elif isinstance(self.status, int):
            body = self.body.decode("utf-8", "replace")
            header = self.headers.get("inference-header-content-length", "")
            if header.isdigit() and 0 < int(header) <= len(self.body):  # JSON, then binary tensor data
                cut = int(header)
                body = self.body[:cut].decode("utf-8", "replace") + f" (+{len(self.body) - cut} bytes of binary data)"
            body = "".join(c if c.isprintable() or c.isspace() else f"\\x{ord(c):02x}" for c in body)
            kind = self.headers.get("content-type", "")
            text = f"{self.status} {body}" if body else f"{self.status} (empty body)"
            if body and kind and not kind.startswith("application/json"):
                text = f"{self.status} [{kind}] {body}"
        elif self.status == "OK" and self.message is not None:
            text = f"OK {json.dumps(print_message(self.message))}"
        else:
            text = f"{self.status}: {self.details}"
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


class Target:
    """The server under test: a REST client at `url` and a gRPC stub at `grpc` (either may be None: that
    transport is not tested), with the spec's RPCs and REST routes."""

    def __init__(
        self, url: str | None, grpc: str | None, stub: Any, rpcs: Mapping[str, Rpc], routes: Mapping[str, Route],
        timeout: float,
    ) -> None:
        self.url = url
        self.address = grpc
        self.rpcs = rpcs
        self.routes = routes
        self.timeout = timeout
        self.http = httpx.Client(base_url=url, timeout=timeout, trust_env=False) if url else None
        self.channel = None
        self.stub = None
        if grpc:
            self.channel = _grpc.insecure_channel(
                grpc, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            )
            self.stub = stub(self.channel)

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.channel is not None:
            self.channel.close()

    def has(self, transport: str) -> bool:
        return (self.http if transport == "rest" else self.stub) is not None

    def request(
        self, method: str, path: str, *, body: Any = None, content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """A REST call: `body` is sent as JSON, `content` as it is."""
        assert self.http is not None
        sent = dict(headers or {})
        if body is not None:
            content = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        try:
            answer = self.http.request(method, path, content=content, headers=sent)
        except httpx.HTTPError as exc:
            return Answer(0, error=f"{method} {path} failed: {exc!r}")
        return Answer(answer.status_code, answer.content, answer.headers)

    def call(self, rpc: str, request: Message | Mapping[str, Any]) -> Answer:
        """A unary gRPC call; `request` may be given as JSON data of the request message."""
        assert self.stub is not None
        if not isinstance(request, Message):
            request = json_format.ParseDict(dict(request), self.rpcs[rpc].request())
        method = cast(Any, getattr(self.stub, rpc))
        try:
            message = method(request, timeout=self.timeout)
        except _grpc.RpcError as exc:
            call = cast(_grpc.Call, exc)
            return Answer(call.code().name, details=call.details() or "")
        return Answer("OK", message=message)
