"""The lean way of a REST JSON inference request (`JsonInfer`): from the parsed body straight to the model and to
the answer's bytes, as `grpc.in_thread.UnaryInfer` is for gRPC.

The general way decodes the body into the data plane's request (`infer_codec.decode_infer_request`: a `Tensor` per
input, every field checked), the data plane reads that against the model (`core.lean.Lean.take`), and its response
(`InferResponse`) is encoded back (`encode_infer_response`). For the common request this reads the body once,
against the model's plan (`core.lean.Plan`), and writes the answer from the model's arrays. The common request
here: a JSON body (no binary part) of `inputs` and, if any, `id` and `outputs`, nothing else; each input exactly
its `name`, `datatype`, `shape` and `data`, every declared input once with its declared datatype and a shape that
fits (`InputPlan.count`: the limit too), its data decoded by the codec as on every way (`codec.from_json`); each
output asked for by its `name` alone. The model runs as the data plane's lean way runs it, inside the one
construct of every inference's accounting (`Lean.inference`, `Lean.run_on_loop`). Outputs that are arrays of their
declared datatype and shape are written as the general encoder writes JSON data (`infer_codec.json_output`);
anything else the model returned goes through the pipeline's `finish` and the general encoder, which convert or
refuse it as always.

Anything else (request or tensor parameters, binary data, shared memory, another key, a null, a value of the wrong
type, data that does not decode, an unknown model) returns None before anything happened: the general way answers
it, or refuses it with its usual error.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from starlette.responses import Response

from ... import codec
from ..core.pipeline import Pipeline
from .infer_codec import answer_body, encode_infer_response, json_answer, json_output

__all__ = ["JsonInfer"]

_INPUT_KEYS: Final = 4  # name, datatype, shape, data: an input with exactly these (checked one by one)


class JsonInfer:
    """The lean way of a REST JSON inference request over `pipeline`'s lean way (see the module's description)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.lean = pipeline.lean

    async def __call__(self, fields: Mapping[str, str], doc: Any, trace: dict[str, str] | None) -> Response | None:
        """The answer to the parsed body `doc` for the model the path's `fields` name; None when the request is
        not the common one (nothing happened: the general way's). An error of the model is raised as the data
        plane's error, after it was counted."""
        start = time.perf_counter_ns()
        if type(doc) is not dict:
            return None
        items = doc.get("inputs")
        request_id = doc.get("id", "")
        requested = doc.get("outputs", ())
        if (type(items) is not list or type(request_id) is not str or type(requested) not in (list, tuple)
                or len(doc) != 1 + ("id" in doc) + ("outputs" in doc)):
            return None
        lean = self.lean
        plan = lean.plan(fields.get("model_name", ""), fields.get("model_version", ""))
        if plan is None or len(items) != len(plan.names):
            return None
        declared = plan.inputs
        given: list[Any] = [None] * len(items)
        limit = lean.limit
        for item in items:
            if type(item) is not dict or len(item) != _INPUT_KEYS:
                return None
            name, datatype, shape, data = item.get("name"), item.get("datatype"), item.get("shape"), item.get("data")
            spec = declared.get(name) if type(name) is str else None
            if (spec is None or given[spec.index] is not None or datatype != spec.datatype or type(shape) is not list
                    or data is None or spec.count(shape, limit) is None):
                return None
            try:
                array = codec.from_json(data, spec.datatype, shape, name=spec.name)
            except codec.CodecError:
                return None
            if array.dtype != spec.dtype or array.shape != tuple(shape):
                return None
            given[spec.index] = array
        names: list[str] = []
        for output in requested:
            name = output.get("name") if type(output) is dict and len(output) == 1 else None
            if type(name) is not str:
                return None
            names.append(name)
        wanted = plan.outputs_wanted(names)
        if wanted is None:
            return None
        arrays = dict(zip(plan.names, given, strict=True))
        batch_size = plan.batch_size(arrays)
        if batch_size is None:
            return None
        with lean.inference(plan, request_id, trace, "rest", start) as run:
            result = await lean.run_on_loop(run, plan, arrays, {}, batch_size)
            outputs = plan.answer(result, wanted, batch_size)
            if outputs is None:  # converted or refused as the general way does
                response = lean.finish(plan, request_id, arrays, wanted, result, batch_size)
        if outputs is None:
            return encode_infer_response(response, {}, False)
        model = plan.model
        return json_answer(answer_body(model.name, model.version, request_id, None, [
            json_output(spec.name, spec.datatype, list(array.shape), array)
            for spec, array in zip(wanted, outputs, strict=True)]))
