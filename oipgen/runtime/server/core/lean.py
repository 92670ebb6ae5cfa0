"""The lean way of inference: the common request, from a transport's decoder straight to the model and back, with
only the work it needs and the same checks, accounting and errors as the general way (`pipeline`).

Every request the data plane gets tries it first (`Pipeline.infer`, `Pipeline.infer_in_thread`: `Lean.infer_on_loop`,
`Lean.infer_in_thread`, which read the decoded request with `Lean.take`); the gRPC thread's lean decoder
(`grpc.in_thread`) reads the message itself. Either reads a request against its model's `Plan` (what a request to
one model instance takes, worked out once per instance: each input's declared datatype, dtype and shape, each
output's) into arrays by input name, the request parameters and the outputs wanted. It reads the common request
only: every declared input once, with its declared datatype and a shape that fits its declaration
(the rules of every way: `validation.shape_fits`, `validation.tensor_elements`; a model that batches: the same
batch size on every input, 1 to `max_batch_size`), no shared memory, no classification, no other input or output
parameters than the transport's own (binary data over REST). Anything else it leaves to the general way before
anything happened (`None`), which answers it or refuses it with its usual error; so do request parameters the
general way would refuse (`Lean.parameters`).

`Lean.run_in_thread` (the gRPC thread) and `Lean.run_on_loop` (the event loop) run the model as the general way
does (in one of the model slots, on the loop, or in a dynamic batch whose runs the batcher reports), inside the
one construct every inference enters and leaves through (`accounting.Inference`, opened by `Lean.inference`),
noting its moments rather than timing it with a `Timer` (made only when an observer listens to starts or the
request has an id). `Plan.answer` takes the model's outputs as they are when they are arrays of their declared
datatype and shape; anything else (another dtype to convert, response parameters, a wrong answer) goes through the
pipeline's `finish` (`Lean.finish`) and the transport's general encoder, which convert or refuse it as always.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ... import codec, datatypes
from ..errors import OipError
from ..model import Model, TensorSpec
from ..observe.events import Observers, Timer
from ..types import InferRequest, InferResponse, Tensor
from .accounting import Inference
from .batching import Batcher, Share, batch_rows, is_batching
from .invoke import Slots, call_in_thread, is_plain
from .repository import ModelRepository
from .thread_batching import ArrivalBatcher, ThreadBatcher
from .validation import check_request_parameters, declared_shape, shape_fits, tensor_elements

PARAMETERS: Final = "parameters"  # the extension request parameters need to reach the model (`pipeline.PARAMETERS`)

__all__ = ["InputPlan", "Lean", "Plan"]

_MAX_PLANS: Final = 1024  # model names and versions whose plans are kept (names that came and went are dropped)
_MAX_SHAPES: Final = 256  # shapes found to fit a variable declaration, kept per input and per plan's outputs


class InputPlan:
    """One declared input as the lean way reads it: its position, datatype, numpy dtype and element size (0 for
    BYTES), its declared shape (a batching model's with its batch dimension, -1), and for a fixed shape its
    element count (None: over the limit, which the general way refuses). A variable shape keeps the element counts
    of the shapes it was given that fit (most requests repeat a few shapes: a batch size, a sequence length)."""

    __slots__ = ("counts", "datatype", "dtype", "elements", "fixed", "index", "itemsize", "limit", "name", "shape",
                 "variable")

    def __init__(self, index: int, model: Model, spec: TensorSpec, limit: int) -> None:
        info = datatypes.BY_NAME[spec.datatype]
        self.index = index
        self.name = spec.name
        self.datatype = spec.datatype
        self.dtype = np.dtype(info.dtype)
        self.variable = info.variable
        self.itemsize = 0 if info.variable else info.size
        self.shape = list(declared_shape(model, spec))
        self.fixed = -1 not in self.shape
        self.limit = limit
        self.counts: dict[tuple[int, ...], int] = {}  # by a shape that fits, its element count under `limit`
        self.elements: int | None = None
        if self.fixed:
            try:
                self.elements = tensor_elements(spec.name, self.shape, limit)
            except OipError:
                self.elements = None

    def count(self, shape: list[int], limit: int) -> int | None:
        """The element count of a request tensor of this input with `shape`, when the shape fits the declaration
        and the limit; None otherwise (the general way's to refuse: a dimension that is no int, 1.0 or true, too)."""
        for d in shape:
            if type(d) is not int:
                return None
        if self.fixed:
            return self.elements if shape == self.shape else None
        known = limit == self.limit
        key = tuple(shape)  # plain ints only (checked above): True or 1.0 never stand for 1 here
        elements = self.counts.get(key) if known else None
        if elements is not None:
            return elements
        if not shape_fits(self.shape, shape):
            return None
        try:
            elements = tensor_elements(self.name, shape, limit)
        except (OipError, ValueError):
            return None
        if known:
            if len(self.counts) >= _MAX_SHAPES:
                self.counts.clear()
            self.counts[key] = elements
        return elements


class Plan:
    """What a request to one model instance takes on the lean way (see the module's description)."""

    def __init__(self, model: Model, limit: int) -> None:
        self.model = model
        self.batching = is_batching(model)  # dynamic batching: run in a batch
        self.max_batch_size = model.max_batch_size  # > 0: inputs and outputs have a batch dimension first
        self.plain = is_plain(model.infer)
        # Quick and never blocking (`Model.inline`), run alone: called wherever its request is, at once, without
        # a worker slot, as on the event loop (the gRPC polling thread answers such calls itself: it may not wait)
        self.inline = self.plain and not self.batching and model.inline
        # Quick and never blocking, under dynamic batching: batched where its requests arrive, by whichever thread
        # has them, none waiting (`thread_batching.ArrivalBatcher`; the gRPC polling thread's calls)
        self.batches_on_arrival = self.plain and self.batching and model.inline
        self.inputs = {spec.name: InputPlan(i, model, spec, limit) for i, spec in enumerate(model.inputs)}
        self.names = [spec.name for spec in model.inputs]
        self.outputs = {spec.name: spec for spec in model.outputs}
        self.all_outputs = list(model.outputs)
        self.wanted: dict[tuple[str, ...], list[TensorSpec]] = {}  # by the output names a request asks for
        self.dtypes = {spec.name: np.dtype(datatypes.BY_NAME[spec.datatype].dtype) for spec in model.outputs}
        self.shapes = {spec.name: tuple(declared_shape(model, spec)) for spec in model.outputs}
        self.fitting: set[tuple[str, tuple[int, ...]]] = set()  # (output, shape) found to fit a variable shape
        # Under dynamic batching, with every input's shape fixed after the batch dimension: the batch key of every
        # request it takes without parameters (`batching.batch_key`: its arrays are of the inputs' dtypes, which
        # every decoder gives, and of the declared shapes, which `InputPlan.count` checked); None otherwise.
        self.batch_key: Hashable | None = None
        if self.batching and all(-1 not in plan.shape[1:] for plan in self.inputs.values()):
            self.batch_key = tuple(sorted((plan.name, plan.dtype, tuple(plan.shape[1:]))
                                          for plan in self.inputs.values()))

    @staticmethod
    def allows(model: Model) -> bool:
        """Whether requests to `model` may take the lean way: one response each (not decoupled)."""
        return not model.decoupled

    def batch_size(self, arrays: Mapping[str, npt.NDArray[Any]]) -> int | None:
        """The request's batch size: 1 for a model that does not batch; for one that does, the first dimension
        every input shares, 1 to max_batch_size (None otherwise: the general way refuses the request)."""
        if not self.max_batch_size:
            return 1
        rows = batch_rows(arrays)
        return rows if rows is not None and 1 <= rows <= self.max_batch_size else None

    def outputs_wanted(self, names: Sequence[str]) -> list[TensorSpec] | None:
        """The outputs to answer, in answer order (every one when `names` is empty; not to be changed: a list is
        kept per names asked, as clients ask for the same ones request after request); None for an unknown or
        repeated name (the general way refuses it)."""
        if not names:
            return self.all_outputs
        key = tuple(names)
        wanted = self.wanted.get(key)
        if wanted is not None:
            return wanted
        wanted = []
        for name in names:
            spec = self.outputs.get(name)
            if spec is None or spec in wanted:
                return None
            wanted.append(spec)
        if len(self.wanted) >= _MAX_SHAPES:
            self.wanted.clear()
        self.wanted[key] = wanted
        return wanted

    def answer(self, result: Any, wanted: list[TensorSpec], batch_size: int) -> list[npt.NDArray[Any]] | None:
        """The wanted outputs of what the model returned, when each is an array of its declared datatype and shape
        (BYTES: an object array of `bytes`); None for anything else (`Lean.finish`)."""
        if type(result) is not dict:
            return None
        arrays: list[npt.NDArray[Any]] = []
        for spec in wanted:
            value = result.get(spec.name)
            if type(value) is not np.ndarray or value.dtype != self.dtypes[spec.name]:
                return None
            if value.dtype.kind == "O" and not codec.holds_bytes_only(value):
                return None  # BYTES whose elements are not all bytes yet: converted or refused by `finish`
            shape = value.shape
            declared = self.shapes[spec.name]
            if shape != declared and (spec.name, shape) not in self.fitting:
                if not shape_fits(declared, shape):
                    return None
                if len(self.fitting) >= _MAX_SHAPES:
                    self.fitting.clear()
                self.fitting.add((spec.name, shape))
            if self.max_batch_size and shape[0] != batch_size:
                return None
            arrays.append(value)
        return arrays


RunOnLoop = Callable[..., Awaitable[tuple[Any, int, int]]]
"""How the model runs from the event loop (`Pipeline.run`): the result, when it started and ended."""
Finish = Callable[[Model, str, dict[str, Any], list[TensorSpec], Any, int], InferResponse]
"""The general way's response to what the model returned (`Pipeline.finish_result`): model, request id, inputs, the
outputs wanted, the result, the batch size."""


class Lean:
    """The lean way over a data plane's parts (see the module's description): its repository and observers, the
    tensor element limit, the extensions served, the model slots, its three batchers, and what runs the model on the
    loop and what finishes a response the general way (the pipeline's, handed over by it)."""

    def __init__(self, repository: ModelRepository, observers: Observers, limit: int, enabled: Sequence[str],
                 slots: Slots, batcher: Batcher, thread_batcher: ThreadBatcher, arrival_batcher: ArrivalBatcher,
                 run: RunOnLoop, finish: Finish) -> None:
        self.repository = repository
        self.observers = observers
        self.limit = limit
        self.enabled = enabled
        self.slots = slots
        self.batcher = batcher
        self.thread_batcher = thread_batcher
        self.arrival_batcher = arrival_batcher
        self.run = run
        self.general_finish = finish
        self._plans: dict[tuple[str, str], tuple[Model, Plan | None]] = {}  # by the request's name and version
        self._lock = threading.Lock()
        self._retired = 0  # instances forgotten so far (`forget`)

    def plan(self, name: str, version: str) -> Plan | None:
        """The plan of the model version a request names; None when it is unknown, not ready or not for the lean
        way (the general way answers)."""
        retired = self._retired
        try:
            model = self.repository.get(name, version)
        except OipError:
            return None
        key = (name, version)
        known = self._plans.get(key)
        if known is not None and known[0] is model:
            return known[1]
        plan = Plan(model, self.limit) if Plan.allows(model) else None
        with self._lock:
            # An instance retired since the lookup may be this one (a reload or unload ran meanwhile): its plan
            # serves this request but is not kept, or it would hold the instance after `forget`.
            if self._retired == retired:
                if len(self._plans) > _MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = (model, plan)
        return plan

    def forget(self, model: Model) -> None:
        """Drop the plans of `model`, retired (`ModelRepository.on_retired`): requests now find its successor, or
        no model."""
        with self._lock:
            self._retired += 1
            self._plans = {key: known for key, known in self._plans.items() if known[0] is not model}

    def parameters(self, given: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the model sees of the request parameters, as the general way makes it
        (`validation.check_request_parameters`); None when the general way would refuse them (a reserved key, a
        value of the wrong type, parameters without the parameters extension), so that it does."""
        if not given:
            return {}
        try:
            checked = check_request_parameters(given)
        except OipError:
            return None
        if checked and PARAMETERS not in self.enabled:
            return None
        return checked

    def inference(self, plan: Plan, request_id: str, trace: Mapping[str, str] | None, transport: str,
                  start: int) -> Inference:
        """The request's hold on its model version, from `start` (`time.perf_counter_ns`): `with` it around the run
        and the answer's encoding. A timer only when an observer listens to starts or the request has an id."""
        observers = self.observers
        timer = Timer(request_id, trace, transport) if observers.starting or request_id else None
        return Inference(self.repository, observers, plan.model, timer, request_id, start)

    def run_in_thread(self, run: Inference, plan: Plan, arrays: dict[str, Any], parameters: dict[str, Any],
                      batch_size: int) -> Any:
        """Run a plain `infer` in this thread (not the event loop's), in one of the model slots: alone, or under
        dynamic batching in a batch formed by the threads waiting for it (`thread_batching.ThreadBatcher`); what it
        returned for this request."""
        run.queued = time.perf_counter_ns()
        run.batch_size = batch_size
        if plan.batching:
            share, run.formed, run.started, run.ended = self.thread_batcher.infer(
                run.model, arrays, parameters, self._call, batch_size, None if parameters else plan.batch_key)
            run.alone = False
            return _result(share)
        slots = None if plan.inline else self.slots
        if slots is not None:
            slots.take()
        try:
            run.started = time.perf_counter_ns()
            result = call_in_thread(run.model, arrays, parameters)  # `plan.model`, or what a reload put in its place
            run.ended = time.perf_counter_ns()
        finally:
            if slots is not None:
                slots.give(None)
        return result

    def join_batch(self, run: Inference, plan: Plan, arrays: dict[str, Any], parameters: dict[str, Any],
                   batch_size: int, done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue a request to a model that `batches_on_arrival` and return at once: `done` is called with what
        the model returned for it, or the error that failed its batch, by the thread that runs the batch (this one,
        if it is due now; `thread_batching.ArrivalBatcher`). `run` stays open until `done` closes it."""
        run.queued = time.perf_counter_ns()
        run.batch_size, run.alone = batch_size, False

        def ran(share: Share | None, error: BaseException | None) -> None:
            if share is None:
                done(None, error)
                return
            result, run.formed, run.started, run.ended = share
            done(_result(result), None)

        self.arrival_batcher.add(run.model, arrays, parameters, _call_inline, ran, batch_size,
                                 None if parameters else plan.batch_key)

    def _call(self, model: Model, inputs: dict[str, Any], parameters: dict[str, Any]) -> tuple[Any, int, int]:
        """A batch's model call in this thread, in one of the model slots: the result, when it started and ended."""
        slots = self.slots
        slots.take()
        try:
            started = time.perf_counter_ns()
            return call_in_thread(model, inputs, parameters), started, time.perf_counter_ns()
        finally:
            slots.give(None)

    async def run_on_loop(self, run: Inference, plan: Plan, arrays: dict[str, Any], parameters: dict[str, Any],
                          batch_size: int) -> Any:
        """Run the model from the event loop as the general way does (`Pipeline.schedule`): in a dynamic batch, or
        alone (inline, a coroutine on the loop, a plain method in a worker thread's slot); what it returned for this
        request."""
        run.queued = time.perf_counter_ns()
        if plan.batching:
            share, run.formed, run.started, run.ended = await self.batcher.infer(
                run.model, arrays, parameters, self.run, batch_size, None if parameters else plan.batch_key)
            run.batch_size, run.alone = batch_size, False
            result = _result(share)
        else:
            result, run.started, run.ended = await self.run(run.model, arrays, parameters, run.model_started)
            run.batch_size = batch_size
        return result

    def finish(self, plan: Plan, request_id: str, arrays: dict[str, Any], wanted: list[TensorSpec], result: Any,
               batch_size: int) -> InferResponse:
        """The general way's response to what the model returned (`Pipeline.finish`: converted, or refused with its
        error), for a transport's general encoder."""
        return self.general_finish(plan.model, request_id, arrays, wanted, result, batch_size)

    # --- the decoded request (`types.InferRequest`), as the data plane gets it from either transport ----------

    def take(self, plan: Plan, request: InferRequest) -> tuple[dict[str, Any], dict[str, Any], list[TensorSpec],
                                                                int] | None:
        """The arrays by input name (in declared order), the parameters the model sees, the outputs wanted and the
        batch size of a decoded request, when it is the common request (see the module's description); None
        otherwise."""
        tensors = request.inputs
        names = plan.names
        if request.raw_input is not None or len(tensors) != len(names):
            return None
        declared = plan.inputs
        given: list[Any] = [None] * len(names)
        limit = self.limit
        for tensor in tensors:
            spec = declared.get(tensor.name)
            data = tensor.data
            if (spec is None or given[spec.index] is not None or tensor.datatype != spec.datatype or tensor.parameters
                    or data is None or data.dtype != spec.dtype or spec.count(tensor.shape, limit) is None
                    or data.shape != tuple(tensor.shape)):
                return None
            given[spec.index] = data
        for output in request.outputs:
            if output.parameters:
                return None
        wanted = plan.outputs_wanted([output.name for output in request.outputs])
        parameters = self.parameters(request.parameters)
        if wanted is None or parameters is None:
            return None
        arrays = dict(zip(names, given, strict=True))
        batch_size = plan.batch_size(arrays)
        return None if batch_size is None else (arrays, parameters, wanted, batch_size)

    def response(self, plan: Plan, request_id: str, arrays: dict[str, Any], wanted: list[TensorSpec], result: Any,
                 batch_size: int) -> InferResponse:
        """The data plane's response to what the model returned: its outputs as they are (`Plan.answer`), or as the
        general way makes them (`finish`)."""
        outputs = plan.answer(result, wanted, batch_size)
        if outputs is None:
            return self.finish(plan, request_id, arrays, wanted, result, batch_size)
        model = plan.model
        return InferResponse(model.name, model.version, request_id, {}, [
            Tensor(spec.name, spec.datatype, list(array.shape), array) for spec, array in zip(wanted, outputs,
                                                                                              strict=True)
        ])

    async def infer_on_loop(self, request: InferRequest) -> InferResponse | None:
        """`Pipeline.infer` of the common request; None (nothing happened) for any other."""
        start = time.perf_counter_ns()
        plan = self.plan(request.model_name, request.model_version)
        taken = self.take(plan, request) if plan is not None else None
        if plan is None or taken is None:
            return None
        arrays, parameters, wanted, batch_size = taken
        with self.inference(plan, request.id, request.trace, request.transport, start) as run:
            result = await self.run_on_loop(run, plan, arrays, parameters, batch_size)
            return self.response(plan, request.id, arrays, wanted, result, batch_size)

    def infer_in_thread(self, request: InferRequest) -> InferResponse | None:
        """`Pipeline.infer_in_thread` of the common request (a plain model that does not batch dynamically); None
        (nothing happened) for any other."""
        start = time.perf_counter_ns()
        plan = self.plan(request.model_name, request.model_version)
        taken = self.take(plan, request) if plan is not None and plan.plain and not plan.batching else None
        if plan is None or taken is None:
            return None
        arrays, parameters, wanted, batch_size = taken
        with self.inference(plan, request.id, request.trace, request.transport, start) as run:
            result = self.run_in_thread(run, plan, arrays, parameters, batch_size)
            return self.response(plan, request.id, arrays, wanted, result, batch_size)


def _call_inline(model: Model, inputs: dict[str, Any], parameters: dict[str, Any]) -> tuple[Any, int, int]:
    """A batch's call of an inline model in this thread, without a model slot (it never waits for one, as on the
    event loop): the result, when it started and ended."""
    started = time.perf_counter_ns()
    return call_in_thread(model, inputs, parameters), started, time.perf_counter_ns()


def _result(share: tuple[dict[str, Any], dict[str, Any]]) -> Any:
    """A request's share of a batch as a model's result: its outputs, with the response parameters if any."""
    outputs, parameters = share
    return (outputs, parameters) if parameters else outputs
