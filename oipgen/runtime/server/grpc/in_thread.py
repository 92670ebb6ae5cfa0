"""Unary ModelInfer wholly in the gRPC thread (`in_thread`): the general way, and the lean way (`UnaryInfer`),
from the parsed message straight to the reply's bytes.

The general way (`Pipeline.infer_in_thread`) builds the data plane's request, runs it through every check and
observer, and encodes its response through protobuf; for a small request to a small model that work costs more
than the transport. `UnaryInfer` answers the common request with the same checks, statistics, metrics and
errors, doing only what that request needs:

- the request: no parameters (on the request, an input or an output), every input's data in
  `raw_input_contents` (no typed contents, no shared memory), each input declared, once, with its declared
  datatype (a fixed-size one other than BOOL) and a shape that fits its declaration and the element limit, the
  raw entry exactly the bytes that shape needs; requested outputs known, not repeated, with no parameters;
- the model: ready, a plain `infer` that neither batches (`max_batch_size` 0) nor is decoupled (what it takes is
  worked out once per model instance, `_Plan`);
- the observers: only the statistics extension, the metrics and tracing (`statistics.Statistics`,
  `metrics.Metrics`, `tracing.Tracing`): the statistics are updated directly (the metrics count nothing of a
  successful request here: its answer is counted by the transport, its pending time by the repository); tracing
  is told that the request started (with the caller's trace context, before the model runs, so the model's own
  spans are its children) and finished, with the phases' timestamps this way took anyway (any other observer
  takes the general way).

Any other request takes the general way (`__call__` returns None before anything happened), which answers it
or refuses it with the usual error. Inputs are numpy views of the received bytes (read-only, as on the general
way); the model runs in one of `Settings.model_threads` slots; an output that is an array of its declared
datatype and shape is written as it is, anything else (another dtype to convert, response parameters, a wrong
answer) goes through the pipeline's `finish` and the transport's encoder, which check and refuse it as always.
The phases are timed as the pipeline times them: compute_input up to the wait for a slot (queue), the model
(compute_infer), then the outputs (compute_output).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import grpc
import numpy as np

from ... import datatypes
from ...grpc import grpc_service_pb2 as pb
from ...grpc.wire import varint
from ..core.batching import is_batching
from ..core.pipeline import Pipeline, PreparedRequest, call_in_thread, failure, runs_alone
from ..errors import OipError
from ..model import Model, TensorSpec
from ..observe.events import (
    COMPUTE_INFER,
    COMPUTE_INPUT,
    COMPUTE_OUTPUT,
    QUEUE,
    InferenceRecord,
    Timer,
    notify_started,
    set_current,
)
from ..observe.metrics import Metrics
from ..observe.statistics import Statistics
from ..observe.tracing import Tracing, carrier
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


def _fits(shape: Sequence[int], declared: Sequence[int]) -> bool:
    """Whether `shape` is one the declared shape allows (-1: any size)."""
    if len(shape) != len(declared):
        return False
    return all(d == s or (s == -1 and d >= 0) for d, s in zip(shape, declared, strict=True))


_SIZES: Final = [varint(n) for n in range(1 << 12)]


def _size(n: int) -> bytes:
    """The varint of a length."""
    return _SIZES[n] if n < 4096 else varint(n)


class _Input:
    __slots__ = ("datatype", "dtype", "fixed", "index", "itemsize", "shape")

    def __init__(self, index: int, spec: TensorSpec) -> None:
        info = datatypes.BY_NAME[spec.datatype]
        self.index = index
        self.datatype = spec.datatype
        self.dtype = np.dtype(info.dtype)
        self.itemsize = info.size
        self.shape = list(spec.shape)
        self.fixed = -1 not in self.shape


class _Plan:
    """What a request to one model instance takes on the lean way."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.inputs = {spec.name: _Input(i, spec) for i, spec in enumerate(model.inputs)}
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
        """An output's serialized InferOutputTensor, framed as an entry of the response's `outputs`."""
        key = (spec.name, shape)
        header = self.headers.get(key)
        if header is None:
            body = _OUTPUT(name=spec.name, datatype=spec.datatype, shape=shape).SerializeToString()
            header = _OUTPUTS_TAG + varint(len(body)) + body
            if len(self.headers) < _MAX_HEADERS:
                self.headers[key] = header
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
        plan = _Plan(model) if _Plan.allows(model) else None
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
        statistics: Statistics | None = None
        tracing: Tracing | None = None
        for observer in self.pipeline.observers:
            kind = type(observer)
            if kind is Statistics:
                statistics = observer  # type: ignore[assignment]
            elif kind is Tracing:
                tracing = observer  # type: ignore[assignment]
            elif kind is not Metrics:  # the metrics count nothing here (the repository counts pending requests)
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
        model = plan.model
        repository = self.pipeline.repository
        timer: Timer | None = None
        if tracing is not None:
            timer = Timer(message.id, trace, "grpc")
            notify_started((tracing,), timer, model.name, model.version)  # the timer is the current one too
        else:
            set_current(Timer(message.id) if message.id else None)
        repository.acquire(model)
        try:
            queued = started = ended = 0
            try:
                queued = time.perf_counter_ns()
                with self.pipeline.model_slots:
                    started = time.perf_counter_ns()
                    result = call_in_thread(model, arrays, {})
                    ended = time.perf_counter_ns()
                reply = self._reply(plan, message, arrays, wanted, result)
            except BaseException as exc:
                self._failed(plan, message, start, queued, started, ended, exc, timer)
                raise
        finally:
            repository.release(model)
        done = time.perf_counter_ns()
        if statistics is not None:
            statistics.for_model(model.name, model.version).record_alone(
                queue_ns=started - queued, compute_input_ns=queued - start, compute_infer_ns=ended - started,
                compute_output_ns=done - ended, total_ns=done - start,
            )
        if timer is not None and tracing is not None:
            marks = ((COMPUTE_INPUT, start, queued), (QUEUE, queued, started), (COMPUTE_INFER, started, ended),
                     (COMPUTE_OUTPUT, ended, done))
            offset = timer.start_unix - timer.start
            tracing.finished(timer.state, model.name, model.version, message.id, "OK", "", start + offset,
                             done + offset, marks, offset)
        return reply

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
                if shape != spec.shape:
                    return None
            elif not _fits(shape, spec.shape):
                return None
            elements = 1
            for d in shape:
                elements *= d
            if elements > limit:
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
            for spec in wanted:
                value = result.get(spec.name)
                if type(value) is not np.ndarray or value.dtype != plan.dtypes.get(spec.name):
                    break
                shape = value.shape
                declared = plan.shapes[spec.name]
                if shape != declared and not _fits(shape, declared):
                    break
                parts.append(plan.header(spec, shape))
                data = value.tobytes()
                raws += (_RAW_TAG, _size(len(data)), data)
            else:
                return b"".join(parts + raws)
        # Anything else: checked, converted or refused as the pipeline does, encoded by the transport.
        request = InferRequest(model_name=message.model_name, model_version=message.model_version, id=message.id)
        prepared = PreparedRequest(arrays, wanted, {}, {}, 1, {})
        return self.encode(self.pipeline.finish(plan.model, request, prepared, result, {}))

    def _failed(self, plan: _Plan, message: Any, start: int, queued: int, started: int, ended: int,
                exc: BaseException, timer: Timer | None) -> None:
        """Report a request that failed once its model was known; the phases it went through (a phase it never
        reached has no span, as on the general way)."""
        now = time.perf_counter_ns()
        offset = time.time_ns() - now
        marks: list[tuple[str, int, int]] = [(COMPUTE_INPUT, start, queued or now)]
        if queued:
            marks.append((QUEUE, queued, started or now))
        if started:
            marks.append((COMPUTE_INFER, started, ended or now))
        if ended:
            marks.append((COMPUTE_OUTPUT, ended, now))
        queued = queued or now
        started = started or now
        ended = ended or now
        record = InferenceRecord(
            model=plan.model.name, version=plan.model.version, request_id=message.id, batch_size=1,
            error=failure(exc), queue_ns=started - queued, compute_input_ns=queued - start,
            compute_infer_ns=ended - started, compute_output_ns=now - ended, total_ns=now - start,
            start_ns=start + offset, marks=tuple(marks), offset_ns=offset,
            state=timer.state if timer is not None else None,
        )
        self.pipeline.report(record)



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
