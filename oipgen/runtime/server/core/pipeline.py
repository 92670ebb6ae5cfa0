"""Inference, one way through: prepare -> schedule (alone, or in a dynamic batch) -> run -> finish.

Every inference request, over ModelInfer, REST or a stream, goes through `Pipeline` with one `observe.events.Timer`:

- prepare (`compute_input`): the model version is leased from the repository (unknown: NotFound; not ready:
  NotReady), a raw binary request gets its input's shape from the model (`validation.raw_input`), inputs held in
  shared memory are read, and the request is checked against the model's declarations (`validation`,
  `classification`);
- schedule (`queue`): a model with dynamic batching hands the request to the batcher (`batching`), which merges it
  with others (the merge counts as `compute_input`); any other waits for a worker thread;
- run (`compute_infer`): the model's `infer`, a plain method in a worker thread or a coroutine on the loop (see
  `model.call_hook`, `invoke`); its exception becomes ModelFailure with its message, logged with its traceback;
- finish (`compute_output`): the outputs checked, converted to their declared datatypes and ordered,
  classification applied, outputs placed in shared memory written there.

Each request is held by one `accounting.Inference` from the lease of its model version to its record: when the
request is done, successfully or not, the timer's record goes to every observer (`observe.events.Observer`; the
statistics extension is the first), and every model run is reported as an execution: one per request, one per
batch under dynamic batching.

A decoupled model (`Model.decoupled`, its `infer` a generator) answers over the stream only (ModelInfer and REST:
UNIMPLEMENTED, as in Triton) with any number of responses, each finished as it comes and flagged
`triton_final_response: false`, then an empty final response if the request asked for one
(`triton_enable_empty_final_response`); the time the transport takes to send a response is in no phase. A model
that is not decoupled answers a stream's request with its one response, flagged final (`streaming`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy.typing as npt

from ..errors import InvalidRequest, OipError, Unimplemented
from ..model import Model, TensorSpec, call_hook
from ..observe.events import COMPUTE_INFER, COMPUTE_INPUT, COMPUTE_OUTPUT, QUEUE, Observers, Timer
from ..settings import Settings
from ..types import InferRequest, InferResponse, Tensor
from .accounting import Inference
from .batching import Batcher, is_batching
from .classification import CLASSIFICATION, check_classification, classify
from .invoke import Slots, call_in_thread, is_plain, model_error, runs_alone
from .lean import PARAMETERS, Lean
from .repository import ModelRepository
from .shared_memory import REGION, Placement, Region, SharedMemory, placement_of
from .streaming import EMPTY_FINAL, FINAL, Answer, final_response, serve_stream
from .thread_batching import ArrivalBatcher, ThreadBatcher
from .validation import (
    check_inputs,
    check_output,
    check_request_parameters,
    check_requested_outputs,
    raw_input,
    split_result,
)

__all__ = ["PARAMETERS", "SHARED_MEMORY", "Pipeline", "PreparedRequest"]

# The extensions inference itself checks (`extensions.EXTENSIONS`; classification: `classification`): request
# parameters reach the model only with the parameters extension (`PARAMETERS`, from `lean`), tensors name shared
# memory regions only with system shared memory.
SHARED_MEMORY: Final = "system_shared_memory"
# How long a decoupled model's async generator may hold the event loop before its stream gives the loop a turn:
# long enough that a turn (a task step and a poll of the sockets, about 3.5 us) is a few percent of the stream's
# time, short enough that a request waiting behind N streams waits about N of these.
_LOOP_TURN_NS: Final = 100_000


@dataclass(slots=True)
class PreparedRequest:
    """An inference request checked against its model, ready to run (`Pipeline.prepare`)."""

    inputs: dict[str, npt.NDArray[Any]]  # by input name, in declared order, batch dimension first if batching
    outputs: list[TensorSpec]  # the outputs to answer, in answer order
    classification: dict[str, int]  # output name -> top k, for the outputs answered as classes
    parameters: dict[str, Any]  # what the model sees (transport and reserved keys removed)
    batch_size: int  # the first dimension of every input for a model that batches; 1 otherwise
    placements: dict[str, Placement]  # output name -> where in shared memory it goes


class Pipeline:
    """The inference requests of a data plane, from its repository, settings and shared memory regions.

    `enabled` names the extensions the data plane serves; `observers` are told about every request and model run
    (the data plane's list: observers added later are told too)."""

    def __init__(
        self,
        repository: ModelRepository,
        settings: Settings,
        shared_memory: SharedMemory,
        enabled: tuple[str, ...],
        observers: Observers,
    ) -> None:
        self.repository = repository
        self.settings = settings
        self.shared_memory = shared_memory
        self.enabled = enabled
        self.observers = observers
        self.batcher = Batcher(observers.execution_finished)
        self.thread_batcher = ThreadBatcher(observers.execution_finished)  # the gRPC threads' lean way's batches
        # An inline model's, on arrival; its timer thread answers gRPC calls, so it is scheduled as the gRPC threads
        self.arrival_batcher = ArrivalBatcher(observers.execution_finished,
                                              low_priority=settings.grpc_thread_scheduling == "batch")
        # Plain `infer` methods running at once, over both paths (the event loop's worker threads, the gRPC threads).
        self.model_slots = Slots(max(1, settings.model_threads))
        # The common request, with only the work it needs
        self.lean = Lean(repository, observers, settings.max_tensor_elements, enabled, self.model_slots,
                         self.batcher, self.thread_batcher, self.arrival_batcher, self.run,
                         self.finish_result)
        repository.on_retired(self._forget)

    def _forget(self, model: Model) -> None:
        """Let go of what is kept for `model`, retired (the loop's batcher drops a queue once it is empty)."""
        self.thread_batcher.forget(model)
        self.arrival_batcher.forget(model)
        self.lean.forget(model)

    # --- one request, one response (ModelInfer, REST, a stream's request to a model that is not decoupled) ----

    async def infer(self, request: InferRequest) -> InferResponse:
        """The response to one request: the common request the lean way (`lean`), any other through every
        phase."""
        response = await self.lean.infer_on_loop(request)
        if response is not None:
            return response
        timer = Timer(request.id, request.trace, request.transport)
        model = self.repository.get(request.model_name, request.model_version)
        if model.decoupled:
            raise Unimplemented(
                f"model '{model.name}' is decoupled (it may answer a request with any number of responses): "
                "ModelInfer and the REST infer endpoint do not support models with a decoupled transaction "
                "policy; use the ModelStreamInfer gRPC stream"
            )
        with Inference(self.repository, self.observers, model, timer) as run:  # a cancellation fails it too
            prepared = self.prepare(model, request)
            with self.shared_memory.using(prepared.placements) as regions:
                result = await self.schedule(model, prepared, timer)
                response = self.finish(model, request, prepared, result, regions)
            run.batch_size, run.alone = prepared.batch_size, not is_batching(model)
        return response

    # --- the same, wholly in the calling thread (the gRPC server's), for a model that allows it ---------------

    def runs_in_thread(self, name: str, version: str) -> bool:
        """Whether a request to this model version can run wholly in the calling thread (`infer_in_thread`): its
        `infer` is a plain method, and it neither batches dynamically nor is decoupled. False too for a model that
        is unknown or not ready: the event loop's path answers that."""
        try:
            model = self.repository.get(name, version)
        except OipError:
            return False
        return runs_alone(model)

    def infer_in_thread(self, request: InferRequest) -> InferResponse:
        """`infer`, in this thread and without the event loop, for a model that `runs_in_thread`: the same phases,
        checks, observers and errors. The model runs when one of `Settings.model_threads` slots is free (the
        wait is the queue), the slots the event loop's path uses too; an inline model takes none, as on the loop."""
        response = self.lean.infer_in_thread(request)
        if response is not None:
            return response
        timer = Timer(request.id, request.trace, request.transport)
        with Inference(self.repository, self.observers, self.repository.get(request.model_name, request.model_version),
                       timer) as run:
            model = run.model  # in this thread, a reload may have replaced the instance `get` found
            prepared = self.prepare(model, request)
            with self.shared_memory.using(prepared.placements) as regions:
                timer.enter(QUEUE)
                with contextlib.nullcontext() if model.inline else self.model_slots:
                    timer.enter(COMPUTE_INFER)
                    result = call_in_thread(model, prepared.inputs, prepared.parameters)
                timer.enter(COMPUTE_OUTPUT)
                response = self.finish(model, request, prepared, result, regions)
            run.batch_size = prepared.batch_size
        return response

    def prepare(self, model: Model, request: InferRequest) -> PreparedRequest:
        """Check `request` against `model` (InvalidRequest when it does not fit) and return what runs it."""
        if request.raw_input is not None:
            request.inputs = [raw_input(model, request.raw_input, self.settings.max_tensor_elements)]
            request.raw_input = None
        self._read_shared_memory(request)
        inputs, batch_size = check_inputs(model, request.inputs)
        wanted = check_requested_outputs(model, [output.name for output in request.outputs])
        classification = check_classification(model, request.outputs, CLASSIFICATION in self.enabled)
        parameters = check_request_parameters(request.parameters)
        if parameters and PARAMETERS not in self.enabled:
            raise Unimplemented(
                f"the parameters extension is not enabled on this server: request parameters "
                f"({', '.join(sorted(parameters))}) cannot reach the model"
            )
        placements = self._shared_memory_outputs(request)
        return PreparedRequest(inputs, wanted, classification, parameters, batch_size, placements)

    async def schedule(self, model: Model, prepared: PreparedRequest, timer: Timer) -> Any:
        """Run the prepared request: in a dynamic batch for a model that batches that way, alone otherwise. What
        the model returned for this request (its own rows of a batch)."""
        timer.enter(QUEUE)
        if is_batching(model):
            result, formed, started, ended = await self.batcher.infer(
                model, prepared.inputs, prepared.parameters, self.run
            )
            timer.enter(COMPUTE_INPUT, formed)  # merging the batch's inputs
            timer.enter(COMPUTE_INFER, started)
        else:  # the wait for a worker thread is the queue; the timer enters compute_infer as the model starts
            result, _, ended = await self.run(
                model, prepared.inputs, prepared.parameters, lambda at: timer.enter(COMPUTE_INFER, at)
            )
        timer.enter(COMPUTE_OUTPUT, ended)
        return result

    async def run(
        self, model: Model, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any],
        on_start: Callable[[int], object] | None = None,
    ) -> tuple[Any, int, int]:
        """Call `model.infer`: what it returned, and when it started and ended (`time.perf_counter_ns`; the wait
        for a worker thread comes before the start, which `on_start` is told as it happens)."""
        hook = model.infer
        plain = is_plain(hook)
        if plain and model.inline:  # quick and never blocking: called here, on the loop
            started = time.perf_counter_ns()
            if on_start is not None:
                on_start(started)
            try:
                result = hook(inputs, parameters)
                if type(result) is not dict and inspect.isawaitable(result):  # dict: the common answer, told quickly
                    result = await result
            except Exception as exc:
                raise model_error(model, exc)  # noqa: B904 (its cause is set: the model's exception)
            return result, started, time.perf_counter_ns()
        if plain:
            hook = self._in_slot(hook, on_start)  # in its worker thread: waits for a slot, then starts
            on_start = None
        try:
            return await call_hook(hook, inputs, parameters, on_start=on_start)
        except Exception as exc:
            raise model_error(model, exc)  # noqa: B904 (its cause is set: the model's exception)

    def _in_slot(self, hook: Callable[..., Any], on_start: Callable[[int], object] | None) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with self.model_slots:
                if on_start is not None:
                    on_start(time.perf_counter_ns())
                return hook(*args)

        return run

    def finish(
        self, model: Model, request: InferRequest, prepared: PreparedRequest, result: Any,
        regions: Mapping[str, Region],
    ) -> InferResponse:
        """The response from what `infer` returned: outputs checked, converted to their declared datatypes and
        ordered, classification applied, outputs placed in shared memory written to their `regions`; ModelFailure
        when the model's answer does not fit its declarations."""
        outputs: Mapping[str, Any]
        response_parameters: dict[str, Any]
        if type(result) is dict:  # the common answer: outputs alone, no response parameters
            outputs, response_parameters = result, {}
        else:
            outputs, response_parameters = split_result(model, result)
        tensors: list[Tensor] = []
        for spec in prepared.outputs:
            tensor = check_output(model, spec, outputs, prepared.batch_size)
            count = prepared.classification.get(spec.name)
            if count:
                tensor = classify(model, spec, tensor, count)
            tensors.append(tensor)
        # positional: a class called with keywords builds a dict of them first (0.7 us of a stream's response)
        response = InferResponse(model.name, model.version, request.id, response_parameters, tensors)
        if prepared.placements:  # outputs to shared memory (most responses have none)
            self._write_shared_memory(response, prepared.placements, regions)
        return response

    def finish_result(self, model: Model, request_id: str, inputs: dict[str, npt.NDArray[Any]],
                      wanted: list[TensorSpec], result: Any, batch_size: int) -> InferResponse:
        """`finish` of a request the lean way ran (no classification, parameters or shared memory: `lean`)."""
        request = InferRequest(model_name=model.name, model_version=model.version, id=request_id)
        return self.finish(model, request, PreparedRequest(inputs, wanted, {}, {}, batch_size, {}), result, {})

    # --- streams ---------------------------------------------------------------------------------------------

    def stream(self, requests: AsyncIterator[InferRequest | Exception]) -> AsyncIterator[InferResponse | Exception]:
        """The responses to a stream of requests (see `streaming`): one per request of a model that is not
        decoupled, in request order and flagged final; any number for a decoupled model, as it yields them; a
        failed request yields its error (a `streaming.StreamError`) and the stream goes on."""
        return serve_stream(requests, self.answer)

    def answer(self, request: InferRequest) -> Answer:
        """How one request of a stream is answered (`streaming.Answer`): decoupled or not, as its model is."""
        model = self.repository.get(request.model_name, request.model_version)
        if model.decoupled:
            return Answer(lambda: self.infer_decoupled(request), decoupled=True)
        return Answer(lambda: self._infer_final(request), decoupled=False)

    async def _infer_final(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        response = await self.infer(request)
        response.parameters[FINAL] = True
        yield response

    async def infer_decoupled(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses of a decoupled model to one request, each flagged `triton_final_response: false`, then
        an empty final response if the request asked for it (`triton_enable_empty_final_response`)."""
        timer = Timer(request.id, request.trace, request.transport)
        empty_final = request.parameters.get(EMPTY_FINAL) is True
        model = self.repository.get(request.model_name, request.model_version)
        with Inference(self.repository, self.observers, model, timer) as run:  # the stream going away fails it too
            prepared = self.prepare(model, request)
            timer.enter(COMPUTE_INFER)
            with self.shared_memory.using(prepared.placements) as regions:
                results = await self._results(model, prepared)
                clock = time.perf_counter_ns
                turn_ends = clock() + _LOOP_TURN_NS
                try:
                    while True:
                        try:
                            result = await anext(results)
                        except StopAsyncIteration:
                            break
                        except Exception as exc:
                            raise model_error(model, exc)  # noqa: B904 (its cause is set: the model's exception)
                        timer.enter(COMPUTE_OUTPUT)
                        response = self.finish(model, request, prepared, result, regions)
                        response.parameters[FINAL] = False
                        if timer.first_response is None:
                            timer.first_response = timer.enter(None)  # the transport's time is not the model's
                        else:
                            timer.enter(None)
                        yield response
                        timer.enter(COMPUTE_INFER)
                        # A generator that never awaits (most do not) would hold the loop until its end, and a gone
                        # client would go unnoticed until then: the loop gets a turn once this one has held it
                        # long enough (every response would cost a small response's stream a tenth of its time).
                        if clock() >= turn_ends:
                            await asyncio.sleep(0)
                            turn_ends = clock() + _LOOP_TURN_NS
                finally:
                    aclose = getattr(results, "aclose", None)
                    if aclose is not None:
                        await aclose()
                timer.enter(None)
            run.batch_size = prepared.batch_size
        if empty_final:
            yield final_response(request, model.version)

    async def _results(self, model: Model, prepared: PreparedRequest) -> AsyncIterator[Any]:
        """What a decoupled model answers one request with, to be read as it comes: the async generator (or
        iterator) its `infer` gives, read directly (`infer_decoupled` turns its errors into the model's and gives
        the event loop its turns); a plain generator's items, each taken in a worker thread (`_in_thread`); or
        the one result of an `infer` that is no generator."""
        hook = model.infer
        if inspect.isasyncgenfunction(hook):
            return hook(prepared.inputs, prepared.parameters)
        results, _, _ = await self.run(model, prepared.inputs, prepared.parameters)
        if isinstance(results, AsyncIterator):
            return results
        if isinstance(results, Iterator) and not isinstance(results, Mapping):
            return _in_thread(model, results)
        return _once(results)

    # --- shared memory of inference tensors ----------------------------------------------------------------

    def _read_shared_memory(self, request: InferRequest) -> None:
        """Read the data of the inputs that name a shared memory region (and have no other data)."""
        for tensor in request.inputs:
            where = f"input '{tensor.name}'"
            placement = placement_of(tensor.parameters, where)
            if placement is None:
                continue
            if tensor.data is not None:
                raise InvalidRequest(
                    f"{where} must set only one of the following: its data ('data', 'binary_data_size', "
                    f"contents or a raw_input_contents entry) or '{REGION}'; it sets both"
                )
            self._require(SHARED_MEMORY)
            tensor.data = self.shared_memory.read(placement, tensor.datatype, tensor.shape, tensor.name)

    def _shared_memory_outputs(self, request: InferRequest) -> dict[str, Placement]:
        """Where the requested outputs that name a shared memory region go."""
        placements: dict[str, Placement] = {}
        for output in request.outputs:
            where = f"output '{output.name}'"
            placement = placement_of(output.parameters, where)
            if placement is None:
                continue
            if CLASSIFICATION in output.parameters:
                raise InvalidRequest(f"{where} can't set both '{REGION}' and '{CLASSIFICATION}'")
            self._require(SHARED_MEMORY)
            placements[output.name] = placement
        return placements

    def _write_shared_memory(
        self, response: InferResponse, placements: Mapping[str, Placement], regions: Mapping[str, Region]
    ) -> None:
        """Write the outputs that have a shared memory placement into their regions. As in Triton, such an output
        then has a name, datatype and shape and nothing else: no data, no parameters (Triton's C++ HTTP client
        takes any output parameters for binary data)."""
        for tensor in response.outputs:
            placement = placements.get(tensor.name)
            if placement is None or tensor.data is None:
                continue
            self.shared_memory.write(regions[tensor.name], placement, tensor.data, tensor.datatype, tensor.name)
            tensor.data = None
            tensor.parameters = {}

    def _require(self, extension: str) -> None:
        if extension not in self.enabled:
            raise Unimplemented(f"the {extension} extension is not enabled on this server")


async def _in_thread(model: Model, results: Iterator[Any]) -> AsyncIterator[Any]:
    """The items of a decoupled model's plain generator, each taken in a worker thread (its work may block)."""
    done = object()
    try:
        while True:
            try:
                item = await asyncio.to_thread(next, results, done)
            except Exception as exc:
                raise model_error(model, exc)  # noqa: B904 (its cause is set: the model's exception)
            if item is done:
                break
            yield item
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            # ValueError: still running in its thread (the stream was cancelled): the GC closes it.
            with contextlib.suppress(ValueError):
                await asyncio.to_thread(close)


async def _once(result: Any) -> AsyncIterator[Any]:
    """The one result of a decoupled model's `infer` that is no generator."""
    yield result
