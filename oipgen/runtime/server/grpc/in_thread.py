"""Unary ModelInfer wholly in the gRPC thread (`in_thread`): the general way, and the lean way (`UnaryInfer`),
from the parsed message straight to the reply's bytes.

The general way (`Pipeline.infer_in_thread`) builds the data plane's request, runs it through every check and
observer, and encodes its response through protobuf; for a small request to a small model that work costs more
than the transport. `UnaryInfer` answers the common request the lean way (`core.lean`: the same checks, accounting
and errors, doing only what that request needs). Here that is:

- the request: every input's data in `raw_input_contents` (each input's entry, in order) or in typed `contents`
  (every input's), decoded as every way decodes them (`codec`; an entry or contents that do not decode are the
  general way's to refuse); no input or output parameters (shared memory, classification); request parameters
  as the general way reads them (`Lean.parameters`);
- the model: ready, not decoupled, its `infer` a plain method; a model under dynamic batching runs in a batch
  formed by the gRPC threads waiting for it (`thread_batching.ThreadBatcher`), never waiting on the event loop;
  an inline one's call is queued in its batch by the polling thread and answered by the thread that runs it
  (`UnaryInfer.arrive`, `thread_batching.ArrivalBatcher`).

Any other request takes the general way (`__call__` returns None before anything happened), which answers it or
refuses it with the usual error. Raw inputs are numpy views of the received bytes (read-only, as on the general
way); an output that is an array of its declared datatype and shape is written as it is (BYTES: its elements
framed as raw contents are), anything else (another dtype to convert, response parameters, a wrong answer) goes
through the pipeline's `finish` and the transport's encoder, which check and refuse it as always.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
import numpy as np

from ... import codec
from ...grpc.wire import ONE_BYTE_VARINTS, varint
from ..core.accounting import Inference
from ..core.lean import Plan
from ..core.pipeline import Pipeline
from ..model import TensorSpec
from ..observe.tracing import carrier
from ..settings import Settings
from .infer_codec import InferCodec, InferWire, Malformed, message_size
from .servicer import Observe, metadata, metadata_of, status

__all__ = ["NOT_HERE", "InThread", "Respond", "UnaryInfer", "in_thread"]

NOT_HERE: Final = object()
"""What the thread's handler returns when the call must take the event loop's way."""

_BOOL: Final = np.dtype(np.bool_)


class UnaryInfer:
    """The lean way of unary ModelInfer (see the module's description). `infer` is the transport's codec: it
    reads a parameters map as the general way does, and writes the answers (the pieces of those this way writes
    itself, and the general way's answers to the rest)."""

    def __init__(self, pipeline: Pipeline, settings: Settings, infer: InferCodec[Any]) -> None:
        self.lean = pipeline.lean
        self.settings = settings
        self.infer = infer
        self.params = infer.params_from_proto
        # The call the polling thread is answering (`answers_here`): its message and the plan it looked up. That
        # call's handler takes the plan rather than looking it up again, and leaves its request's record to be made
        # once the reply is sent (`unrecorded`), so that the record never delays the reply (`Observers.recording`);
        # any other call's message is not this one.
        self.here: tuple[Any, Plan] | None = None
        self.unrecorded: Inference | None = None

    def __call__(self, message: Any, trace: dict[str, str] | None = None, raw: Sequence[Any] | None = None) -> Any:
        """The reply (serialized) to `message`, or None when it takes the general way (nothing happened yet).
        An error of the request or the model is raised as the data plane's error, after it was counted. `trace`:
        the caller's W3C trace context (`tracing.carrier`), when tracing is on; `raw`: the raw input contents when
        they are not in `message` (a large request's views, `InferWire`)."""
        start = time.perf_counter_ns()
        lean = self.lean
        here = self.here
        if here is not None and here[0] is message:  # the polling thread's own call (`answers_here`)
            plan: Plan | None = here[1]
            answered_here = True
        else:
            plan, answered_here = self.plan(message), False
        read = self._read(plan, message, raw) if plan is not None and plan.plain else None
        if plan is None or read is None:
            return None
        parameters, arrays, batch_size, wanted = read
        request_id = message.id
        run = lean.inference(plan, request_id, trace, "grpc", start)
        try:
            result = lean.run_in_thread(run, plan, arrays, parameters, batch_size)
            reply = self._reply(plan, request_id, arrays, wanted, result, batch_size)
        except BaseException as exc:
            run.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if answered_here:  # recorded once the reply is sent, as of now
            run.answered = time.perf_counter_ns()
            self.unrecorded = run
        else:
            run.__exit__(None, None, None)
        return reply

    def plan(self, message: Any) -> Plan | None:
        """The plan of the model version a request message names (`Lean.plan`)."""
        return self.lean.plan(message.model_name, message.model_version)

    def arrive(self, plan: Plan, message: Any, trace: dict[str, str] | None, raw: Sequence[Any] | None,
               answer: Callable[[Any, Exception | None], None], start: int) -> bool:
        """For a request to a model that batches where its requests arrive (`plan`, its `batches_on_arrival`), read
        on the lean way from `start`: queue it in its model's batch and return True at once; `answer` is called with
        its reply (or the error, counted already) by the thread that runs the batch (`Lean.join_batch`). False for
        any other request (nothing happened)."""
        lean = self.lean
        read = self._read(plan, message, raw)
        if read is None:
            return False
        parameters, arrays, batch_size, wanted = read
        request_id = message.id
        run = lean.inference(plan, request_id, trace, "grpc", start)
        unanswered = [run]  # popped (atomically) by the one answer

        def done(result: Any, error: BaseException | None) -> None:
            try:
                unanswered.pop()
            except IndexError:
                return
            try:
                if error is not None:
                    raise error
                reply = self._reply(plan, request_id, arrays, wanted, result, batch_size)
            except Exception as exc:
                run.__exit__(type(exc), exc, exc.__traceback__)  # the request's record, as leaving `with` makes it
                answer(None, exc)
            else:
                run.__exit__(None, None, None)
                answer(reply, None)

        try:
            lean.join_batch(run, plan, arrays, parameters, batch_size, done)
        except Exception as exc:  # not queued (no thread for the timer, say): answered with the error here
            done(None, exc)
        return True

    def _read(self, plan: Plan, message: Any, raw: Sequence[Any] | None) -> tuple[
            dict[str, Any], dict[str, Any], int, list[TensorSpec]] | None:
        """The parameters the model sees, the arrays by input name, the batch size and the outputs wanted of a
        common request; None for any other (the general way's)."""
        lean = self.lean
        entries = message.parameters
        parameters = lean.parameters(self.params(entries)) if entries else {}
        if parameters is None:
            return None
        arrays = self._inputs(plan, message, message.raw_input_contents if raw is None else raw, lean.limit)
        if arrays is None:
            return None
        batch_size = plan.batch_size(arrays)
        if batch_size is None:
            return None
        wanted = self._outputs(plan, message)
        return None if wanted is None else (parameters, arrays, batch_size, wanted)

    @staticmethod
    def _inputs(plan: Plan, message: Any, raw: Sequence[Any], limit: int) -> dict[str, Any] | None:
        tensors = message.inputs
        count = len(plan.names)
        if len(tensors) != count or (raw and len(raw) != count):
            return None
        arrays: dict[str, Any] = {}
        declared = plan.inputs
        in_order = True  # the tensors in the declared order, as clients send them: the arrays are in that order
        for i in range(count):  # by index: cheaper than a repeated field's iterator
            tensor = tensors[i]
            spec = declared.get(tensor.name)
            if spec is None or spec.name in arrays or tensor.datatype != spec.datatype or tensor.parameters:
                return None
            if spec.index != i:
                in_order = False
            shape = tensor.shape[:]
            elements = spec.count(shape, limit)
            if elements is None:
                return None
            if raw:
                if tensor.HasField("contents"):
                    return None
                data = raw[i]
                if spec.itemsize and spec.dtype is not _BOOL:  # fixed-size numbers: a view of the bytes as they are
                    if len(data) != elements * spec.itemsize:
                        return None
                    try:  # one call, where `frombuffer(...).reshape(...)` makes two arrays
                        arrays[spec.name] = np.ndarray(shape, spec.dtype, data)
                    except (TypeError, ValueError):  # a shape numpy cannot hold: the general way's to refuse
                        return None
                    continue
                decode: Callable[..., Any] = codec.from_raw
            elif tensor.HasField("contents"):
                data = tensor.contents
                decode = codec.from_contents_message
            else:
                return None
            try:
                arrays[spec.name] = decode(data, spec.datatype, shape, name=spec.name)
            except codec.CodecError:
                return None
        return arrays if in_order else {name: arrays[name] for name in plan.names}

    @staticmethod
    def _outputs(plan: Plan, message: Any) -> list[TensorSpec] | None:
        requested = message.outputs
        count = len(requested)
        if not count:
            return plan.all_outputs
        names: list[str] = []
        for i in range(count):  # by index, once: cheaper than a repeated field's iterator
            output = requested[i]
            if output.parameters:
                return None
            names.append(output.name)
        return plan.outputs_wanted(names)

    def _reply(self, plan: Plan, request_id: str, arrays: dict[str, Any], wanted: list[TensorSpec], result: Any,
               batch_size: int) -> Any:
        outputs = plan.answer(result, wanted, batch_size)
        if outputs is not None:
            infer, model = self.infer, plan.model
            parts: list[bytes | memoryview] = [infer.head(model.name, model.version)]
            if request_id:
                parts.append(infer.new_response(id=request_id).SerializeToString())
            raws: list[bytes | memoryview] = []
            raw_tag = infer.raw_tag
            for spec, value in zip(wanted, outputs, strict=True):
                parts.append(infer.header(spec.name, spec.datatype, value.shape))
                data: bytes | memoryview
                if value.dtype.kind != "O" and value.nbytes < codec.COPY_BELOW:
                    data = value.tobytes()  # `to_raw`'s own first way, without the call (`Plan.answer`: its dtype)
                else:
                    try:  # a large array's own memory; BYTES framed: an element that is no string, as below
                        data = codec.to_raw(value, spec.datatype, name=spec.name)
                    except codec.CodecError:
                        break
                size = data.nbytes if type(data) is memoryview else len(data)
                raws += (raw_tag, ONE_BYTE_VARINTS[size] if size < 0x80 else varint(size), data)
            else:
                return b"".join(parts + raws)
        # Anything else: checked, converted or refused as the pipeline does, written as the general way writes it.
        return self.infer.serialize_response(self.lean.finish(plan, request_id, arrays, wanted, result, batch_size))


Respond = Callable[..., None]
"""Answers a call in the calling thread: `respond()` by its own handler, `respond(behavior)` by another (a gRPC
behaviour: request and context in, the reply out), `respond(behavior, plain=True)` by one that uses no context and
never fails (given None for it), as `WarmPool` gives it."""


@dataclass(frozen=True, slots=True)
class InThread:
    """The gRPC thread's handler of unary inference (`in_thread`), and what answers a call without a pool thread
    (`answers_here`: given the arrived request, the call's metadata and `Respond`, it answers the call at once or
    once its batch has run, and says True; False: the call goes to a pool thread, `WarmPool`)."""

    handle: Callable[[Any, grpc.ServicerContext], Any]
    answers_here: Callable[[Any, Sequence[tuple[str, Any]], Respond], bool]

    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.handle(request, context)


def in_thread(
    pipeline: Pipeline, settings: Settings, infer: InferCodec[Any], rpc: str, observe: Observe | None, tracing: bool
) -> InThread:
    """Unary inference wholly in the gRPC thread, for a model that allows it (`Pipeline.runs_in_thread`): the same
    decoding, pipeline, encoding and errors as the servicer's way (`ServicerBase.infer_call`); NOT_HERE for any
    other request. The common request takes the lean way (`UnaryInfer`: the same checks, counts and errors, less
    work). `observe` counts and logs each answer; with `tracing`, the caller's trace context goes with the
    request."""
    decode_request, serialize_response = infer.decode_request, infer.serialize_response
    lean = UnaryInfer(pipeline, settings, infer)
    request_type = infer.request
    recording = pipeline.observers.recording

    def lean_way(request: Any, trace: dict[str, str] | None) -> Any:
        """The lean way's reply to `request` (a message or an `InferWire`), None when it leaves the request to the
        general way; the request's error raised."""
        wire = request if type(request) is InferWire else None
        if wire is None and type(request) is not request_type:
            return None
        return lean(request, trace) if wire is None else lean(wire.message, trace, wire.raw)

    def refuse(request: Any, context: grpc.ServicerContext, error: Exception, start: int) -> None:
        """Fail the call with `error`'s status (counted and logged first)."""
        status_code, details = status(error)
        if observe is not None:
            observe(rpc, str(status_code.name), start, request, 0)
        context.abort(status_code, details)

    def answered(request: Any, reply: Any, start: int) -> Any:
        """`reply`, once counted and logged."""
        if observe is not None:
            observe(rpc, "OK", start, request, message_size(reply))
        return reply

    def infer_in_thread(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            return NOT_HERE
        start, code, sent = time.perf_counter_ns(), "OK", 0
        trace = carrier(metadata(context).get) if tracing else None
        try:
            reply = lean_way(request, trace)
        except Exception as exc:
            refuse(request, context, exc, start)
        if reply is not None:
            return answered(request, reply, start)
        wire = request if type(request) is InferWire else None
        message = wire.message if wire is not None else request
        if not pipeline.runs_in_thread(message.model_name, message.model_version):
            return NOT_HERE
        try:
            infer_request = decode_request(message, settings, wire.raw if wire is not None else None)
            infer_request.transport = "grpc"
            infer_request.trace = trace
            reply = serialize_response(pipeline.infer_in_thread(infer_request))
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

    def answers_here(request: Any, pairs: Sequence[tuple[str, Any]], respond: Respond) -> bool:
        """Answer a call whose request has just arrived, where it is, when that never waits: a request to an inline
        model that runs alone at once (`Plan.inline`; its record made once its reply is sent), one to an
        inline model that batches once its batch has run (`Plan.batches_on_arrival`, `UnaryInfer.arrive`).
        Anything else (a malformed request, any other model) may wait: False."""
        wire = request if type(request) is InferWire else None
        message = wire.message if wire is not None else request
        if type(message) is not request_type:
            return False
        plan = lean.plan(message)
        if plan is None or not (plan.inline or plan.batches_on_arrival):
            return False
        start = time.perf_counter_ns()
        trace = carrier(metadata_of(pairs).get) if tracing else None

        def answer(reply: Any, error: Exception | None) -> None:
            """Send the reply (a behaviour that needs no servicer context: none is made), or fail the call."""
            if error is None:
                respond(lambda request, context: answered(request, reply, start), plain=True)
            else:
                respond(lambda request, context: refuse(request, context, error, start))

        if plan.inline:
            lean.here = (message, plan)
            with recording:  # until the reply's record is made (`Observers.recording`)
                try:
                    try:
                        reply = lean_way(request, trace)
                    except Exception as exc:
                        answer(None, exc)
                    else:
                        if reply is not None:
                            answer(reply, None)
                        else:  # the general way's, in its handler
                            respond()
                finally:
                    lean.here = None
                    run, lean.unrecorded = lean.unrecorded, None
                    if run is not None:
                        run.__exit__(None, None, None)
            return True

        return lean.arrive(plan, message, trace, wire.raw if wire is not None else None, answer, start)

    return InThread(infer_in_thread, answers_here)
