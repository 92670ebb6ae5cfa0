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
worker (`worker-<i>.sock`, mode 0600; the folder is mode 0700). A call is one connection: both ends prove they
hold the key only the supervisor and its workers know (a challenge each way, answered with its HMAC-SHA256), then
the caller sends one frame naming a data plane operation with its protobuf request, and the peer answers one
frame; the peer runs the operation on its own data plane only, never forwarding it again.

Calls are coroutines on each worker's event loop (asyncio streams), on no thread of the models' or anyone's, and
every step has a deadline: connecting (`CONNECT_TIMEOUT`), the handshake (`HANDSHAKE_TIMEOUT`, on the answering
side too: a connection that says nothing is dropped), and the call (`CALL_TIMEOUT`, `LONG_CALL_TIMEOUT` for model
loads and unloads). A peer that is down (no socket, refused) is skipped: it copies the state when it comes back. A
peer that does not answer in time is reported in the log; for a read (statistics, metrics) it is then skipped for
`SILENT_FOR` seconds rather than waited for again; an operation that changes state and did not reach it is
reported to the supervisor (`missed_path`), which restarts that worker, so it copies the state again. The
supervisor also pings every worker (`ping`), and restarts one that has not answered for a while.

A restarted worker listens on its socket before it copies the others' state, and applies the operations that
arrive meanwhile only after the copy (`ClusterDataPlane.copied`): every worker ends in the state the last answered
operation promised. While it copies it tells callers that want a copy of its state to ask another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
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
           "missed_path", "ping",
           "socket_path"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 2.0
HANDSHAKE_TIMEOUT: Final = 5.0
CALL_TIMEOUT: Final = 10.0  # a call, from connecting to its answer
LONG_CALL_TIMEOUT: Final = 120.0  # a call that loads or unloads a model, which may take a while
SILENT_FOR: Final = 30.0  # seconds a peer that did not answer in time is skipped by reads
_HELLO: Final = b"oip-control-1\0"  # the answering side's first bytes, before its challenge
_CHALLENGE: Final = 32
_MAX_REQUEST: Final = 1 << 20  # bytes of a request frame
_MAX_ANSWER: Final = 256 << 20  # bytes of an answer frame (a worker's metric families, as JSON)
_FRAME: Final = struct.Struct(">I")

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


# Operations whose answer is not a protobuf message: the worker's metric families, as JSON; a ping (the worker's
# event loop answers: it is alive), nothing.
_METRICS: Final = "metric_families"
_PING: Final = "ping"
# Operations that change a worker's state: applied after the copy of a restarted worker's state, reported to the
# supervisor when they did not reach a peer that is up, and never skipped for a peer that was silent before.
_CHANGES: Final = frozenset({"repository_model_load", "repository_model_unload", "system_shared_memory_register",
                             "system_shared_memory_unregister", _SYNC})
# Operations that copy a worker's state: a worker still copying its own sends the caller to another.
_COPIES: Final = frozenset({"repository_index", "system_shared_memory_status"})
_LONG: Final = frozenset({"repository_model_load", "repository_model_unload", _SYNC})


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


def missed_path(socket: Path) -> Path:
    """The file that tells the supervisor the worker of `socket` missed an operation that changes state."""
    return socket.with_suffix(".missed")


class PeerError(Exception):
    """A peer could not be reached (it is down or restarting); `silent`: it is up and did not answer in time."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


# --- the transport: one authenticated call per connection, each step within a deadline ----------------------------


def _mac(key: bytes, side: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, side + challenge, hashlib.sha256).digest()


def _frame(data: bytes) -> bytes:
    return _FRAME.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, more than the {limit} allowed")
    return await reader.readexactly(size)


async def _prove_caller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> None:
    """The answering side's handshake: the caller answers a challenge with its HMAC, then this side answers the
    caller's (PermissionError when the caller does not hold the key). Reads exactly what it expects: nothing a
    caller sends before it proved itself is held beyond 64 bytes."""
    challenge = os.urandom(_CHALLENGE)
    writer.write(_HELLO + challenge)
    await writer.drain()
    reply = await reader.readexactly(2 * _CHALLENGE)
    if not hmac.compare_digest(reply[:_CHALLENGE], _mac(key, b"caller", challenge)):
        raise PermissionError("the caller does not hold the key")
    writer.write(_mac(key, b"answerer", reply[_CHALLENGE:]))
    await writer.drain()


async def _prove_answerer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> None:
    """The calling side's handshake (`_prove_caller`'s other half)."""
    hello = await reader.readexactly(len(_HELLO) + _CHALLENGE)
    if not hello.startswith(_HELLO):
        raise PermissionError("not a worker's control socket")
    challenge = os.urandom(_CHALLENGE)
    writer.write(_mac(key, b"caller", hello[len(_HELLO):]) + challenge)
    await writer.drain()
    if not hmac.compare_digest(await reader.readexactly(_CHALLENGE), _mac(key, b"answerer", challenge)):
        raise PermissionError("the answering side does not hold the key")


async def _call(path: Path, key: bytes, operation: str, body: bytes, timeout: float) -> bytes:
    """One call to the worker listening on `path`: its answer frame. PeerError when it cannot be made (the worker
    is down: no socket, refused) or does not complete in time (`silent`: the worker is up and did not answer)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    step = "connecting"
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout_at(min(deadline, loop.time() + CONNECT_TIMEOUT)):
            reader, writer = await asyncio.open_unix_connection(str(path))
        step = "the handshake"
        async with asyncio.timeout_at(min(deadline, loop.time() + HANDSHAKE_TIMEOUT)):
            await _prove_answerer(reader, writer, key)
        step = operation
        async with asyncio.timeout_at(deadline):
            writer.write(_frame(operation.encode() + b"\0" + body))
            await writer.drain()
            return await _read_frame(reader, _MAX_ANSWER)
    except TimeoutError:
        raise PeerError(f"{path.name}: no answer to {step} within its deadline", silent=True) from None
    except (OSError, EOFError, asyncio.IncompleteReadError, PermissionError, ValueError) as exc:
        raise PeerError(f"{path.name}: {step}: {exc or type(exc).__name__}") from None
    finally:
        if writer is not None:
            writer.close()


async def ping(path: Path, key: bytes, timeout: float) -> bool:
    """Whether the worker listening on `path` answers a call within `timeout` seconds (its event loop runs)."""
    try:
        return await _call(path, key, _PING, b"", timeout) == b"ok\0"
    except PeerError:
        return False


class Peers:
    """The other workers of this server, as seen from worker `index`, called from its event loop."""

    def __init__(self, folder: Path, index: int, key: bytes) -> None:
        self.folder = folder
        self.index = index
        self.key = key
        self._silent: dict[Path, float] = {}  # a peer that did not answer in time: until when reads skip it

    def sockets(self) -> list[Path]:
        """The control sockets of the other workers that are up (a restarting worker has none yet)."""
        own = socket_path(self.folder, self.index)
        return sorted(p for p in self.folder.glob("worker-*.sock") if p != own)

    async def _call(self, path: Path, operation: str, request: Message) -> Any:
        changes = operation in _CHANGES
        if not changes and time.monotonic() < self._silent.get(path, 0.0):
            raise PeerError(f"{path.name}: did not answer in time lately", silent=True)
        timeout = LONG_CALL_TIMEOUT if operation in _LONG else CALL_TIMEOUT
        try:
            answer = await _call(path, self.key, operation, request.SerializeToString(), timeout)
        except PeerError as exc:
            if exc.silent:
                self._silent[path] = time.monotonic() + SILENT_FOR
                if changes:  # it is up and may not have applied it: the supervisor restarts it, it copies again
                    with contextlib.suppress(OSError):
                        missed_path(path).write_text(operation)
            raise
        self._silent.pop(path, None)
        status, _, body = answer.partition(b"\0")
        if status == b"ok":
            return json.loads(body) if operation == _METRICS else _OPERATIONS[operation][1].FromString(body)
        if status == b"copying":
            raise PeerError(f"{path.name}: still copying the state of another worker")
        kind, _, message = body.decode("utf-8", "replace").partition("\0")
        try:
            error_kind = ErrorKind(kind)
        except ValueError:
            error_kind = ErrorKind.MODEL_FAILURE
        raise OipError(message, error_kind)

    async def call_all(self, operation: str, request: Message) -> list[Any]:
        """Run `operation` on every other worker that is up, together; their answers. A worker that is down is
        skipped (it copies the state when it comes back), one that does not answer in time is reported and
        skipped; an OipError of a peer is raised after all answered."""
        paths = self.sockets()
        results = await asyncio.gather(*(self._call(path, operation, request) for path in paths),
                                       return_exceptions=True)
        answers: list[Any] = []
        failure: BaseException | None = None
        for path, result in zip(paths, results, strict=True):
            if isinstance(result, PeerError):
                if not result.silent:
                    log.warning("worker %s skipped for %s: %s", path.name, operation, result)
                elif operation in _CHANGES:
                    log.error("worker %s did not answer %s in time (%s): the supervisor restarts it, and it copies "
                              "the state again", path.name, operation, result)
                else:
                    log.warning("worker %s did not answer %s in time, skipped (%s)", path.name, operation, result)
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
                return await self._call(path, operation, request)  # type: ignore[no-any-return]
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
        # Set but while a restarted worker copies the others' state: peers' operations that change state wait.
        self.copied = asyncio.Event()
        self.copied.set()

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
        """Make this (restarted) worker's models and regions those of a running worker; then the peers'
        operations that arrived meanwhile apply (`copied`: clear it before this worker listens)."""
        self.copied.clear()
        try:
            await self._copy_state()
        finally:
            self.copied.set()

    async def _copy_state(self) -> None:
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
    """Answers the other workers' calls on this worker's socket, on its event loop (once it `listen`s)."""

    def __init__(self, dataplane: ClusterDataPlane, path: Path, key: bytes) -> None:
        self.dataplane = dataplane
        self.path = path
        self.key = key
        self.server: asyncio.AbstractServer | None = None

    async def listen(self) -> None:
        self.path.unlink(missing_ok=True)
        self.server = await asyncio.start_unix_server(self._serve, str(self.path))
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):  # a caller that says nothing, or too little, is dropped
                await _prove_caller(reader, writer, self.key)
                request = await _read_frame(reader, _MAX_REQUEST)
            answer = await self._answer(request)
            async with asyncio.timeout(CALL_TIMEOUT):
                writer.write(_frame(answer))
                await writer.drain()
        except (TimeoutError, OSError, EOFError, asyncio.IncompleteReadError, PermissionError, ValueError) as exc:
            log.debug("control call dropped: %s", exc or type(exc).__name__)
        finally:
            writer.close()

    async def _answer(self, request: bytes) -> bytes:
        operation, _, body = request.partition(b"\0")
        name = operation.decode("utf-8", "replace")
        dataplane = self.dataplane
        try:
            if name == _PING:
                return b"ok\0"
            if name == _METRICS:
                families = await DataPlane.metric_families(dataplane)
                return b"ok\0" + json.dumps([to_json(f) for f in families]).encode()
            if name not in _OPERATIONS:
                raise OipError(f"unknown control operation {name!r}", ErrorKind.UNIMPLEMENTED)
            if name in _COPIES and not dataplane.copied.is_set():
                return b"copying\0"
            if name in _CHANGES:
                await dataplane.copied.wait()
            reply = await dataplane.local(name)(_OPERATIONS[name][0].FromString(body))
            return b"ok\0" + reply.SerializeToString()
        except OipError as exc:
            return f"error\0{exc.kind.value}\0{exc}".encode()
        except Exception as exc:
            log.error("peer call failed", exc_info=exc)
            return f"error\0{ErrorKind.MODEL_FAILURE.value}\0worker failed: {type(exc).__name__}".encode()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
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
