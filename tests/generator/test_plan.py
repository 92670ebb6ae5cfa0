"""The plan decides, the templates print: per operation and per REST form, what the templates need is worked out
once in `oipgen/plan.py`, and the rendered server and client follow the plan, not the spec behind it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import SPEC

from oipgen import plan as plan_module
from oipgen.build import BuildOptions, build_tree
from oipgen.load import load_spec
from oipgen.plan import OperationPlan, Plan


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_module.make_plan(load_spec(SPEC))


def test_each_rest_form_is_planned(plan: Plan) -> None:
    stats = plan.operation("model_statistics")
    assert [ep.path for ep in stats.endpoints] == [
        "/v2/models/stats", "/v2/models/{model_name}/stats", "/v2/models/{model_name}/versions/{model_version}/stats"]
    assert all(ep.print_defaults for ep in stats.endpoints) and stats.print_defaults  # x-oip-print-defaults
    assert stats.widest is stats.endpoints[-1]
    # No form has a variable every form has: both arguments are optional, and pick the form.
    assert [(p.name, p.field, p.arg, p.required) for p in stats.widest.params] == [
        ("model_name", "name", "model", False), ("model_version", "version", "version", False)]
    ready = plan.operation("model_ready")
    assert [(p.arg, p.required) for p in ready.widest.params] == [("model", True), ("version", False)]
    assert ready.rest_only == ("name",) and all(ep.rest_only == ("name",) for ep in ready.endpoints)
    assert not any(ep.print_defaults for ep in ready.endpoints)
    live = plan.operation("server_live")
    assert live.widest is not None and live.widest.params == () and live.rest_only == ()
    assert [(op.name, op.widest.path, op.events) for op in plan.rest_operations] == [
        ("Generate", "/v2/models/{model_name}/versions/{model_version}/generate", False),
        ("GenerateStream", "/v2/models/{model_name}/versions/{model_version}/generate_stream", True)]
    assert plan.proto_modules == ("model_config", "grpc_service")


def _altered(op: OperationPlan) -> OperationPlan:
    """`op` with decisions the spec does not make: no form lists its defaults, no property is REST's only, and the
    model argument is called `target`."""
    endpoints = tuple(
        dataclasses.replace(
            ep, print_defaults=False, rest_only=(),
            params=tuple(dataclasses.replace(p, arg="target") if p.arg == "model" else p for p in ep.params),
        )
        for ep in op.endpoints
    )
    widest = endpoints[op.endpoints.index(op.widest)] if op.widest is not None else None
    return dataclasses.replace(op, endpoints=endpoints, widest=widest, print_defaults=False, rest_only=())


def test_the_templates_print_the_plans_decisions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Rendered from a plan whose decisions differ from what the spec says, the server's routes and the client's
    methods follow the plan: the templates do not work those facts out again from the spec."""
    made = plan_module.make_plan

    def make_plan(api: object) -> Plan:
        real = made(api)  # type: ignore[arg-type]
        wanted = {"model_statistics", "model_ready"}
        ops = tuple(_altered(op) if op.name in wanted else op for op in real.operations)
        return dataclasses.replace(real, operations=ops)

    options = BuildOptions(spec=SPEC, out=tmp_path, package="oip", targets=("server", "client"))
    normal = build_tree(options).files
    monkeypatch.setattr(plan_module, "make_plan", make_plan)
    altered = build_tree(options).files

    def endpoint(files: dict[str, bytes], path: str) -> str:
        text = files["server/rest/endpoints.py"].decode()
        start = text.index(f"path={path!r}")
        return text[start:text.index("),\n", text.index("print_defaults=", start))]

    stats, ready = "/v2/models/{model_name}/stats", "/v2/models/{model_name}/ready"
    assert "print_defaults=True" in endpoint(normal, stats) and "print_defaults=False" in endpoint(altered, stats)
    assert "rest_only=('name',)" in endpoint(normal, ready) and "rest_only=()" in endpoint(altered, ready)
    client, before = altered["client/rest.py"].decode(), normal["client/rest.py"].decode()
    assert "def model_ready(\n        self,\n        model: str," in before
    assert "def model_ready(\n        self,\n        target: str," in client
    assert '{q(target)}' in client and "'name': model" in before and "'name': target" not in client
