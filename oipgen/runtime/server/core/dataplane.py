"""The data plane: every semantic rule of the protocol, once, for both transports.

The transports decode a request into the operation's protobuf message (inference: `types.InferRequest`, numpy
tensors), await the operation here and encode what it returns; every failure is an `OipError` whose kind
gives the REST status and the gRPC code.

The concerns live in their own modules; this one holds the operations:
- inference (`model_infer`, `model_stream_infer`): one pipeline, prepare -> schedule or batch -> run -> finish,
  with one timer whose records feed the statistics extension and any other observer (`pipeline`, `accounting`,
  `observe.events`); the checks of requests and answers against the model's declarations are in `validation`,
  the classification extension in `classification`, dynamic batching in `batching`, streams in `streaming`;
- Triton's generate extension (`generate`, `generate_stream`; REST only): a flat JSON request read against the
  model's declarations (`generate`) runs as a stream's request does, each response becomes a flat JSON answer;
  `generate` needs exactly one;
- health and metadata; the model configuration extension (`configuration`, Triton's ModelConfig derived from the
  model's declarations); statistics (`observe.statistics`); system shared memory (`shared_memory`: register, unregister
  and status of regions; inference reads inputs from and writes outputs to them); the model repository
  (`repository`: index, load, unload; load and unload requests as the model control mode allows, `model_control`).

A server may serve a subclass of `DataPlane` (`serve --dataplane module:Class`, `serve(..., dataplane=Class)`):
one that implements an operation the spec adds (its method is named as in `DataPlaneBase`), or changes one. It is
made with `DataPlane`'s arguments, for every transport and every worker.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any, Final

from ... import extensions
from ...grpc import grpc_service_pb2 as pb
from ..errors import InvalidRequest, NotReady, Unimplemented
from ..model import Model, TensorSpec
from ..observe.metrics import Metric
from ..observe.observing import Observing
from ..settings import Settings
from ..types import InferRequest, InferResponse
from . import generate, model_control
from .classification import CLASSIFICATION
from .configuration import model_config
from .dataplane_base import DataPlaneBase
from .pipeline import PARAMETERS, SHARED_MEMORY, Pipeline
from .repository import ModelRepository
from .shared_memory import SharedMemory
from .validation import declared_shape

__all__ = ["CLASSIFICATION", "PARAMETERS", "SHARED_MEMORY", "UNSUPPORTED", "DataPlane"]

# The spec's extensions (`extensions.EXTENSIONS`, Triton's names) this server never serves: it has no GPU stack.
# It serves every other one (system shared memory where the platform has POSIX shared memory); server metadata
# lists exactly those enabled, so clients such as perf_analyzer adapt.
CUDA_SHARED_MEMORY: Final = "cuda_shared_memory"
UNSUPPORTED: Final = frozenset({CUDA_SHARED_MEMORY})

_NO_CUDA: Final = (
    "CUDA shared memory is not supported: this server has no GPU stack (the cuda_shared_memory extension is not "
    "enabled); use system shared memory or send the tensor data in the request"
)


class DataPlane(DataPlaneBase):
    """The operations of the protocol over a `ModelRepository`.

    `observing` (default: what `settings` asks for, without tracing) says what observes inference: `observers` are
    told about every inference request and model run (`observe.events.Observer`); the statistics extension
    (`statistics`) is the first, `metrics` (None: off) and `tracing` (None: off) follow. Append to `observers` to
    add one."""

    def __init__(self, repository: ModelRepository, settings: Settings | None = None,
                 observing: Observing | None = None) -> None:
        self.repository = repository
        self.settings = settings if settings is not None else Settings()
        self.shared_memory = SharedMemory(
            enabled=self.settings.shared_memory != "off",
            prefix=self.settings.shared_memory_prefix,
            max_regions=self.settings.shared_memory_max_regions,
            max_bytes=self.settings.shared_memory_max_bytes,
        )
        # The extensions served: `Settings.extensions` (None: every one this server can serve here).
        self.enabled: Final[tuple[str, ...]] = tuple(self._enabled(self.settings.extensions))
        self.disable_extensions(self.enabled, reasons={CUDA_SHARED_MEMORY: _NO_CUDA})
        self.live = True  # the serving layer may turn it off while it shuts down
        self.stopping = False  # set at SIGTERM for `Settings.shutdown_delay_seconds`: serving, but not ready
        if observing is None:  # what the settings ask for, without tracing (the composition root configures it)
            observing = Observing.of(self.settings, repository.inflight)
        self.statistics = observing.statistics
        self.metrics = observing.metrics
        self.tracing = observing.tracing
        self.observers = observing.observers
        self.pipeline = Pipeline(self.repository, self.settings, self.shared_memory, self.enabled, self.observers)

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
                why = ("no GPU stack" if name in UNSUPPORTED
                       else "--shared-memory off" if not self.shared_memory.enabled
                       else "no POSIX shared memory on this host")
                raise ValueError(f"the {name} extension cannot be served here ({why})")
        return [name for name in available if name in wanted]

    # --- health and metadata ----------------------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.live)

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        """Live, not stopping, and (`Settings.strict_readiness`, as Triton's) every model asked to load is ready."""
        strict = self.settings.strict_readiness
        ready = self.live and not self.stopping and (not strict or self.repository.ready())
        return pb.ServerReadyResponse(ready=ready)

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        """Whether the model (version) is ready; NotReady naming the model and the reason when its load failed."""
        ready = self.repository.is_ready(request.name, request.version)
        if not ready:
            failed = self.repository.failure(request.name, request.version)
            if failed:
                raise NotReady(failed)
        return pb.ModelReadyResponse(ready=ready)

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

    # --- inference (see `pipeline`) ---------------------------------------------------------------------

    async def model_infer(self, request: InferRequest) -> InferResponse:
        return await self.pipeline.infer(request)

    def model_stream_infer(
        self, requests: AsyncIterator[InferRequest | Exception]
    ) -> AsyncIterator[InferResponse | Exception]:
        """The responses to a stream of requests (see `streaming`): one per request of a model that is not
        decoupled, in request order and flagged final; any number for a decoupled model, as it yields them; a
        failed request yields its error (a `streaming.StreamError`) and the stream goes on."""
        return self.pipeline.stream(requests)

    # --- Triton's generate extension (REST only; see `generate`) -------------------------------------------

    async def generate(self, path: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """The one answer of the model to a generate request, as flat JSON; InvalidRequest when the model
        answers with no response or with several (a decoupled model: use `generate_stream`)."""
        model, request = self._generate_request(path, body)
        if not model.decoupled:  # one response, as `infer` answers it
            return generate.answer(await self.pipeline.infer(request))
        answers = [answer async for answer in self._generate(request)]
        if len(answers) != 1:
            raise InvalidRequest(
                f"generate expects model to produce exactly 1 response, got {len(answers)}; use generate_stream "
                "for a model that answers with any number of responses"
            )
        return answers[0]

    def generate_stream(self, path: dict[str, str], body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Each response of the model to a generate request as flat JSON, as the model produces it (closing the
        iterator stops the model's generator)."""
        return self._generate(self._generate_request(path, body)[1])

    def _generate_request(self, path: dict[str, str], body: dict[str, Any]) -> tuple[Model, InferRequest]:
        name, version = path.get("model_name", ""), path.get("model_version", "")
        model = self.repository.get(name, version)
        shapes = {spec.name: declared_shape(model, spec) for spec in model.inputs}
        return model, generate.request(model, shapes, body, model_name=name, model_version=version,
                                       max_elements=self.settings.max_tensor_elements)

    async def _generate(self, request: InferRequest) -> AsyncIterator[dict[str, Any]]:
        responses = self.pipeline.answer(request).run()
        try:
            async for response in responses:
                yield generate.answer(response)
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()

    # --- metrics ------------------------------------------------------------------------------------------

    async def metric_families(self) -> list[Metric]:
        """Every metric of the server (`metrics`); none when metrics are off."""
        return self.metrics.families() if self.metrics is not None else []

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
        self.observers.settled()  # every request answered so far is counted
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
        """Every model folder of the repository as it is now, loaded or not, and every model added from Python,
        with their states. `repository_name` is ignored, as Triton does: there is one repository."""
        await self.repository.scan()
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
        model_control.refuse_requests(self.settings)
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
        model_control.refuse_requests(self.settings)
        await self.repository.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _check_repository_request(repository_name: str, model_name: str) -> None:
    if repository_name:
        raise Unimplemented("'repository_name' specification is not supported")
    if not model_name:
        raise InvalidRequest("model_name is required")


def _tensor_metadata(model: Model, spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=declared_shape(model, spec)
    )

