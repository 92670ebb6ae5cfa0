"""The lean way of a REST inference request (`LeanInfer`): from the parsed body straight to the model and to the
answer's bytes, as `grpc.in_thread.UnaryInfer` is for gRPC.

The general way decodes the body into the data plane's request (`infer_codec.decode_infer_request`: a `Tensor` per
input, every field checked), the data plane reads that against the model (`core.lean.Lean.take`), and its response
(`InferResponse`) is encoded back (`encode_infer_response`). For the common request this reads the body once,
against the model's plan (`core.lean.Plan`), and writes the answer from the model's arrays. The common request
here, in JSON or as a JSON header followed by binary data (tritonclient's and perf_analyzer's default): `inputs`
and, if any, `id`, `outputs` and `parameters`, nothing else. Each input is exactly its `name`, `datatype`, `shape`
and either `data` (decoded by `codec.from_json`) or `parameters` holding only its `binary_data_size` (its bytes,
in order, decoded by `codec.from_raw`), every declared input once with its declared datatype and a shape that fits
(`InputPlan.count`: the limit too), the binary part used up exactly; each output asked for by its `name` and, if
any, `parameters` holding only `binary_data`; the request's parameters as the general way reads them
(`infer_codec.request_parameters`: `binary_data_output`, then `Lean.parameters`). The model runs as the data plane's
lean way runs it, inside the one construct of every inference's accounting (`Lean.inference`, `Lean.run_on_loop`).
Outputs that are arrays of their declared datatype and shape are written as the general encoder writes them
(`infer_codec.json_output`, `infer_codec.binary_output`, `infer_codec.infer_answer`); anything else the model
returned goes through the pipeline's `finish` and the general encoder, which convert or refuse it as always.

Anything else (other tensor parameters such as shared memory, the whole body as one input's data, another key, a
null, a value of the wrong type, data that does not decode, binary data that does not add up, an unknown model)
returns None before anything happened: the general way answers it, or refuses it with its usual error.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from starlette.responses import Response

from ... import codec, framing
from ..core.pipeline import Pipeline
from ..errors import OipError
from ..settings import Settings
from .infer_codec import (
    answer_body,
    binary_enabled,
    binary_output,
    encode_infer_response,
    infer_answer,
    json_output,
    request_parameters,
)

__all__ = ["LeanInfer"]

_INPUT_KEYS: Final = 4  # name, datatype, shape, and data or parameters: an input with exactly these (checked below)
_BINARY_SIZE: Final = framing.BINARY_DATA_SIZE  # an input's bytes in the binary part
_BINARY_DATA: Final = framing.BINARY_DATA  # a listed output's parameter: answered as binary data


class LeanInfer:
    """The lean way of a REST inference request over `pipeline`'s lean way (see the module's description)."""

    def __init__(self, pipeline: Pipeline, settings: Settings) -> None:
        self.lean = pipeline.lean
        self.binary_on = binary_enabled(settings)

    async def __call__(self, fields: Mapping[str, str], doc: Any, binary: memoryview | None,
                       trace: dict[str, str] | None, parts: bool = False) -> Response | None:
        """The answer to the parsed body `doc` (and its binary part `binary`, if it has one) for the model the
        path's `fields` name; None when the request is not the common one (nothing happened: the general way's).
        An error of the model is raised as the data plane's error, after it was counted. `parts`: large binary
        outputs may be sent from the model's arrays (`infer_codec.infer_answer`)."""
        start = time.perf_counter_ns()
        if type(doc) is not dict:
            return None
        items = doc.get("inputs")
        request_id = doc.get("id", "")
        requested = doc.get("outputs", ())
        if (type(items) is not list or type(request_id) is not str or type(requested) not in (list, tuple)
                or len(doc) != 1 + ("id" in doc) + ("outputs" in doc) + ("parameters" in doc)):
            return None
        lean = self.lean
        parameters: dict[str, Any] = {}
        default_binary = False
        if "parameters" in doc:
            given = doc["parameters"]
            if type(given) is not dict:
                return None
            try:
                given, default_binary = request_parameters(given, self.binary_on)
            except OipError:
                return None
            seen = lean.parameters(given)
            if seen is None:
                return None
            parameters = seen
        plan = lean.plan(fields.get("model_name", ""), fields.get("model_version", ""))
        if plan is None or len(items) != len(plan.names):
            return None
        declared = plan.inputs
        given_arrays: list[Any] = [None] * len(items)
        limit = lean.limit
        chunks = framing.BinaryData(binary) if binary is not None else None
        for item in items:
            if type(item) is not dict or len(item) != _INPUT_KEYS:
                return None
            name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
            spec = declared.get(name) if type(name) is str else None
            if (spec is None or given_arrays[spec.index] is not None or datatype != spec.datatype
                    or type(shape) is not list or spec.count(shape, limit) is None):
                return None
            data = item.get("data")
            try:
                if data is not None:
                    array = codec.from_json(data, spec.datatype, shape, name=spec.name)
                else:  # its bytes in the binary part, and nothing else in its parameters
                    params = item.get("parameters")
                    size = params.get(_BINARY_SIZE) if type(params) is dict and len(params) == 1 else None
                    if type(size) is not int or chunks is None:
                        return None
                    array = codec.from_raw(chunks.take(size, spec.name), spec.datatype, shape, name=spec.name)
            except (codec.CodecError, framing.FramingError):
                return None
            if array.dtype != spec.dtype or array.shape != tuple(shape):
                return None
            given_arrays[spec.index] = array
        if chunks is not None:
            try:
                chunks.finish()
            except framing.FramingError:
                return None
        names: list[str] = []
        flags: list[bool] = []  # each listed output's: answered as binary data
        for output in requested:
            name = output.get("name") if type(output) is dict and 0 < len(output) <= 2 else None
            params = output.get("parameters", {}) if type(name) is str else None
            if type(name) is not str or type(params) is not dict or len(output) != 1 + ("parameters" in output):
                return None
            flag = params.get(_BINARY_DATA, False)
            if type(flag) is not bool or len(params) != (_BINARY_DATA in params) or (flag and not self.binary_on):
                return None
            names.append(name)
            flags.append(flag)
        wanted = plan.outputs_wanted(names)
        if wanted is None:
            return None
        arrays = dict(zip(plan.names, given_arrays, strict=True))
        batch_size = plan.batch_size(arrays)
        if batch_size is None:
            return None
        with lean.inference(plan, request_id, trace, "rest", start) as run:
            result = await lean.run_on_loop(run, plan, arrays, parameters, batch_size)
            outputs = plan.answer(result, wanted, batch_size)
            if outputs is None:  # converted or refused as the general way does
                response = lean.finish(plan, request_id, arrays, wanted, result, batch_size)
        if outputs is None:
            return encode_infer_response(response, dict(zip(names, flags, strict=True)), default_binary, parts=parts)
        raw: list[bytes | memoryview] = []
        if default_binary or True in flags:
            answered = [
                binary_output(out.name, out.datatype, list(array.shape), array, raw) if binary_out
                else json_output(out.name, out.datatype, list(array.shape), array)
                for out, array, binary_out in zip(wanted, outputs, flags or [default_binary] * len(wanted),
                                                  strict=True)]
        else:
            answered = [json_output(out.name, out.datatype, list(array.shape), array)
                        for out, array in zip(wanted, outputs, strict=True)]
        model = plan.model
        return infer_answer(answer_body(model.name, model.version, request_id, None, answered), raw, parts)
