"""The protocol layer: cases that need no particular model, derived from what the server itself reports.

First the server is asked who it is: its metadata (the extensions it lists) and its models (those named with
`--model`; else the ready entries of its repository index when it lists `model_repository`; else whichever of the
example models it serves), each with its metadata (and its configuration, when it lists `model_configuration`,
to tell a decoupled model). Then every check of `CHECKS` runs: the server-wide ones once, the per-model ones for
each model, over REST and gRPC where the case has both forms. A check that needs an extension is NOT APPLICABLE
when the server does not list it; a per-model inference check is NOT APPLICABLE for a model whose metadata gives
nothing to derive a request from, or that is decoupled. The checks themselves live in `conformance_checks`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from . import datatypes
from .conformance_golden import listed_extensions, served_models
from .conformance_results import NOT_APPLICABLE, TRANSPORTS, Answer, Result, Target, print_message
from .conformance_tensors import TensorMeta

__all__ = ["CHECKS", "Check", "Context", "Model", "NotApplicable", "Verdict", "check", "discover", "run_protocol"]


class NotApplicable(Exception):
    """Raised by a check that does not apply; the message says why."""


@dataclass
class Verdict:
    """What a check found: what it expected, what the server answered, and every difference (none: PASS)."""

    expected: str
    answer: Answer | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Model:
    """A model the server serves, as its metadata describes it. `problem`: why no inference request can be derived
    from it (empty: one can)."""

    name: str
    versions: list[str] = field(default_factory=list)
    inputs: list[TensorMeta] = field(default_factory=list)
    outputs: list[TensorMeta] = field(default_factory=list)
    decoupled: bool = False
    problem: str = ""
    metadata: Any = None  # the REST metadata answer, as JSON, for the gRPC check to compare with


@dataclass
class Context:
    """The server under test and what it reported about itself."""

    target: Target
    extensions: list[str] | None = None  # None: server metadata could not be read
    models: list[Model] = field(default_factory=list)
    models_from: str = ""  # where the models came from, for NOT APPLICABLE reasons

    def listed(self, extension: str) -> bool:
        return self.extensions is not None and extension in self.extensions

    def path(self, operation: str, model: str = "", version: str = "") -> str:
        """The REST path of one of the spec's operations, its parameters filled."""
        route = self.target.routes.get(operation)
        if route is None:
            raise NotApplicable(f"the spec has no REST operation {operation}")
        return route.path.format(model_name=quote(model, safe=""), model_version=quote(version, safe=""))

    def rest(self, operation: str, model: str = "", version: str = "", **kwargs: Any) -> Answer:
        route = self.target.routes.get(operation)
        if route is None:
            raise NotApplicable(f"the spec has no REST operation {operation}")
        return self.target.request(route.method, self.path(operation, model, version), **kwargs)

    def first_model(self) -> Model:
        if not self.models:
            raise NotApplicable(f"the server serves no model to check with ({self.models_from})")
        return self.models[0]


CheckFn = Callable[[Context, str, Model | None], Verdict]


@dataclass(frozen=True)
class Check:
    """A protocol case: its id, the section it checks, the spec's words for the rule (`rule`), its forms, whether
    it runs once per model, the extension the server must list for it to apply, and the spec/README.md choice it
    depends on, if any."""

    id: str
    section: str
    rule: str
    run: CheckFn
    transports: tuple[str, ...] = TRANSPORTS
    per_model: bool = False
    extension: str | None = None
    choice: int | None = None


CHECKS: dict[str, Check] = {}


def check(
    id: str, section: str, rule: str, *, transports: tuple[str, ...] = TRANSPORTS, per_model: bool = False,
    extension: str | None = None, choice: int | None = None,
) -> Callable[[CheckFn], CheckFn]:
    """Register a check function under `id` (in the order of registration: the report's order)."""

    def register(fn: CheckFn) -> CheckFn:
        CHECKS[id] = Check(id, section, rule, fn, transports, per_model, extension, choice)
        return fn

    return register


# ---------------------------------------------------------------------------------------------------------------
# What the server reports about itself


def _tensors(value: Any, where: str) -> list[TensorMeta]:
    if not isinstance(value, list):
        raise ValueError(f"{where} is not an array")
    tensors = []
    for item in value:
        if not isinstance(item, dict):
            raise ValueError(f"{where}: an entry is not an object")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: an entry has no name")
        if not isinstance(datatype, str) or datatypes.get(datatype) is None:
            raise ValueError(f"{where}: '{name}' has datatype {datatype!r}, not one of the spec's")
        if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < -1 for d in shape):
            raise ValueError(f"{where}: '{name}' has shape {shape!r}, not a list of integers >= -1")
        tensors.append(TensorMeta(name, str(datatype), tuple(shape)))
    return tensors


def _model(ctx: Context, name: str) -> Model:
    model = Model(name)
    target = ctx.target
    try:
        if target.http is not None:
            answer = ctx.rest("model_metadata", name)
            data = answer.json() if answer.status == 200 else None
        else:
            answer = target.call("ModelMetadata", {"name": name})
            data = _metadata_json(answer)
            for tensor in (data or {}).get("inputs", []) + (data or {}).get("outputs", []):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]  # int64s print as strings
        if not isinstance(data, dict):
            model.problem = f"its metadata could not be read ({answer.text(120)})"
            return model
        model.metadata = data
        model.versions = [v for v in data.get("versions") or [] if isinstance(v, str)]
        model.inputs = _tensors(data.get("inputs"), "metadata inputs")
        model.outputs = _tensors(data.get("outputs"), "metadata outputs")
    except (ValueError, NotApplicable) as exc:
        model.problem = f"its metadata gives no request to send: {exc}"
        return model
    if not model.inputs:
        model.problem = "its metadata declares no inputs, so no request can be derived"
    if ctx.listed("model_configuration"):
        model.decoupled = _decoupled(ctx, name)
    if model.decoupled:
        model.problem = "it is decoupled (its model configuration says so): ModelInfer does not answer it"
    return model


def _metadata_json(answer: Answer) -> Any:
    if answer.status != "OK" or answer.message is None:
        return None
    return print_message(answer.message, defaults=True)


def _decoupled(ctx: Context, name: str) -> bool:
    config: Any = None
    if ctx.target.http is not None:
        answer = ctx.rest("model_config", name)
        try:
            config = answer.json() if answer.status == 200 else None
        except ValueError:
            config = None
    elif ctx.target.stub is not None:
        answer = ctx.target.call("ModelConfig", {"name": name})
        config = (_metadata_json(answer) or {}).get("config")
    policy = config.get("model_transaction_policy") if isinstance(config, dict) else None
    return isinstance(policy, dict) and policy.get("decoupled") is True


def _index(ctx: Context) -> list[str]:
    """The ready models of the repository index."""
    target = ctx.target
    if target.http is not None:
        answer = ctx.rest("repository_index", body={})
        entries = answer.json() if answer.status == 200 else []
    else:
        entries = (_metadata_json(target.call("RepositoryIndex", {})) or {}).get("models", [])
    if not isinstance(entries, list):
        return []
    names = {e.get("name") for e in entries if isinstance(e, dict) and e.get("state") == "READY"}
    return sorted(n for n in names if isinstance(n, str) and n)


def discover(target: Target, models: Sequence[str] | None, examples: Iterable[str]) -> Context:
    """Ask the server for its metadata and its models (see the module's docstring)."""
    ctx = Context(target, listed_extensions(target))
    if models:
        names, ctx.models_from = list(models), "the models named with --model"
    elif ctx.listed("model_repository"):
        try:
            names, ctx.models_from = _index(ctx), "the ready models of its repository index"
        except (ValueError, NotApplicable):
            names, ctx.models_from = [], "its repository index could not be read"
    else:
        served = served_models(target, examples)
        names = [name for name, ok in served.items() if ok]
        ctx.models_from = "the example models it serves (it lists no model_repository; name others with --model)"
    ctx.models = [_model(ctx, name) for name in names]
    return ctx


# ---------------------------------------------------------------------------------------------------------------
# Running


def _result(check: Check, transport: str, model: Model | None, ctx: Context) -> Result:
    base: dict[str, Any] = {"section": check.section, "layer": "protocol", "model": model.name if model else "",
                            "choice": check.choice}
    if transport != "all" and not ctx.target.has(transport):
        flag = "--url" if transport == "rest" else "--grpc"
        return Result(check.id, transport, NOT_APPLICABLE, f"no {transport} address given ({flag})", **base)
    if check.extension and not ctx.listed(check.extension):
        why = f"the server does not list the {check.extension} extension"
        return Result(check.id, transport, NOT_APPLICABLE, why, **base)
    try:
        verdict = check.run(ctx, transport, model)
    except NotApplicable as exc:
        return Result(check.id, transport, NOT_APPLICABLE, str(exc), **base)
    except Exception as exc:  # an answer of a shape no check foresaw: that case fails, the run goes on
        return Result(check.id, transport, "fail", f"the answer could not be read: {exc!r}", **base)
    shown = verdict.answer.text(2000) if verdict.answer is not None else ""
    if not verdict.problems:
        return Result(check.id, transport, "pass", response=shown, expected=verdict.expected, **base)
    detail = "; ".join(verdict.problems[:4]) + (f"; and {len(verdict.problems) - 4} more"
                                                 if len(verdict.problems) > 4 else "")
    got = verdict.answer.text() if verdict.answer is not None else detail
    return Result(check.id, transport, "fail", detail, shown, expected=verdict.expected, got=got, **base)


def select(only: Iterable[str] | None) -> list[Check]:
    """The checks whose id matches one of `only` (names or shell patterns), or every check."""
    patterns = list(only or ())
    return [c for c in CHECKS.values() if not patterns or any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def run_protocol(
    target: Target, checks: Sequence[Check], models: Sequence[str] | None, examples: Iterable[str],
    transports: Sequence[str] = TRANSPORTS,
) -> list[Result]:
    """Run `checks` against the server: the server-wide ones, then the per-model ones model by model."""
    if not checks:
        return []
    ctx = discover(target, models, examples)
    results: list[Result] = []

    def run(check: Check, model: Model | None) -> None:
        for transport in check.transports:
            if transport in transports or transport == "all":
                results.append(_result(check, transport, model, ctx))

    for item in checks:
        if not item.per_model:
            run(item, None)
    for model in ctx.models:
        for item in checks:
            if item.per_model:
                run(item, model)
    if not ctx.models and any(c.per_model for c in checks):
        results.append(Result("models", "all", NOT_APPLICABLE, f"no model to check: {ctx.models_from}",
                              section="model-metadata", layer="protocol"))
    return results
