"""The protocol layer's inference checks, per model (registered into `conformance_protocol.CHECKS` after those of
`conformance_checks`): a request derived from the model's metadata is answered with outputs of the declared names,
datatypes and shapes, over every form the server has (REST JSON, REST binary tensor data when listed, gRPC), and
they all agree; `id`, requested outputs, versions and parameters are honoured; a request broken in one place is
refused; the statistics extension counts what was sent; the classification extension classifies.
"""

from __future__ import annotations

import re
import time
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from . import datatypes, framing
from .conformance_checks import (
    answered,
    code_problems,
    derived_request,
    grpc_json,
    json_body,
    refused,
    send,
    status_problems,
)
from .conformance_protocol import Context, Model, NotApplicable, Verdict, check
from .conformance_results import Answer, show

__all__: list[str] = []

ID = "conformance-7"
UNKNOWN_TENSOR = "CONFORMANCE_UNKNOWN"


def _valid(ctx: Context, transport: str, model: Model | None, **changes: Any) -> Verdict:
    """Send the derived request (with `changes`) and check the answer's outputs."""
    model, request = derived_request(model)
    binary = changes.pop("binary", False)
    version = changes.pop("version", "")
    request = request.but(**changes)
    answer, decoded = send(ctx, transport, model, request, binary=binary, version=version)
    names = list(request.outputs) or [o.name for o in model.outputs]
    expected = f"{'200' if transport == 'rest' else 'OK'} with outputs {', '.join(names)} of the declared " \
               "datatypes and shapes"
    return Verdict(expected, answer, answered(model, transport, answer, decoded, request.outputs))


@check("infer.valid", "inference", "OIP, Inference: a request of the model's declared inputs is answered with a 200 "
       "(gRPC OK) and the Inference Response JSON Object; without requested outputs, \"all outputs produced by the "
       "model will be returned\", each with the datatype and shape its metadata declares", per_model=True)
def _infer_valid(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _valid(ctx, transport, model)


@check("infer.binary", "binary_tensor_data", "Triton's binary tensor data extension (listed as `binary_tensor_data`): "
       "inputs sent as raw bytes after the JSON (binary_data_size) and outputs asked for with binary_data come back "
       "as raw bytes after the JSON header, whose length Inference-Header-Content-Length gives",
       transports=("rest",), per_model=True, extension="binary_tensor_data")
def _infer_binary(ctx: Context, transport: str, model: Model | None) -> Verdict:
    verdict = _valid(ctx, transport, model, binary=True)
    answer = verdict.answer
    if not verdict.problems and answer is not None and framing.HEADER_LENGTH.lower() not in {
            k.lower() for k in answer.headers}:
        verdict.problems.append(f"binary outputs were asked for, but the answer has no {framing.HEADER_LENGTH}")
    return verdict


def _same(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        return [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    return bool(np.array_equal(a.astype(np.float64) if a.dtype.kind == "V" else a,
                               b.astype(np.float64) if b.dtype.kind == "V" else b))


@check("infer.transports_agree", "tensor-data", "OIP, Tensor Data: the same tensor is the same data however it "
       "travels; JSON `data`, binary tensor data and gRPC raw contents of one request give the same outputs",
       transports=("all",), per_model=True)
def _agree(ctx: Context, transport: str, model: Model | None) -> Verdict:
    model, request = derived_request(model)
    forms: list[tuple[str, str, bool]] = []
    if ctx.target.http is not None:
        forms.append(("REST JSON", "rest", False))
        if ctx.listed("binary_tensor_data"):
            forms.append(("REST binary", "rest", True))
    if ctx.target.stub is not None:
        forms.append(("gRPC", "grpc", False))
    answers: list[tuple[str, dict[str, npt.NDArray[Any]], Answer]] = []
    for label, via, binary in forms:
        try:
            answer, decoded = send(ctx, via, model, request, binary=binary)
        except NotApplicable:
            continue
        if decoded is not None and not decoded.problems:
            answers.append((label, decoded.arrays(), answer))
    if len(answers) < 2:
        raise NotApplicable("fewer than two forms of the request were answered (see infer.valid)")
    verdict = Verdict(f"the same outputs from {', '.join(label for label, *_ in answers)}", answers[0][2])
    first_label, first, _ = answers[0]
    for label, arrays, answer in answers[1:]:
        for name in sorted(set(first) | set(arrays)):
            if name not in first or name not in arrays or not _same(first[name], arrays[name]):
                verdict.problems.append(f"output '{name}' differs between {first_label} and {label}")
                verdict.answer = answer
    return verdict


def _id_check(ctx: Context, transport: str, model: Model | None, sent: str | None) -> Verdict:
    model, request = derived_request(model)
    answer, decoded = send(ctx, transport, model, request.but(id=sent))
    problems = answered(model, transport, answer, decoded)
    expected = f"the response id {sent!r}" if sent is not None else "no response id"
    if decoded is not None and decoded.id != sent:
        problems.append(f"the response id is {decoded.id!r}, expected " + (repr(sent) if sent else "none"))
    return Verdict(expected, answer, problems)


@check("infer.id", "inference", 'OIP, Inference Request JSON Object: "id": "Optional, but if specified this identifier '
       'must be returned in the response"', per_model=True)
def _infer_id(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _id_check(ctx, transport, model, ID)


@check("infer.no_id", "inference", 'OIP, Inference Response JSON Object: "id": "The id identifier given in the '
       'request, if any"; spec/README.md, choice 21: "The response id is the request\'s id when it had one and '
       'absent otherwise (OIP, Triton); MLServer makes up a UUID"', per_model=True, choice=21)
def _infer_no_id(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _id_check(ctx, transport, model, None)


@check("infer.requested_output", "request-output", 'OIP, Inference Request JSON Object: "outputs": "The output '
       'tensors requested for this inference": asking for one output answers that output only', per_model=True)
def _requested_output(ctx: Context, transport: str, model: Model | None) -> Verdict:
    model, _ = derived_request(model)
    if not model.outputs:
        raise NotApplicable("its metadata declares no outputs")
    return _valid(ctx, transport, model, outputs=(model.outputs[-1].name,))


@check("infer.versioned", "inference", "OIP, Inference: POST v2/models/${MODEL_NAME}[/versions/${MODEL_VERSION}]/"
       "infer; a version the model metadata lists may be requested explicitly, and model_version says which ran",
       per_model=True)
def _versioned(ctx: Context, transport: str, model: Model | None) -> Verdict:
    model, _ = derived_request(model)
    if not model.versions:
        raise NotApplicable("its metadata lists no versions")
    version = model.versions[0]
    verdict = _valid(ctx, transport, model, version=version)
    body = json_body(verdict.answer) if transport == "rest" and verdict.answer is not None else None
    ran = body.get("model_version") if isinstance(body, dict) else getattr(
        verdict.answer.message if verdict.answer is not None else None, "model_version", None)
    if not verdict.problems and ran not in (None, "", version):
        verdict.problems.append(f"model_version is {ran!r}, expected {version!r}")
    return verdict


@check("infer.parameters", "inference", 'OIP, Parameters: a request may carry "parameters", "zero or more '
       '"name"/"value" pairs" whose values are strings, numbers or booleans', per_model=True)
def _parameters(ctx: Context, transport: str, model: Model | None) -> Verdict:
    return _valid(ctx, transport, model, parameters={"conformance_flag": True, "conformance_note": "seven"})


def _refusal(ctx: Context, transport: str, model: Model | None, *, change: str) -> Verdict:
    model, request = derived_request(model)
    if change == "datatype":
        declared = request.inputs[0].datatype
        request = request.retyped("INT64" if declared == "INT32" else "INT32")
    elif change == "shape":
        request = request.reshaped()
    elif change == "missing":
        request = request.but(inputs=request.inputs[:-1])
    elif change == "unknown_input":
        request = request.with_unknown_input(UNKNOWN_TENSOR)
    else:
        request = request.but(outputs=(UNKNOWN_TENSOR,))
    answer, _ = send(ctx, transport, model, request)
    return refused(answer, transport, 400, "INVALID_ARGUMENT")


_REFUSALS = {
    "wrong_datatype": ("datatype", "request-input", "a first input of another datatype than its metadata declares"),
    "wrong_shape": ("shape", "request-input", "a first input of another rank than its metadata declares"),
    "missing_input": ("missing", "request-input", "a request without one of the declared inputs"),
    "unknown_input": ("unknown_input", "request-input", "an input the model does not declare"),
    "unknown_output": ("unknown_output", "request-output", "a requested output the model does not declare"),
}
for _name, (_change, _section, _what) in _REFUSALS.items():
    check(f"infer.{_name}", _section, f"Model metadata declares the inputs and outputs, their datatypes and shapes; "
          f"{_what} is an invalid request: spec/README.md, choice 14: \"400 for a malformed or invalid request "
          "(... wrong datatype or shape ...)\" (gRPC INVALID_ARGUMENT), with {\"error\": \"<message>\"}",
          per_model=True, choice=14)(
        partial(_refusal, change=_change))


_CLASS = re.compile(r"^[^:]+:\d+(:.*)?$")


@check("infer.classification", "classification", "Triton's classification extension (listed as `classification`): "
       'the requested-output parameter "classification": N answers the output as BYTES "<value>:<index>" '
       '(":<label>" appended) strings', per_model=True, extension="classification")
def _classification(ctx: Context, transport: str, model: Model | None) -> Verdict:
    model, request = derived_request(model)
    numeric = [o for o in model.outputs if datatypes.BY_NAME[o.datatype].json and o.datatype not in ("BOOL", "BYTES")]
    if not numeric:
        raise NotApplicable("it has no numeric output to classify")
    name = numeric[0].name
    answer, decoded = send(ctx, transport, model, request.but(outputs=(name,), output_parameters={
        "classification": 1}))
    ok = status_problems(answer, 200) if transport == "rest" else code_problems(answer, "OK")
    verdict = Verdict(f"output {name} as BYTES \"<value>:<index>\" strings", answer, ok)
    if ok or decoded is None:
        return verdict
    verdict.problems += decoded.problems
    for got, datatype, _, array in decoded.outputs:
        if datatype != "BYTES":
            verdict.problems.append(f"output '{got}' has datatype {datatype}, expected BYTES")
        elif array is not None:
            bad = [bytes(x) for x in array.reshape(-1) if not _CLASS.match(bytes(x).decode("utf-8", "replace"))]
            if bad or not array.size:
                verdict.problems.append(f"output '{got}' holds {show([b.decode('utf-8', 'replace') for b in bad])}")
    return verdict


def _successes(ctx: Context, transport: str, model: Model) -> tuple[int | None, Answer]:
    if transport == "rest":
        answer = ctx.rest("model_statistics", model.name)
        data = json_body(answer) if answer.status == 200 else None
    else:
        answer = ctx.target.call("ModelStatistics", {"name": model.name})
        data = grpc_json(answer)
    entries = data.get("model_stats") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None, answer
    total = 0
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == model.name:
            success = (entry.get("inference_stats") or {}).get("success") or {}
            total += int(success.get("count", 0))
    return total, answer


def _settled(ctx: Context, transport: str, model: Model, want: int | None = None,
             wait: float = 1.0) -> tuple[int | None, Answer]:
    """The success count once it is `want` (or, without `want`, once two reads 50 ms apart agree), read for at most
    `wait` seconds: a server may count a request only after it has answered it (Triton does)."""
    deadline = time.monotonic() + wait
    count, answer = _successes(ctx, transport, model)
    while count is not None and count != want and time.monotonic() < deadline:
        time.sleep(0.05)
        again, answer = _successes(ctx, transport, model)
        if want is None and again == count:
            break
        count = again
    return count, answer


@check("infer.statistics", "statistics", "Triton's statistics extension (listed as `statistics`): a model's "
       "inference_stats.success.count is the number of its successful inference requests, so it grows by exactly "
       "the number answered", per_model=True, extension="statistics")
def _statistics_count(ctx: Context, transport: str, model: Model | None) -> Verdict:
    model, request = derived_request(model)
    sent = 2
    before, answer = _settled(ctx, transport, model)
    verdict = Verdict(f"success.count {sent} higher after {sent} answered requests", answer)
    if before is None:
        verdict.problems.append("the model's statistics could not be read")
        return verdict
    answered_ok = 0
    for _ in range(sent):
        _, decoded = send(ctx, transport, model, request)
        answered_ok += decoded is not None
    after, answer = _settled(ctx, transport, model, before + answered_ok)
    verdict.answer = answer
    if answered_ok != sent:
        verdict.problems.append(f"only {answered_ok} of {sent} valid requests were answered (see infer.valid)")
    if after is None or after - before != answered_ok:
        verdict.problems.append(f"success.count went from {before} to {after} after {answered_ok} answered requests")
    return verdict
