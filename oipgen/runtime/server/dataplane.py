"""The data plane: every semantic rule of the protocol, once, for both transports.

The transports decode a request into the operation's protobuf message (inference: `types.InferRequest`, numpy
tensors), await the operation here and encode what it returns; every failure is an `OipError` whose kind
gives the REST status and the gRPC code. Inference validates the request against the model's declared tensors
before the model runs (known model and version, every declared input present once and no other, datatype
equal, same rank and every dimension equal unless declared -1, requested outputs known and not repeated), then
checks what the model returned (every needed output present, convertible without loss to its declared
datatype, shape as declared) and answers the outputs in the request's order, or the declared order when the
request names none.

A model that batches (`max_batch_size > 0`) declares shapes without the batch dimension: requests carry it first,
1 to max_batch_size and the same for every input, its outputs must too, and metadata reports [-1, *shape].
Inference runs in three timed phases, recorded in `statistics` (the statistics extension): preparing the
request (compute_input), the model (compute_infer; the wait for a worker thread before it counts as queue), and
checking and converting the outputs, classification included (compute_output). `prepare_infer`, `run_model` and
`finish_infer` are these phases, for a scheduler that runs several requests in one model call.

Also here: the model configuration extension (`model_config`, Triton's ModelConfig derived from the model's
declarations), the classification extension (the `classification` output parameter: the top k elements as
"<value>:<index>[:<label>]" BYTES, values written as C++ `std::to_string` writes them) and the reserved
parameter keys (`triton_*`, `classification`, `binary_data_output`).

Streaming (`model_stream_infer`, see `streaming`): the requests of a stream run concurrently; a model that is not
decoupled answers each with one response, in request order; a decoupled model (`Model.decoupled`, its `infer` a
generator) answers with any number of responses, each flagged `triton_final_response` as Triton flags them. A
decoupled model over ModelInfer or REST infer is UNIMPLEMENTED, as in Triton. Triton's generate extension
(`generate`, `generate_stream`; REST only): a flat JSON request read against the model's metadata (`generate`)
runs as a stream request does, and each response becomes a flat JSON answer; `generate` needs exactly one.
System shared memory (`shared_memory`): register, unregister and status of regions, inputs read from and outputs
written to them by tensor parameters.
Dynamic batching (`batching`): requests to a model that declares it share model calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .. import datatypes, extensions
from ..grpc import grpc_service_pb2 as pb
from ..grpc import model_config_pb2 as pb_config
from . import generate
from .batching import Batcher, is_batching
from .dataplane_base import DataPlaneBase
from .errors import InvalidRequest, ModelFailure, NotReady, OipError, Unimplemented
from .model import Model, TensorSpec
from .repository import ModelRepository
from .settings import Settings
from .shared_memory import REGION, Placement, Region, SharedMemory, placement_of
from .statistics import Statistics
from .streaming import EMPTY_FINAL, FINAL, Answer, final_response, serve_stream
from .types import InferRequest, InferResponse, RequestedOutput, Tensor

__all__ = [
    "CLASSIFICATION",
    "TRANSPORT_PARAMETERS",
    "UNSUPPORTED",
    "DataPlane",
    "PreparedRequest",
    "classify",
    "convert_output",
    "declared_shape",
    "model_config",
]

log = logging.getLogger(__name__)

# The spec's extensions (`extensions.EXTENSIONS`, Triton's names) this server never serves: it has no GPU stack.
# It serves every other one (system shared memory where the platform has POSIX shared memory); server metadata
# lists exactly those enabled, so clients such as perf_analyzer adapt.
CUDA_SHARED_MEMORY: Final = "cuda_shared_memory"
UNSUPPORTED: Final = frozenset({CUDA_SHARED_MEMORY})
SHARED_MEMORY: Final = "system_shared_memory"
BINARY_TENSOR_DATA: Final = "binary_tensor_data"
PARAMETERS: Final = "parameters"

# Request parameters that steer a transport (the binary tensor data extension), not the model: the model
# never sees them.
TRANSPORT_PARAMETERS: Final = frozenset({extensions.BINARY_DATA_OUTPUT})

# The classification extension: a requested output's parameter asking for its top k elements as class strings.
CLASSIFICATION: Final = extensions.CLASSIFICATION
# Triton ranks integer and float outputs that have a JSON form (not BOOL, FP16, BF16 or BYTES).
_CLASSIFIABLE: Final = frozenset(d.name for d in datatypes.DATATYPES if d.json and d.dtype.kind in "iuf")
_CLASSIFICATION_LIMIT: Final = 1_000_000  # elements of one output (Triton's limit)
# Request parameter keys starting with this are reserved (Triton's parameters extension), except these, which
# steer the server (the stream's empty final response) and never reach the model.
_RESERVED_PREFIX: Final = "triton_"
_RESERVED_ALLOWED: Final = frozenset({"triton_enable_empty_final_response"})

_SCALARS: Final = (bool, int, float, str)
_NO_CUDA: Final = (
    "CUDA shared memory is not supported: this server has no GPU stack (the cuda_shared_memory extension is not "
    "enabled); use system shared memory or send the tensor data in the request"
)


@dataclass(slots=True)
class PreparedRequest:
    """An inference request checked against its model, ready to run (`DataPlane.prepare_infer`)."""

    inputs: dict[str, npt.NDArray[Any]]  # by input name, in declared order, batch dimension first if batching
    outputs: list[TensorSpec]  # the outputs to answer, in answer order
    classification: dict[str, int]  # output name -> top k, for the outputs answered as classes
    parameters: dict[str, Any]  # what the model sees (transport and reserved keys removed)
    batch_size: int  # the first dimension of every input for a model that batches; 1 otherwise


class DataPlane(DataPlaneBase):
    """The operations of the protocol over a `ModelRepository`."""

    def __init__(self, repository: ModelRepository, settings: Settings | None = None) -> None:
        self.repository = repository
        self.settings = settings if settings is not None else Settings()
        self.shared_memory = SharedMemory()
        self.enabled: Final[tuple[str, ...]] = tuple(self._enabled(self.settings.extensions))
        self.settings.extensions = list(self.enabled)
        self.disable_extensions(self.enabled, reasons={CUDA_SHARED_MEMORY: _NO_CUDA})
        self.live = True  # the serving layer may turn it off while it shuts down
        self.statistics = Statistics()
        self.batcher = Batcher()

    @property
    def extensions(self) -> list[str]:
        return list(self.enabled)

    def _enabled(self, wanted: list[str] | None) -> list[str]:
        """The extensions to serve, in the spec's order: `wanted` (None: every one available). ValueError for a
        name the spec does not have or one this server cannot serve here."""
        available = [
            name for name in extensions.EXTENSIONS
            if name not in UNSUPPORTED and (name != SHARED_MEMORY or self.shared_memory.available)
        ]
        if wanted is None:
            return available
        for name in wanted:
            if name not in extensions.EXTENSIONS:
                raise ValueError(f"unknown extension {name!r}; the protocol's are {', '.join(extensions.EXTENSIONS)}")
            if name not in available:
                why = "no GPU stack" if name in UNSUPPORTED else "no POSIX shared memory on this host"
                raise ValueError(f"the {name} extension cannot be served here ({why})")
        return [name for name in available if name in wanted]

    def _require(self, extension: str) -> None:
        if extension not in self.enabled:
            raise Unimplemented(f"the {extension} extension is not enabled on this server")

    # --- health and metadata ----------------------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.live)

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.live and self.repository.ready())

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.repository.is_ready(request.name, request.version))

    async def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=self.settings.server_name, version=self.settings.server_version, extensions=self.extensions
        )

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        model = self.repository.get(request.name, request.version)
        versions = [request.version] if request.version else self.repository.ready_versions(request.name)
        response = pb.ModelMetadataResponse(
            name=model.name,
            versions=versions,
            platform=model.platform,
            inputs=[_tensor_metadata(model, spec) for spec in model.inputs],
            outputs=[_tensor_metadata(model, spec) for spec in model.outputs],
        )
        if model.properties:
            response.properties.update(model.properties)
        return response

    # --- inference --------------------------------------------------------------------------------------

    async def model_infer(self, request: InferRequest) -> InferResponse:
        start = time.perf_counter_ns()
        async with self.repository.lease(request.model_name, request.model_version) as model:
            if model.decoupled:
                raise Unimplemented(
                    f"model '{model.name}' is decoupled (it may answer a request with any number of responses): "
                    "ModelInfer and the REST infer endpoint do not support models with a decoupled transaction "
                    "policy; use the ModelStreamInfer gRPC stream"
                )
            stats = self.statistics.for_model(model.name, model.version)
            batched = is_batching(model)
            try:
                self._read_shared_memory(request)
                prepared = self.prepare_infer(model, request)
                placements = self._shared_memory_outputs(request)
                ready = time.perf_counter_ns()
                with self.shared_memory.using(placements) as regions:
                    if batched:
                        result, queued, run_start, run_end = await self.batcher.infer(
                            model, prepared.inputs, prepared.parameters, self.run_model, stats
                        )
                    else:
                        result, run_start, run_end = await self.run_model(model, prepared.inputs, prepared.parameters)
                        queued = run_start  # the wait for a worker thread is the queue
                    response = self.finish_infer(model, request, prepared, result)
                    _write_shared_memory(self.shared_memory, response, placements, regions)
            except Exception:
                stats.record_request(False, 1, 0, 0, 0, 0, time.perf_counter_ns() - start)
                raise
        end = time.perf_counter_ns()
        # A batch's merge of the inputs counts as compute_input; the wait for the batch to form, as queue.
        compute_input = ready - start + run_start - queued
        compute_infer, compute_output = run_end - run_start, end - run_end
        if not batched:  # the batcher records its executions, one per batch
            stats.record_execution(prepared.batch_size, compute_input, compute_infer, compute_output)
        stats.record_request(
            True, prepared.batch_size, queued - ready, compute_input, compute_infer, compute_output, end - start
        )
        return response

    def prepare_infer(self, model: Model, request: InferRequest) -> PreparedRequest:
        """Check `request` against `model` (InvalidRequest when it does not fit) and return what runs it."""
        inputs, batch_size = _check_inputs(model, request.inputs)
        wanted = _check_requested_outputs(model, [output.name for output in request.outputs])
        classification = _check_classification(model, request.outputs, CLASSIFICATION in self.enabled)
        parameters = _check_request_parameters(request.parameters)
        if parameters and PARAMETERS not in self.enabled:
            raise Unimplemented(
                f"the parameters extension is not enabled on this server: request parameters "
                f"({', '.join(sorted(parameters))}) cannot reach the model"
            )
        return PreparedRequest(inputs, wanted, classification, parameters, batch_size)

    async def run_model(
        self, model: Model, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]
    ) -> tuple[Any, int, int]:
        """Call `model.infer` (a plain method in a worker thread, a coroutine on the loop): what it returned, and
        when it started and ended (`time.perf_counter_ns`; the wait for a thread comes before the start). An
        exception of the model becomes ModelFailure with its message, logged with its traceback."""
        hook = model.infer
        try:
            if inspect.iscoroutinefunction(hook):
                started = time.perf_counter_ns()
                result = await hook(inputs, parameters)
            else:
                marks: list[int] = []

                def call() -> Any:
                    marks.append(time.perf_counter_ns())
                    return hook(inputs, parameters)

                result = await asyncio.to_thread(call)
                started = marks[0]
                if inspect.isawaitable(result):  # a plain method that returned an awaitable
                    result = await result
        except OipError:
            raise
        except Exception as exc:
            log.exception("model '%s' version %s failed", model.name, model.version)
            raise ModelFailure(str(exc) or type(exc).__name__) from exc
        return result, started, time.perf_counter_ns()

    def finish_infer(
        self, model: Model, request: InferRequest, prepared: PreparedRequest, result: Any
    ) -> InferResponse:
        """The response from what `infer` returned: outputs checked, converted to their declared datatypes and
        ordered, classification applied; ModelFailure when the model's answer does not fit its declarations."""
        outputs, response_parameters = _split_result(model, result)
        tensors: list[Tensor] = []
        for spec in prepared.outputs:
            tensor = _output(model, spec, outputs, prepared.batch_size)
            count = prepared.classification.get(spec.name)
            if count:
                tensor = classify(model, spec, tensor, count)
            tensors.append(tensor)
        return InferResponse(
            model_name=model.name,
            model_version=model.version,
            id=request.id,
            parameters=response_parameters,
            outputs=tensors,
        )

    def model_stream_infer(
        self, requests: AsyncIterator[InferRequest | Exception]
    ) -> AsyncIterator[InferResponse | Exception]:
        """The responses to a stream of requests (see `streaming`): one per request of a model that is not
        decoupled, in request order and flagged final; any number for a decoupled model, as it yields them; a
        failed request yields its error (a `streaming.StreamError`) and the stream goes on."""
        return serve_stream(requests, self._stream_answer)

    def _stream_answer(self, request: InferRequest) -> Answer:
        model = self.repository.get(request.model_name, request.model_version)
        if model.decoupled:
            return Answer(lambda: self._decoupled_infer(request), decoupled=True)
        return Answer(lambda: self._single_infer(request), decoupled=False)

    async def _single_infer(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        response = await self.model_infer(request)
        response.parameters[FINAL] = True
        yield response

    async def _decoupled_infer(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses of a decoupled model to one request, each flagged `triton_final_response: false`, then
        an empty final response if the request asked for it (`triton_enable_empty_final_response`)."""
        start = time.perf_counter_ns()
        empty_final = request.parameters.get(EMPTY_FINAL) is True
        async with self.repository.lease(request.model_name, request.model_version) as model:
            stats = self.statistics.for_model(model.name, model.version)
            infer_ns = output_ns = 0
            try:
                self._read_shared_memory(request)
                prepared = self.prepare_infer(model, request)
                placements = self._shared_memory_outputs(request)
                ready = mark = time.perf_counter_ns()
                with self.shared_memory.using(placements) as regions:
                    async for result in _model_results(self, model, prepared):
                        produced = time.perf_counter_ns()
                        response = self.finish_infer(model, request, prepared, result)
                        _write_shared_memory(self.shared_memory, response, placements, regions)
                        response.parameters[FINAL] = False
                        infer_ns += produced - mark
                        output_ns += time.perf_counter_ns() - produced
                        yield response
                        mark = time.perf_counter_ns()  # the time the transport took is not the model's
                    infer_ns += time.perf_counter_ns() - mark
            except Exception:
                stats.record_request(False, 1, 0, 0, 0, 0, time.perf_counter_ns() - start)
                raise
        stats.record_execution(prepared.batch_size, ready - start, infer_ns, output_ns)
        stats.record_request(
            True, prepared.batch_size, 0, ready - start, infer_ns, output_ns, time.perf_counter_ns() - start
        )
        if empty_final:
            yield final_response(request, model.version)

    # --- Triton's generate extension (REST only; see `generate`) -------------------------------------------

    async def generate(self, path: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """The one answer of the model to a generate request, as flat JSON; InvalidRequest when the model
        answers with no response or with several (a decoupled model: use `generate_stream`)."""
        answers = [answer async for answer in self._generate(path, body)]
        if len(answers) != 1:
            raise InvalidRequest(
                f"generate expects model to produce exactly 1 response, got {len(answers)}; use generate_stream "
                "for a model that answers with any number of responses"
            )
        return answers[0]

    def generate_stream(self, path: dict[str, str], body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Each response of the model to a generate request as flat JSON, as the model produces it (closing the
        iterator stops the model's generator)."""
        return self._generate(path, body)

    async def _generate(self, path: dict[str, str], body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        name, version = path.get("model_name", ""), path.get("model_version", "")
        model = self.repository.get(name, version)
        shapes = {spec.name: declared_shape(model, spec) for spec in model.inputs}
        request = generate.request(model, shapes, body, model_name=name, model_version=version,
                                   max_elements=self.settings.max_tensor_elements)
        responses = self._stream_answer(request).run()
        try:
            async for response in responses:
                yield generate.answer(response)
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()

    # --- shared memory of inference tensors ---------------------------------------------------------------

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

    # --- model configuration and statistics extensions ------------------------------------------------

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        model = self.repository.get(request.name, request.version)
        return pb.ModelConfigResponse(config=model_config(model, self.instances(model)))

    def instances(self, model: Model) -> int:
        """How many requests of `model` run at once: a plain `infer` runs in the worker threads
        (`Settings.model_threads`), a coroutine on the event loop, one at a time between its awaits."""
        return 1 if inspect.iscoroutinefunction(model.infer) else self.settings.model_threads

    async def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """Every ready model version (no name), every ready version of a model (no version), or one version.
        NotFound for an unknown model or version, NotReady for one that is not ready."""
        if not request.name:
            if request.version:
                raise InvalidRequest("statistics of a model version need the model's name")
            keys = [(status.name, status.version) for status in self.repository.index(ready_only=True)]
        elif request.version:
            model = self.repository.get(request.name, request.version)
            keys = [(model.name, model.version)]
        else:
            versions = self.repository.ready_versions(request.name)
            if not versions:
                raise NotReady(f"model '{request.name}' has no ready version")
            keys = [(request.name, version) for version in versions]
        return pb.ModelStatisticsResponse(
            model_stats=[self.statistics.to_proto(name, version) for name, version in keys]
        )

    # --- system shared memory extension (CUDA shared memory: never enabled, see UNSUPPORTED) -------------

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.shared_memory.status(request.name):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
            )
        return response

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    # --- model repository extension -------------------------------------------------------------------

    async def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        # `repository_name` is ignored, as Triton does: there is one repository.
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=status.name, version=status.version, state=status.state.value, reason=status.reason
                )
                for status in self.repository.index(ready_only=request.ready)
            ]
        )

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        _check_repository_request(request.repository_name, request.model_name)
        if request.parameters:
            raise Unimplemented(
                f"load parameters are not supported (got {', '.join(sorted(request.parameters))}): this server "
                "loads models as their folder defines them"
            )
        await self.repository.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        # Parameters (Triton's `unload_dependents`) are accepted and ignored: models have no dependents here.
        _check_repository_request(request.repository_name, request.model_name)
        await self.repository.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _write_shared_memory(
    shared_memory: SharedMemory, response: InferResponse, placements: Mapping[str, Placement],
    regions: Mapping[str, Region],
) -> None:
    """Write the outputs that have a shared memory placement into their regions. As in Triton, such an output
    then has a name, datatype and shape and nothing else: no data, no parameters (Triton's C++ HTTP client takes
    any output parameters for binary data)."""
    if not placements:
        return
    for tensor in response.outputs:
        placement = placements.get(tensor.name)
        if placement is None or tensor.data is None:
            continue
        shared_memory.write(regions[tensor.name], placement, tensor.data, tensor.datatype, tensor.name)
        tensor.data = None
        tensor.parameters = {}


async def _model_results(dataplane: DataPlane, model: Model, prepared: PreparedRequest) -> AsyncIterator[Any]:
    """What a decoupled model answers one request with: each item its async or plain generator yields (a plain
    generator advances in a worker thread), or the one result of an `infer` that is no generator. An exception
    of the model becomes ModelFailure with its message, logged with its traceback."""
    hook = model.infer
    if inspect.isasyncgenfunction(hook):
        results: Any = hook(prepared.inputs, prepared.parameters)
    else:
        results, _, _ = await dataplane.run_model(model, prepared.inputs, prepared.parameters)
    if isinstance(results, AsyncIterator):
        try:
            while True:
                try:
                    item = await anext(results)
                except StopAsyncIteration:
                    break
                except OipError:
                    raise
                except Exception as exc:
                    log.exception("model '%s' version %s failed", model.name, model.version)
                    raise ModelFailure(str(exc) or type(exc).__name__) from exc
                yield item
        finally:
            aclose = getattr(results, "aclose", None)
            if aclose is not None:
                await aclose()
    elif isinstance(results, Iterator) and not isinstance(results, Mapping):
        done = object()
        try:
            while True:
                try:
                    item = await asyncio.to_thread(next, results, done)
                except OipError:
                    raise
                except Exception as exc:
                    log.exception("model '%s' version %s failed", model.name, model.version)
                    raise ModelFailure(str(exc) or type(exc).__name__) from exc
                if item is done:
                    break
                yield item
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                # ValueError: still running in its thread (the stream was cancelled): the GC closes it.
                with contextlib.suppress(ValueError):
                    await asyncio.to_thread(close)
    else:
        yield results


def _check_repository_request(repository_name: str, model_name: str) -> None:
    if repository_name:
        raise Unimplemented("'repository_name' specification is not supported")
    if not model_name:
        raise InvalidRequest("model_name is required")


def declared_shape(model: Model, spec: TensorSpec) -> tuple[int, ...]:
    """The shape a request or response tensor must have: the declared one, after a -1 batch dimension when the
    model batches."""
    return (-1, *spec.shape) if model.max_batch_size > 0 else spec.shape


def _matches(declared: Sequence[int], shape: Sequence[int]) -> bool:
    if len(shape) != len(declared):
        return False
    return all(d == -1 or d == s for d, s in zip(declared, shape, strict=True))


def _tensor_metadata(model: Model, spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=declared_shape(model, spec)
    )


def model_config(model: Model, instances: int = 1) -> pb_config.ModelConfig:
    """Triton's model configuration of `model`, from its declarations. Tensor `dims` exclude the batch dimension
    of a model that batches (as declared); every declared version is served (`version_policy: all`); the model
    runs through the Python model API (`backend: python`) as `instances` CPU instances (`DataPlane.instances`)."""
    config = pb_config.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend="python",
        version_policy=pb_config.ModelVersionPolicy(all=pb_config.ModelVersionPolicy.All()),
        max_batch_size=model.max_batch_size,
        input=[
            pb_config.ModelInput(name=spec.name, data_type=_config_type(spec), dims=spec.shape)
            for spec in model.inputs
        ],
        output=[
            pb_config.ModelOutput(name=spec.name, data_type=_config_type(spec), dims=spec.shape)
            for spec in model.outputs
        ],
        instance_group=[
            pb_config.ModelInstanceGroup(
                name=f"{model.name}_0", kind=pb_config.ModelInstanceGroup.Kind.KIND_CPU, count=instances
            )
        ],
        model_transaction_policy=pb_config.ModelTransactionPolicy(decoupled=model.decoupled),
    )
    batching = model.dynamic_batching
    if batching is not None:
        config.dynamic_batching.CopyFrom(
            pb_config.ModelDynamicBatching(
                preferred_batch_size=batching.preferred_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
            )
        )
    return config


def _config_type(spec: TensorSpec) -> str:
    """The `inference.DataType` value name of the tensor's datatype ("TYPE_FP32"; BYTES is "TYPE_STRING")."""
    return datatypes.BY_NAME[spec.datatype].model_config


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _check_inputs(model: Model, tensors: Sequence[Tensor]) -> tuple[dict[str, npt.NDArray[Any]], int]:
    """The request's inputs as arrays by name, in declared order, and the batch size (1 for a model that does not
    batch); InvalidRequest unless they match."""
    given: dict[str, Tensor] = {}
    for item in tensors:
        if item.name in given:
            raise InvalidRequest(f"input '{item.name}' appears more than once in the request")
        given[item.name] = item
    declared = {spec.name: spec for spec in model.inputs}
    for name in given:
        if name not in declared:
            raise InvalidRequest(f"unexpected inference input '{name}' for model '{model.name}'")
    arrays: dict[str, npt.NDArray[Any]] = {}
    batching = model.max_batch_size > 0
    batch: tuple[str, int] | None = None  # the first input's name and batch size
    for spec in model.inputs:
        tensor = given.get(spec.name)
        if tensor is None:
            raise InvalidRequest(f"missing input '{spec.name}' for model '{model.name}'")
        if tensor.datatype != spec.datatype:
            raise InvalidRequest(
                f"inference input '{spec.name}' data-type is '{tensor.datatype}', but model '{model.name}' "
                f"expects '{spec.datatype}'"
            )
        shape = tensor.shape
        if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in shape):
            raise InvalidRequest(f"input '{spec.name}': shape {_shape_text(shape)} is invalid")
        expected = declared_shape(model, spec)
        if not _matches(expected, shape):
            raise InvalidRequest(
                f"unexpected shape for input '{spec.name}' for model '{model.name}'. Expected "
                f"{_shape_text(expected)}, got {_shape_text(shape)}"
            )
        if batching:
            size = int(shape[0])
            if size > model.max_batch_size:
                raise InvalidRequest(
                    f"inference request batch-size must be <= {model.max_batch_size} for '{model.name}' "
                    f"(input '{spec.name}' has {size})"
                )
            if size < 1:
                raise InvalidRequest(
                    f"inference request batch-size must be >= 1 for '{model.name}' (input '{spec.name}')"
                )
            if batch is None:
                batch = (spec.name, size)
            elif size != batch[1]:
                raise InvalidRequest(
                    f"input '{spec.name}' has batch size {size} but input '{batch[0]}' has {batch[1]}: every input "
                    f"of model '{model.name}' must have the same batch size"
                )
        arrays[spec.name] = _input_array(spec, tensor)
    return arrays, batch[1] if batch is not None else 1


def _input_array(spec: TensorSpec, tensor: Tensor) -> npt.NDArray[Any]:
    data = tensor.data
    if data is None:
        raise InvalidRequest(f"input '{spec.name}' has no data")
    dims = tuple(int(d) for d in tensor.shape)
    if data.shape != dims:
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if data.size != count:
            raise InvalidRequest(
                f"input '{spec.name}': shape {_shape_text(dims)} needs {count} elements, the data has {data.size}"
            )
        data = data.reshape(dims)
    info = datatypes.BY_NAME[spec.datatype]
    if data.dtype != info.dtype and not (info.variable and data.dtype.kind == "O"):
        try:
            data = convert_output(data, spec.datatype)
        except ValueError as exc:
            raise InvalidRequest(f"input '{spec.name}': {exc}") from exc
    return data


def _check_requested_outputs(model: Model, names: Sequence[str]) -> list[TensorSpec]:
    """The outputs to answer, in answer order; InvalidRequest for unknown or repeated names."""
    if not names:
        return list(model.outputs)
    declared = {spec.name: spec for spec in model.outputs}
    wanted: list[TensorSpec] = []
    seen: set[str] = set()
    for name in names:
        spec = declared.get(name)
        if spec is None:
            raise InvalidRequest(f"unexpected inference output '{name}' for model '{model.name}'")
        if name in seen:
            raise InvalidRequest(f"output '{name}' appears more than once in the request")
        seen.add(name)
        wanted.append(spec)
    return wanted


def _check_classification(model: Model, outputs: Sequence[RequestedOutput], enabled: bool) -> dict[str, int]:
    """Output name -> top k for the requested outputs whose `classification` parameter asks for classes (an
    integer; 0 means no classification). InvalidRequest for a wrong value or an output datatype without an order
    (BOOL, FP16, BF16, BYTES); Unimplemented when the extension is disabled."""
    counts: dict[str, int] = {}
    declared = {spec.name: spec for spec in model.outputs}
    for output in outputs:
        if CLASSIFICATION not in output.parameters:
            continue
        value = output.parameters[CLASSIFICATION]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(
                f"invalid value type for 'classification' parameter of output '{output.name}', expected an integer, "
                f"got {value!r}"
            )
        if value < 0:
            raise InvalidRequest(
                f"invalid value for 'classification' parameter of output '{output.name}', expected >= 0, got {value}"
            )
        if value == 0:
            continue
        if not enabled:
            raise Unimplemented("the classification extension is not enabled on this server")
        if REGION in output.parameters:
            raise InvalidRequest(f"output '{output.name}': classification cannot be written to shared memory")
        spec = declared[output.name]
        if spec.datatype not in _CLASSIFIABLE:
            raise InvalidRequest(
                f"class result not available for output '{spec.name}' due to unsupported type '{spec.datatype}'"
            )
        counts[output.name] = value
    return counts


def classify(model: Model, spec: TensorSpec, tensor: Tensor, count: int) -> Tensor:
    """The classification of an output: per batch item (the whole tensor for a model that does not batch) the
    `count` largest elements, largest first (ties: lowest index first), as BYTES "<value>:<index>[:<label>]";
    shape [batch, k] or [k], k = min(count, elements per item). Values are written as C++ `std::to_string`
    writes them, as Triton does: integers as integers, floats with six decimals ("3.300000")."""
    data = tensor.data
    assert data is not None
    if data.size > _CLASSIFICATION_LIMIT:
        raise InvalidRequest(
            f"classification output tensor too large: output '{spec.name}' has {data.size} elements, more than "
            f"{_CLASSIFICATION_LIMIT}"
        )
    batching = model.max_batch_size > 0
    rows = data.reshape(data.shape[0], -1) if batching else data.reshape(1, -1)
    width = rows.shape[1]
    k = min(count, width)
    floating = data.dtype.kind == "f"
    labels = spec.labels
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        row = rows[r]
        # Descending by value, ties by ascending index: a stable ascending sort of the reversed row, reversed.
        top = (width - 1) - np.argsort(row[::-1], kind="stable")[::-1][:k]
        for j, index in enumerate(top.tolist()):
            value = row[index]
            text = f"{float(value):f}" if floating else str(int(value))
            label = labels[index] if index < len(labels) else ""
            out[r, j] = (f"{text}:{index}:{label}" if label else f"{text}:{index}").encode()
    shape = [rows.shape[0], k] if batching else [k]
    return Tensor(name=spec.name, datatype="BYTES", shape=shape, data=out.reshape(shape))


def _check_request_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters the model sees: transport keys and the allowed reserved keys removed; InvalidRequest for
    any other `triton_*` key, a reserved key of the wrong type or a value that is not a scalar."""
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if key in TRANSPORT_PARAMETERS or key in _RESERVED_ALLOWED:
            if not isinstance(value, bool):
                raise InvalidRequest(f"invalid value type for '{key}' parameter, expected a boolean, got {value!r}")
            continue
        if key.startswith(_RESERVED_PREFIX):
            raise InvalidRequest(
                f"parameter keys starting with '{_RESERVED_PREFIX}' are reserved for Triton usage and should not be "
                f"specified (got '{key}')"
            )
        if not isinstance(value, _SCALARS):
            raise InvalidRequest(f"parameter '{key}' has invalid type: parameters are booleans, numbers or strings")
        out[key] = value
    return out


def _split_result(model: Model, result: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """(outputs, response parameters) of what `infer` returned; ModelFailure when it is neither form."""
    parameters: Any = {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Mapping):
        result, parameters = result
    if not isinstance(result, Mapping):
        raise ModelFailure(
            f"model '{model.name}' returned {type(result).__name__} from infer(), not a mapping of output names to "
            "arrays"
        )
    if not isinstance(parameters, Mapping):
        raise ModelFailure(f"model '{model.name}' returned response parameters of type {type(parameters).__name__}")
    checked: dict[str, Any] = {}
    for key, value in parameters.items():
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(key, str) or not isinstance(value, _SCALARS):
            raise ModelFailure(
                f"model '{model.name}' returned response parameter {key!r} = {value!r}: parameters are booleans, "
                "numbers or strings"
            )
        checked[key] = value
    return result, checked


def _output(model: Model, spec: TensorSpec, outputs: Mapping[str, Any], batch_size: int = 1) -> Tensor:
    if spec.name not in outputs:
        raise ModelFailure(f"model '{model.name}' did not return output '{spec.name}'")
    value = outputs[spec.name]
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        array = convert_output(array, spec.datatype)
    except (ValueError, TypeError) as exc:
        raise ModelFailure(f"model '{model.name}' output '{spec.name}': {exc}") from exc
    expected = declared_shape(model, spec)
    if not _matches(expected, array.shape) or (model.max_batch_size > 0 and array.shape[0] != batch_size):
        batch = f" for a batch of {batch_size}" if model.max_batch_size > 0 else ""
        raise ModelFailure(
            f"model '{model.name}' output '{spec.name}' has shape {_shape_text(array.shape)}, but the model "
            f"declares {_shape_text(expected)}{batch}"
        )
    return Tensor(name=spec.name, datatype=spec.datatype, shape=list(array.shape), data=array)


def _family(dtype: np.dtype[Any]) -> str | None:
    name = datatypes.name_of_dtype(dtype)
    if name is None:
        return None
    info = datatypes.BY_NAME[name]
    if info.variable:
        return "bytes"
    if dtype.kind == "b":
        return "bool"
    return "int" if dtype.kind in "iu" else "float"


def convert_output(array: npt.NDArray[Any], datatype: str) -> npt.NDArray[Any]:
    """`array` in the numpy dtype of `datatype`, converted only where no value changes meaning.

    Same type in any byte order, safe casts (bool to numbers, narrower to wider), integers to other integers
    when every value fits, integers and floats to floats (floats are rounded to the nearest value; overflow to
    infinity fails), floats to integers when every value is a whole number that fits. BYTES: object arrays of
    `bytes` (str elements are encoded as UTF-8), `S` and `U` arrays. ValueError otherwise.
    """
    info = datatypes.BY_NAME[datatype]
    target = info.dtype
    if info.variable:
        return _bytes_array(array)
    if array.dtype == target:
        return array
    source = _family(array.dtype)
    family = _family(target)
    if source is None or source == "bytes":
        raise ValueError(f"a {array.dtype} array cannot be {datatype}")
    if datatypes.name_of_dtype(array.dtype) == datatype or np.can_cast(array.dtype, target, "safe"):
        return array.astype(target)
    if family == "int" and source in ("int", "float", "bool"):
        if source == "float" and array.size and not bool(np.all(np.isfinite(array) & (array == np.trunc(array)))):
            raise ValueError(f"{array.dtype} values that are not whole numbers cannot be {datatype}")
        if array.size:
            limits = np.iinfo(target)
            low, high = array.min(), array.max()
            # Floats compare against the first value past the range: float(2**63 - 1) rounds up to 2**63.
            too_high = high >= float(limits.max) + 1 if source == "float" else high > limits.max
            if low < limits.min or too_high:
                raise ValueError(f"values out of range for {datatype} [{limits.min}, {limits.max}]")
        return array.astype(target)
    if family == "float" and source in ("int", "float", "bool"):
        with np.errstate(over="ignore", invalid="ignore"):
            out = array.astype(target)
        if source == "float" and array.size:
            wide = array.astype(np.float64)
            if bool(np.any(np.isfinite(wide) & ~np.isfinite(out.astype(np.float64)))):
                raise ValueError(f"values out of range for {datatype}")
        return out
    if family == "bool" and source in ("int", "float"):
        if array.size and not bool(np.all((array == 0) | (array == 1))):
            raise ValueError(f"{array.dtype} values other than 0 and 1 cannot be {datatype}")
        return array.astype(target)
    raise ValueError(f"a {array.dtype} array cannot be {datatype}")


def _bytes_array(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """An object array of `bytes` (the same array when it already is one)."""
    if array.dtype.kind not in "OSU":
        raise ValueError(f"a {array.dtype} array cannot be BYTES (an array of bytes or str)")
    items: list[Any] = array.reshape(-1).tolist()
    if array.dtype.kind == "O" and all(type(item) is bytes for item in items):
        return array
    converted: list[bytes] = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):
            converted.append(bytes(item))
        elif isinstance(item, str):
            try:
                converted.append(item.encode())
            except UnicodeEncodeError as exc:
                raise ValueError(f"BYTES element {i} is not valid Unicode") from exc
        elif isinstance(item, bytearray | memoryview):
            converted.append(bytes(item))
        else:
            raise ValueError(f"BYTES element {i} is {type(item).__name__}, not bytes or str")
    out = np.empty(len(converted), dtype=object)
    out[:] = converted
    return out.reshape(array.shape)
