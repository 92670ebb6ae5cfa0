"""Unary ModelInfer wholly in the gRPC thread (`in_thread`): the general way, and the lean way (`UnaryInfer`),
from the parsed message straight to the reply's bytes.

The general way (`Pipeline.infer_in_thread`) builds the data plane's request, runs it through every check and
observer, and encodes its response through protobuf; for a small request to a small model that work costs more
than the transport. `UnaryInfer` answers the common request with the same checks, accounting and errors, doing
only what that request needs:

- the request: no parameters (on the request, an input or an output), every input's data in
  `raw_input_contents` (no typed contents, no shared memory), each input declared, once, with its declared
  datatype (a fixed-size one other than BOOL) and a shape that fits its declaration and the element limit (the
  rule and the check of every way: `validation.shape_fits`, `validation.tensor_elements`), the raw entry exactly
  the bytes that shape needs; requested outputs known, not repeated, with no parameters;
- the model: ready, a plain `infer` that neither batches (`max_batch_size` 0) nor is decoupled (what it takes is
  worked out once per model instance, `_Plan`).

It enters and leaves through the same construct as every way (`accounting.Inference`), noting the moments the
general way's timer would take (compute_input up to the wait for a slot, queue, the model as compute_infer, then
the outputs as compute_output): the observers are told of a success by those moments (`Observer.ran_alone`, which
the statistics and tracing take as they are, and any other observer as the record the general way would give),
of a failure by its record. A timer is made only when an observer listens to a request's start (tracing: the
caller's trace context is its parent, and the request's span is current while the model runs) or the request has
an id (log lines name it).

Any other request takes the general way (`__call__` returns None before anything happened), which answers it
or refuses it with the usual error. Inputs are numpy views of the received bytes (read-only, as on the general
way); the model runs in one of `Settings.model_threads` slots; an output that is an array of its declared
datatype and shape is written as it is, anything else (another dtype to convert, response parameters, a wrong
answer) goes through the pipeline's `finish` and the transport's encoder, which check and refuse it as always.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final

import grpc
import numpy as np

from ... import codec, datatypes
from ...grpc import grpc_service_pb2 as pb
from ...grpc.wire import ONE_BYTE_VARINTS, varint
from ..core.accounting import Inference
from ..core.batching import is_batching
from ..core.invoke import call_in_thread, runs_alone
from ..core.pipeline import Pipeline, PreparedRequest
from ..core.validation import shape_fits, tensor_elements
from ..errors import OipError
from ..model import Model, TensorSpec
from ..observe.events import Timer
from ..observe.tracing import carrier
from ..settings import Settings
from ..types import InferRequest, InferResponse
from .infer_codec import InferCodec, InferWire, Malformed, message_size
from .servicer import Observe, metadata, status

__all__ = ["NOT_HERE", "UnaryInfer", "in_thread"]

NOT_HERE: Final = object()
"""What the thread's handler returns when the call must take the event loop's way."""

_RESPONSE: Final = pb.ModelInferResponse
_OUTPUT: Final = pb.ModelInferResponse.InferOutputTensor
_FIELDS: Final = _RESPONSE.DESCRIPTOR.fields_by_name
_OUTPUTS_TAG: Final = varint(_FIELDS["outputs"].number << 3 | 2)
_RAW_TAG: Final = varint(_FIELDS["raw_output_contents"].number << 3 | 2)
_LEAN_DATATYPES: Final = frozenset(
    info.name for info in datatypes.DATATYPES if not info.variable and info.name != "BOOL"
)
_MAX_HEADERS: Final = 4096  # serialized output headers kept per model (name, datatype, shape)


class _Input:
    __slots__ = ("datatype", "dtype", "elements", "fixed", "index", "itemsize", "shape")

    def __init__(self, index: int, spec: TensorSpec, limit: int) -> None:
        info = datatypes.BY_NAME[spec.datatype]
        self.index = index
        self.datatype = spec.datatype
        self.dtype = np.dtype(info.dtype)
        self.itemsize = info.size
        self.shape = list(spec.shape)
        self.fixed = -1 not in self.shape
        # A fixed shape's element count, checked once (the header check every request of that shape gets); None:
        # over the limit (such a request takes the general way, which refuses it).
        self.elements: int | None = None
        if self.fixed:
            try:
                self.elements = tensor_elements(spec.name, self.shape, limit)
            except OipError:
                self.elements = None


class _Plan:
    """What a request to one model instance takes on the lean way."""

    def __init__(self, model: Model, limit: int) -> None:
        self.model = model
        self.inputs = {spec.name: _Input(i, spec, limit) for i, spec in enumerate(model.inputs)}
        self.names = [spec.name for spec in model.inputs]
        self.outputs = {spec.name: spec for spec in model.outputs}
        self.all_outputs = list(model.outputs)
        self.dtypes = {
            spec.name: np.dtype(datatypes.BY_NAME[spec.datatype].dtype)
            for spec in model.outputs if spec.datatype in _LEAN_DATATYPES
        }
        self.shapes = {spec.name: tuple(spec.shape) for spec in model.outputs}
        self.prefix = _RESPONSE(model_name=model.name, model_version=model.version).SerializeToString()
        self.headers: dict[tuple[str, tuple[int, ...]], bytes] = {}

    @staticmethod
    def allows(model: Model) -> bool:
        return (
            runs_alone(model)
            and model.max_batch_size == 0
            and not is_batching(model)
            and all(spec.datatype in _LEAN_DATATYPES for spec in model.inputs)
        )

    def header(self, spec: TensorSpec, shape: tuple[int, ...]) -> bytes:
        """An output's serialized InferOutputTensor, framed as an entry of the response's `outputs` (made on the
        first answer of that shape: `headers` has it after)."""
        body = _OUTPUT(name=spec.name, datatype=spec.datatype, shape=shape).SerializeToString()
        header = _OUTPUTS_TAG + varint(len(body)) + body
        if len(self.headers) < _MAX_HEADERS:
            self.headers[spec.name, shape] = header
        return header


class UnaryInfer:
    """The lean way of unary ModelInfer (see the module's description). `encode` is the transport's encoder of
    a data plane response (the reply the general way gives), for the answers this way does not write itself."""

    def __init__(self, pipeline: Pipeline, settings: Settings, encode: Callable[[InferResponse], Any]) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.encode = encode
        self._plans: dict[tuple[str, str], tuple[Model, _Plan | None]] = {}  # by the request's name and version
        self._lock = threading.Lock()

    def _plan(self, name: str, version: str) -> _Plan | None:
        try:
            model = self.pipeline.repository.get(name, version)
        except OipError:
            return None  # unknown or not ready: the general way answers
        key = (name, version)
        known = self._plans.get(key)
        if known is not None and known[0] is model:
            return known[1]
        plan = _Plan(model, self.settings.max_tensor_elements) if _Plan.allows(model) else None
        with self._lock:
            if len(self._plans) > 1024:  # names that came and went
                self._plans.clear()
            self._plans[key] = (model, plan)
        return plan

    def __call__(self, message: Any, trace: dict[str, str] | None = None) -> Any:
        """The reply (serialized) to `message`, or None when it takes the general way (nothing happened yet).
        An error of the request or the model is raised as the data plane's error, after it was counted. `trace`:
        the caller's W3C trace context (`tracing.carrier`), when tracing is on."""
        start = time.perf_counter_ns()
        if message.parameters:
            return None
        plan = self._plan(message.model_name, message.model_version)
        if plan is None:
            return None
        arrays = self._inputs(plan, message, self.settings.max_tensor_elements)
        if arrays is None:
            return None
        wanted = self._outputs(plan, message)
        if wanted is None:
            return None
        pipeline = self.pipeline
        observers, slots, request_id = pipeline.observers, pipeline.model_slots, message.id
        timer = Timer(request_id, trace, "grpc") if observers.starting or request_id else None
        with Inference(pipeline.repository, observers, plan.model, timer, request_id, start) as run:
            run.queued = time.perf_counter_ns()
            slots.take()
            try:
                run.started = time.perf_counter_ns()
                result = call_in_thread(run.model, arrays, {})  # `plan.model`, or what a reload put in its place
                run.ended = time.perf_counter_ns()
            finally:
                slots.give(None)
            return self._reply(plan, message, arrays, wanted, result)

    @staticmethod
    def _inputs(plan: _Plan, message: Any, limit: int) -> dict[str, Any] | None:
        raw = message.raw_input_contents
        tensors = message.inputs
        count = len(plan.names)
        if len(tensors) != count or len(raw) != count:
            return None
        given: list[Any] = [None] * count
        declared = plan.inputs
        for i, tensor in enumerate(tensors):
            spec = declared.get(tensor.name)
            if (spec is None or given[spec.index] is not None or tensor.datatype != spec.datatype
                    or tensor.parameters or tensor.HasField("contents")):
                return None
            shape = tensor.shape[:]
            if spec.fixed:
                elements = spec.elements
                if shape != spec.shape or elements is None:
                    return None
            elif not shape_fits(spec.shape, shape):
                return None
            else:
                try:
                    elements = tensor_elements(tensor.name, shape, limit)
                except (OipError, codec.CodecError):
                    return None
            data = raw[i]
            if len(data) != elements * spec.itemsize:
                return None
            given[spec.index] = np.frombuffer(data, dtype=spec.dtype).reshape(shape)
        return dict(zip(plan.names, given, strict=True))

    @staticmethod
    def _outputs(plan: _Plan, message: Any) -> list[TensorSpec] | None:
        requested = message.outputs
        if not requested:
            return plan.all_outputs
        wanted: list[TensorSpec] = []
        for output in requested:
            spec = plan.outputs.get(output.name)
            if spec is None or output.parameters or spec in wanted:
                return None
            wanted.append(spec)
        return wanted

    def _reply(self, plan: _Plan, message: Any, arrays: dict[str, Any], wanted: list[TensorSpec],
               result: Any) -> Any:
        if type(result) is dict:
            parts: list[bytes] = [plan.prefix]
            request_id = message.id
            if request_id:
                parts.append(_RESPONSE(id=request_id).SerializeToString())
            raws: list[bytes] = []
            headers = plan.headers
            for spec in wanted:
                value = result.get(spec.name)
                if type(value) is not np.ndarray or value.dtype != plan.dtypes.get(spec.name):
                    break
                shape = value.shape
                declared = plan.shapes[spec.name]
                if shape != declared and not shape_fits(declared, shape):
                    break
                header = headers.get((spec.name, shape))
                parts.append(header if header is not None else plan.header(spec, shape))
                data = value.tobytes()
                size = len(data)
                raws += (_RAW_TAG, ONE_BYTE_VARINTS[size] if size < 0x80 else varint(size), data)
            else:
                return b"".join(parts + raws)
        # Anything else: checked, converted or refused as the pipeline does, encoded by the transport.
        request = InferRequest(model_name=message.model_name, model_version=message.model_version, id=message.id)
        prepared = PreparedRequest(arrays, wanted, {}, {}, 1, {})
        return self.encode(self.pipeline.finish(plan.model, request, prepared, result, {}))


def in_thread(
    pipeline: Pipeline, settings: Settings, infer: InferCodec[Any], rpc: str, observe: Observe | None, tracing: bool
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """Unary inference wholly in the gRPC thread, for a model that allows it (`Pipeline.runs_in_thread`): the same
    decoding, pipeline, encoding and errors as the servicer's way (`ServicerBase.infer_call`); NOT_HERE for any
    other request. The common request takes the lean way (`UnaryInfer`: the same checks, counts and errors, less
    work). `observe` counts and logs each answer; with `tracing`, the caller's trace context goes with the
    request."""
    decode_request, encode_wire = infer.decode_request, infer.encode_wire
    lean = UnaryInfer(pipeline, settings, encode_wire)
    request_type = infer.request

    def infer_in_thread(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            return NOT_HERE
        start, code, sent = time.perf_counter_ns(), "OK", 0
        trace = carrier(metadata(context).get) if tracing else None
        if type(request) is request_type:  # the common request: the lean way
            try:
                reply = lean(request, trace)
            except Exception as exc:
                status_code, details = status(exc)
                code = str(status_code.name)
                context.abort(status_code, details)
            finally:
                if observe is not None and code != "OK":
                    observe(rpc, code, start, request, sent)
            if reply is not None:
                if observe is not None:
                    observe(rpc, code, start, request, message_size(reply))
                return reply
        wire = request if isinstance(request, InferWire) else None
        message = wire.message if wire is not None else request
        if not pipeline.runs_in_thread(message.model_name, message.model_version):
            return NOT_HERE
        try:
            infer_request = decode_request(message, settings, wire.raw if wire is not None else None)
            infer_request.transport = "grpc"
            infer_request.trace = trace
            reply = encode_wire(pipeline.infer_in_thread(infer_request))
            if observe is not None:
                sent = message_size(reply)
            return reply
        except Exception as exc:
            status_code, details = status(exc)
            code = str(status_code.name)
            context.abort(status_code, details)
        finally:
            if observe is not None:
                observe(rpc, code, start, request, sent)

    return infer_in_thread
