"""Several worker processes serving as one server (`serve --workers N`): control-plane state reaches every worker.

Workers share the REST and gRPC ports (SO_REUSEPORT: the kernel spreads connections over them), so any request
may reach any worker. Inference needs no coordination; the control plane does:

- Repository load and unload, and system shared memory register and unregister, run in the worker that got the
  request and then in every other worker, before the answer is sent. A region registered over one connection
  can be used over any other, and a model unloaded is unloaded everywhere.
- Statistics and metrics answer the sum over the workers.
- A worker restarted after a crash copies the others' state (loaded and unloaded models, registered regions)
  before it listens.
- In poll mode (`--model-control-mode poll`) worker 0 alone keeps the time: at each poll it reads the repository
  and applies the changes, then has every other worker do the same (`sync_everywhere`), each against its own
  models, so every worker ends the poll with the models of the repository as it is.
- A data plane of one's own (`serve --dataplane`) serves in every worker: `cluster_dataplane` makes the class
  that adds this to it.

Workers reach each other over Unix sockets in a private folder made by the supervisor (`supervisor`), one per
worker (`worker-<i>.sock`), with `multiprocessing.connection` and a key only the supervisor and its workers know
(authenticated with HMAC; the folder is mode 0700 too). A peer call names a data plane operation and carries its
protobuf request; the peer runs the operation on its own data plane only, never forwarding it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, Final

from google.protobuf.message import Message

from ...grpc import grpc_service_pb2 as pb
from ..core.dataplane import DataPlane
from ..core.repository import ModelRepository
from ..errors import ErrorKind, OipError
from ..observe.metrics import Metric, from_json, merge, to_json
from ..observe.observing import Observing
from ..settings import Settings

__all__ = ["ClusterDataPlane", "ControlServer", "Peers", "WorkerRole", "cluster_dataplane", "merge_statistics",
           "socket_path"]

log = logging.getLogger(__name__)

_PEER_TIMEOUT: Final = 120.0  # one peer operation (a model load may take a while)

# The operations a peer may be asked to run, with their request and response messages.
_OPERATIONS: Final[dict[str, tuple[type[Message], type[Message]]]] = {
    "repository_model_load": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "repository_model_unload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    "system_shared_memory_register": (pb.SystemSharedMemoryRegisterRequest, pb.SystemSharedMemoryRegisterResponse),
    "system_shared_memory_unregister": (
        pb.SystemSharedMemoryUnregisterRequest, pb.SystemSharedMemoryUnregisterResponse
    ),
    "system_shared_memory_status": (pb.SystemSharedMemoryStatusRequest, pb.SystemSharedMemoryStatusResponse),
    "model_statistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "repository_index": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "repository_sync": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),  # a poll (`_SYNC`)
}
# The operation of poll mode: read the repository and apply its changes (no data plane operation: load and
# unload requests are refused in poll mode); the answer is the worker's index after it.
_SYNC: Final = "repository_sync"


# Operations whose answer is not a protobuf message: the worker's metric families, as JSON.
_METRICS: Final = "metric_families"


@dataclass(frozen=True)
class WorkerRole:
    """What makes a server process one worker of several."""

    index: int
    folder: Path  # the control sockets and ready files of all workers
    key: bytes  # authenticates calls between workers
    copy_state: bool  # restarted: take the control-plane state of a running worker before listening


def socket_path(folder: Path, index: int) -> Path:
    """The control socket of worker `index`."""
    return folder / f"worker-{index}.sock"


class PeerError(Exception):
    """A peer could not be reached (it is down or restarting)."""


class Peers:
    """The other workers of this server, as seen from worker `index`."""

    def __init__(self, folder: Path, index: int, key: bytes) -> None:
        self.folder = folder
        self.index = index
        self.key = key

    def sockets(self) -> list[Path]:
        """The control sockets of the other workers that are up (a restarting worker has none yet)."""
        own = socket_path(self.folder, self.index)
        return sorted(p for p in self.folder.glob("worker-*.sock") if p != own)

    def _call(self, path: Path, operation: str, request: Message) -> Any:
        try:
            conn = Client(str(path), family="AF_UNIX", authkey=self.key)
        except (OSError, EOFError) as exc:  # EOFError: it went away during the handshake
            raise PeerError(f"{path.name}: {exc}") from None
        with conn:
            try:
                conn.send_bytes(operation.encode() + b"\0" + request.SerializeToString())
                if not conn.poll(_PEER_TIMEOUT):
                    raise PeerError(f"{path.name}: no answer within {_PEER_TIMEOUT:.0f}s")
                answer = conn.recv_bytes()
            except (OSError, EOFError) as exc:
                raise PeerError(f"{path.name}: {exc}") from None
        status, _, body = answer.partition(b"\0")
        if status == b"ok":
            return json.loads(body) if operation == _METRICS else _OPERATIONS[operation][1].FromString(body)
        kind, _, message = body.decode("utf-8", "replace").partition("\0")
        try:
            error_kind = ErrorKind(kind)
        except ValueError:
            error_kind = ErrorKind.MODEL_FAILURE
        raise OipError(message, error_kind)

    async def call_all(self, operation: str, request: Message) -> list[Any]:
        """Run `operation` on every other worker that is up, together; their answers. A worker that is down is
        skipped (it copies the state when it comes back); an OipError of a peer is raised after all answered."""
        paths = self.sockets()
        results = await asyncio.gather(
            *(asyncio.to_thread(self._call, path, operation, request) for path in paths), return_exceptions=True
        )
        answers: list[Any] = []
        failure: BaseException | None = None
        for path, result in zip(paths, results, strict=True):
            if isinstance(result, PeerError):
                log.warning("worker %s skipped for %s: %s", path.name, operation, result)
            elif isinstance(result, BaseException):
                failure = failure or result
            else:
                answers.append(result)
        if failure is not None:
            raise failure
        return answers

    async def call_any(self, operation: str, request: Message) -> Message | None:
        """`operation` on the first other worker that answers; None when none is up."""
        for path in self.sockets():
            try:
                return await asyncio.to_thread(self._call, path, operation, request)
            except PeerError as exc:
                log.debug("worker %s did not answer %s: %s", path.name, operation, exc)
        return None


class ClusterDataPlane(DataPlane):
    """The data plane of one worker among several: control operations reach every worker before they answer,
    statistics sum over the workers. Inference and everything else is the worker's own."""

    def __init__(self, repository: ModelRepository, settings: Settings, peers: Peers,
                 observing: Observing | None = None) -> None:
        super().__init__(repository, settings, observing)
        self.peers = peers

    def local(self, operation: str) -> Callable[[Any], Coroutine[Any, Any, Message]]:
        """The operation as this worker alone runs it (what a peer asks for): the data plane's own (a subclass's,
        `cluster_dataplane`, when it has one)."""
        if operation == _SYNC:
            return self._sync_here
        method: Callable[[Any], Coroutine[Any, Any, Message]] = getattr(super(), operation)
        return method

    async def sync_everywhere(self) -> list[str]:
        """A poll of the repository in this worker, then in every other one (`ModelRepository.sync`); what
        changed here, one line per model."""
        done = await self.repository.sync()
        await self.peers.call_all(_SYNC, pb.RepositoryIndexRequest())
        return done

    async def _sync_here(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        for change in await self.repository.sync():
            log.info("repository poll: %s", change)
        return await DataPlane.repository_index(self, request)

    async def _everywhere(self, operation: str, request: Any) -> Any:
        answer = await self.local(operation)(request)
        await self.peers.call_all(operation, request)
        return answer

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        return await self._everywhere("repository_model_load", request)  # type: ignore[no-any-return]

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        return await self._everywhere("repository_model_unload", request)  # type: ignore[no-any-return]

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        return await self._everywhere("system_shared_memory_register", request)  # type: ignore[no-any-return]

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        return await self._everywhere("system_shared_memory_unregister", request)  # type: ignore[no-any-return]

    async def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        own = await super().model_statistics(request)
        others = await self.peers.call_all("model_statistics", request)
        return merge_statistics([own, *(o for o in others if isinstance(o, pb.ModelStatisticsResponse))])

    async def metric_families(self) -> list[Metric]:
        own = await super().metric_families()
        if self.metrics is None:
            return own
        others = await self.peers.call_all(_METRICS, pb.ServerLiveRequest())
        return merge([own, *([from_json(doc) for doc in answer] for answer in others)])

    async def copy_state_from_peers(self) -> None:
        """Make this (restarted) worker's models and regions those of a running worker."""
        index = await self.peers.call_any("repository_index", pb.RepositoryIndexRequest())
        if not isinstance(index, pb.RepositoryIndexResponse):
            return
        ready = {m.name for m in index.models if m.state == "READY"}
        known = {m.name for m in index.models}
        for name in sorted(known):
            mine = bool(self.repository.ready_versions(name)) if name in self.repository.names() else False
            with contextlib.suppress(OipError):
                if name in ready and not mine:
                    await DataPlane.repository_model_load(self, pb.RepositoryModelLoadRequest(model_name=name))
                elif name not in ready and mine:
                    await DataPlane.repository_model_unload(self, pb.RepositoryModelUnloadRequest(model_name=name))
        status = await self.peers.call_any("system_shared_memory_status", pb.SystemSharedMemoryStatusRequest())
        if isinstance(status, pb.SystemSharedMemoryStatusResponse):
            for region in status.regions.values():
                request = pb.SystemSharedMemoryRegisterRequest(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
                try:
                    await DataPlane.system_shared_memory_register(self, request)
                except OipError as exc:
                    log.warning("shared memory region %r not copied: %s", region.name, exc)
        log.info("copied the state of a running worker: %d ready model(s), %d region(s)",
                 len(ready), len(status.regions) if isinstance(status, pb.SystemSharedMemoryStatusResponse) else 0)


def cluster_dataplane(base: type[DataPlane]) -> type[ClusterDataPlane]:
    """The data plane class of a worker whose data plane is `base` (`DataPlane` or a subclass): `base`'s
    operations, with the control plane reaching the other workers (made with `ClusterDataPlane`'s arguments)."""
    if base is DataPlane:
        return ClusterDataPlane
    if issubclass(base, ClusterDataPlane):
        return base
    # Named as `base`: what the operator wrote is what the logs and `type(self).__name__` say.
    names = {"__module__": base.__module__, "__qualname__": base.__qualname__}
    return type(base.__name__, (ClusterDataPlane, base), names)


class ControlServer:
    """Answers the other workers' calls on this worker's socket, each on the event loop of `dataplane`."""

    def __init__(self, dataplane: ClusterDataPlane, path: Path, key: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.dataplane = dataplane
        self.loop = loop
        path.unlink(missing_ok=True)
        self.listener = Listener(str(path), family="AF_UNIX", authkey=key)
        os.chmod(path, 0o600)
        self.path = path
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="oip-control", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError):  # closed, or a caller without the key
                if self._closed:
                    return
                continue
            except Exception:  # AuthenticationError and the like: refuse this caller, keep serving
                continue
            threading.Thread(target=self._serve, args=(conn,), name="oip-control-call", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                operation, _, body = conn.recv_bytes().partition(b"\0")
                name = operation.decode()
                if name == _METRICS:
                    metrics = asyncio.run_coroutine_threadsafe(DataPlane.metric_families(self.dataplane), self.loop)
                    families = metrics.result(_PEER_TIMEOUT)
                    answer = b"ok\0" + json.dumps([to_json(f) for f in families]).encode()
                else:
                    request = _OPERATIONS[name][0].FromString(body)
                    future = asyncio.run_coroutine_threadsafe(self.dataplane.local(name)(request), self.loop)
                    answer = b"ok\0" + future.result(_PEER_TIMEOUT).SerializeToString()
            except OipError as exc:
                answer = f"error\0{exc.kind.value}\0{exc}".encode()
            except Exception as exc:
                log.error("peer call failed", exc_info=exc)
                answer = f"error\0{ErrorKind.MODEL_FAILURE.value}\0worker failed: {type(exc).__name__}".encode()
            with contextlib.suppress(OSError):
                conn.send_bytes(answer)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.path.unlink(missing_ok=True)


def merge_statistics(responses: Iterable[pb.ModelStatisticsResponse]) -> pb.ModelStatisticsResponse:
    """The statistics of several workers as one server's: counts and durations add up per model version (and per
    batch size); the last inference is the latest."""
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    for response in responses:
        for stats in response.model_stats:
            key = (stats.name, stats.version)
            if key not in merged:
                merged[key] = pb.ModelStatistics()
                merged[key].CopyFrom(stats)
                continue
            _add(merged[key], stats)
    return pb.ModelStatisticsResponse(model_stats=[merged[k] for k in merged])


def _add(total: pb.ModelStatistics, other: pb.ModelStatistics) -> None:
    total.last_inference = max(total.last_inference, other.last_inference)
    total.inference_count += other.inference_count
    total.execution_count += other.execution_count
    _add_durations(total.inference_stats, other.inference_stats)
    by_size = {b.batch_size: b for b in total.batch_stats}
    for batch in other.batch_stats:
        if batch.batch_size in by_size:
            _add_durations(by_size[batch.batch_size], batch)
        else:
            total.batch_stats.add().CopyFrom(batch)
    for key, response in other.response_stats.items():
        if key in total.response_stats:
            _add_durations(total.response_stats[key], response)
        else:
            total.response_stats[key].CopyFrom(response)


def _add_durations(total: Message, other: Message) -> None:
    """Add every StatisticDuration field of `other` to `total` (InferStatistics or InferBatchStatistics)."""
    for descriptor, value in other.ListFields():
        if descriptor.message_type is not None and descriptor.message_type.name == "StatisticDuration":
            mine = getattr(total, descriptor.name)
            mine.count += value.count
            mine.ns += value.ns
