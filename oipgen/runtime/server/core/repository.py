"""The model repository: which models exist, which versions of them are loaded, and their state.

Models come from a folder (`ModelRepository(path)`) and from Python (`add(model)`). In the folder, every
sub-folder holding a `model.toml` is a model, named after the folder unless the file sets `name`:

```toml
class = "model:Simple"        # <python file in the folder, without .py>:<Model subclass>
platform = "pytorch"          # optional; overrides the class's platform in metadata
versions = ["1", "2"]         # optional; default: the numeric sub-folders, else ["1"]
max_batch_size = 8            # optional; overrides the class's (0: the model does not batch)
decoupled = false             # optional; overrides the class's
[dynamic_batching]            # optional; overrides the class's (needs max_batch_size >= 1)
max_queue_delay_microseconds = 100
preferred_batch_size = [4, 8]
[parameters]                  # optional; passed to the model as `settings`
threshold = 0.5
```

A version whose sub-folder (`<model>/<version>/`) holds its own python file uses that file; otherwise every
version uses the model folder's file. The python file is imported by path under a unique module name, as a
module of a package whose path is its folders, so it may import helper modules beside it relatively
(`from . import helpers`), and imports this package by its installed name.

Each version has a state (UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE) and a reason. A model that fails
to import, construct or load is UNAVAILABLE with the reason (the error message); the others keep serving.
Loading a loaded folder model reloads it from disk: the new instances load while the old ones keep serving,
then replace them; if the reload fails, the old instances stay. Loads and unloads of one model are
serialized by a lock per model, and an instance is unloaded only after its in-flight requests finish.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import sys
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFailure, NotFound, NotReady, OipError
from ..model import Model, call_hook, check_model
from .model_files import (
    MODEL_FILE,
    MODULE_IDS,
    import_class,
    message_of,
    parse_config,
    parse_declarations,
    version_key,
)

__all__ = ["MODEL_FILE", "ModelRepository", "ModelState", "ModelStatus", "version_key"]

log = logging.getLogger(__name__)



class ModelState(enum.Enum):
    """The state of one model version, named as in Triton's repository index."""

    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One entry of the repository index. `version` is empty for a model whose versions are unknown (its
    model.toml could not be read, or it was never loaded)."""

    name: str
    version: str
    state: ModelState
    reason: str = ""


@dataclass(slots=True)
class _Version:
    version: str
    state: ModelState = ModelState.UNKNOWN
    reason: str = ""
    model: Model | None = None  # the serving instance (READY), or the one being loaded or unloaded
    wanted: bool = False  # loading was asked for and no unload since: it counts for server readiness
    generation: int = 0  # the load that made `model`, to drop its modules once nothing uses them


class _Record:
    """One model name: its source (a folder, or instances given to `add`) and its versions."""

    def __init__(self, name: str, folder: Path | None) -> None:
        self.name = name
        self.folder = folder
        self.conflict: list[Path] = []  # other folders that declare the same name
        self.added: dict[str, Model] = {}
        self.versions: dict[str, _Version] = {}
        self.problem = ""  # why the model has no versions at all (model.toml unreadable...)
        self.wanted = False
        self.lock = asyncio.Lock()
        self.modules: dict[int, list[str]] = {}  # generation -> module names in sys.modules


class ModelRepository:
    """The models a server serves, by name and version."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None and not self.path.is_dir():
            raise ValueError(f"model repository {self.path} is not a directory")
        self._records: dict[str, _Record] = {}
        self._inflight: dict[int, int] = {}  # id(model) -> requests running on it
        # Unloads waiting for a model's requests to finish, with the loop each waits on (gRPC threads hold too).
        self._drained: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._lease_lock = threading.Lock()

    # --- registration ---------------------------------------------------------------------------------

    def add(self, model: Model) -> None:
        """Register a model instance (one version of its name). It is loaded by `load_all` or `load(name)`."""
        if not isinstance(model, Model):
            raise TypeError(f"expected a Model, got {type(model).__name__}")
        check_model(model)
        record = self._records.get(model.name)
        if record is None:
            record = self._records[model.name] = _Record(model.name, None)
        elif record.folder is not None:
            raise ValueError(f"model '{model.name}' already comes from the repository folder {record.folder}")
        if model.version in record.added:
            raise ValueError(f"model '{model.name}' version {model.version} is already added")
        record.added[model.version] = model
        record.versions.setdefault(model.version, _Version(model.version))

    def scan(self) -> None:
        """Find the model folders of `path` (new ones are added; nothing is loaded or forgotten)."""
        self._add_folders(self._find_folders())

    async def _scan(self) -> None:
        # The file system is read in a thread; the records change on the event loop only.
        self._add_folders(await asyncio.to_thread(self._find_folders))

    def _find_folders(self) -> dict[str, list[Path]]:
        """Model name -> the folders that declare it (several: a conflict)."""
        found: dict[str, list[Path]] = {}
        if self.path is None:
            return found
        try:
            folders = sorted(self.path.iterdir())
        except OSError as exc:
            log.error("cannot read the model repository %s: %s", self.path, exc)
            return found
        for folder in folders:
            if folder.name.startswith((".", "_")) or not (folder / MODEL_FILE).is_file():
                continue
            name = folder.name
            try:
                declared = tomllib.loads((folder / MODEL_FILE).read_text(encoding="utf-8")).get("name")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                declared = None  # reported when the model loads
            if isinstance(declared, str) and declared:
                name = declared
            found.setdefault(name, []).append(folder)
        return found

    def _add_folders(self, found: dict[str, list[Path]]) -> None:
        for name, folders in found.items():
            record = self._records.get(name)
            if record is None:
                record = self._records[name] = _Record(name, folders[0])
            elif record.folder is None:
                if record.added:
                    log.warning("model folder %s is ignored: model '%s' was added from Python", folders[0], name)
                    continue
                record.folder = folders[0]
            record.conflict = folders[1:]

    # --- loading ----------------------------------------------------------------------------------------

    async def load_all(self) -> None:
        """Scan the folder and load every model; failures are recorded (and logged), never raised."""
        await self._scan()
        await asyncio.gather(*(self._load_quietly(name) for name in sorted(self._records)))

    async def _load_quietly(self, name: str) -> None:
        try:
            await self._load(name)
        except OipError as exc:  # each failure was logged where it happened
            log.debug("%s", exc.message)

    async def load(self, name: str) -> None:
        """Load model `name`, or reload it when loaded (a folder model is read again from disk; the folder
        is scanned for a name it does not know yet, so a model added since starts here). NotFound when there
        is no such model; ModelFailure naming the reasons when a version fails (it is then UNAVAILABLE, or
        keeps its previous instance when it was loaded). Loads and unloads of one model run in call order."""
        if name not in self._records and self.path is not None:
            await self._scan()
        await self._load(name)

    async def _load(self, name: str) -> None:
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"model '{name}' is not in the model repository")
        async with record.lock:
            record.wanted = True
            if record.folder is not None:
                failures = await self._load_folder(record)
            else:
                failures = await self._load_added(record)
        if failures:
            raise ModelFailure(f"failed to load model '{name}': " + "; ".join(failures))

    async def _load_added(self, record: _Record) -> list[str]:
        failures: list[str] = []
        for version, model in sorted(record.added.items(), key=lambda item: version_key(item[0])):
            entry = record.versions.setdefault(version, _Version(version))
            entry.wanted = True
            if entry.state is ModelState.READY:
                continue  # the same instance: nothing to reload
            entry.model = model
            error = await self._start(record, entry, model)
            if error:
                failures.append(error)
        return failures

    async def _load_folder(self, record: _Record) -> list[str]:
        generation = next(MODULE_IDS)
        built, problem = await asyncio.to_thread(self._instantiate, record, generation)
        if problem:
            record.problem = problem
            for entry in record.versions.values():
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, problem
            self._drop_unused_modules(record)
            log.error("model '%s': %s", record.name, problem)
            return [problem]
        record.problem = ""
        failures: list[str] = []
        for version in sorted(built, key=version_key):
            made = built[version]
            entry = record.versions.setdefault(version, _Version(version))
            entry.wanted = True
            if isinstance(made, Exception):
                reason = message_of(made)
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason, entry.model = ModelState.UNAVAILABLE, reason, None
                log.error("model '%s' version %s: %s", record.name, version, reason)
                failures.append(f"version {version}: {reason}")
                continue
            if entry.state is ModelState.READY and entry.model is not None:
                old = entry.model
                error = await self._load_instance(record, made)
                if error:
                    log.error("model '%s' version %s: reload failed, the loaded instance stays: %s",
                              record.name, version, error)
                    failures.append(f"version {version}: {error}")
                    continue
                entry.model, entry.generation, entry.reason = made, generation, ""
                await self._retire(old)
            else:
                entry.model, entry.generation = made, generation
                error = await self._start(record, entry, made)
                if error:
                    failures.append(f"version {version}: {error}")
        for version, entry in record.versions.items():
            if version not in built and entry.wanted:  # no longer declared: unload it
                await self._stop(entry)
        self._drop_unused_modules(record)
        return failures

    async def _start(self, record: _Record, entry: _Version, model: Model) -> str:
        """Load `model` into `entry` (not serving yet); the error message, or "" on success."""
        entry.state, entry.reason = ModelState.LOADING, ""
        error = await self._load_instance(record, model)
        if error:
            entry.state, entry.reason, entry.model = ModelState.UNAVAILABLE, error, None
            log.error("model '%s' version %s failed to load: %s", record.name, entry.version, error)
        else:
            entry.state = ModelState.READY
            log.info("model '%s' version %s is ready", record.name, entry.version)
        return error

    @staticmethod
    async def _load_instance(record: _Record, model: Model) -> str:
        try:
            await call_hook(model.load)
            check_model(model)
        except Exception as exc:
            log.debug("model '%s' load() failed", record.name, exc_info=True)
            return message_of(exc)
        return ""

    def _instantiate(self, record: _Record, generation: int) -> tuple[dict[str, Model | Exception], str]:
        """Read model.toml, import the python file(s) and construct one instance per version (in a thread).
        Returns the instances (or the error of each version) and a problem that concerns the whole model."""
        folder = record.folder
        assert folder is not None
        if record.conflict:
            others = ", ".join(str(f) for f in [folder, *record.conflict])
            return {}, f"model name '{record.name}' is declared by several folders: {others}"
        toml = folder / MODEL_FILE
        try:
            config = tomllib.loads(toml.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            return {}, f"cannot read {toml}: {message_of(exc)}"
        try:
            target, platform, versions, parameters = parse_config(config, folder)
            declared = parse_declarations(config)
        except ValueError as exc:
            return {}, f"{toml}: {exc}"
        file_name, _, class_name = target.partition(":")
        file_name = file_name if file_name.endswith(".py") else file_name + ".py"
        modules = record.modules.setdefault(generation, [])
        classes: dict[Path, type[Model] | Exception] = {}
        built: dict[str, Model | Exception] = {}
        for version in versions:
            version_dir = folder / version
            own = version_dir / file_name
            file = own if own.is_file() else folder / file_name
            search = [version_dir, folder] if file == own else [folder]
            if file not in classes:
                try:
                    classes[file] = import_class(file, class_name, search, record.name, modules)
                except Exception as exc:
                    log.debug("model '%s': cannot import %s", record.name, file, exc_info=True)
                    classes[file] = exc
            cls = classes[file]
            if isinstance(cls, Exception):
                built[version] = cls
                continue
            try:
                model = cls(record.name, version=version, settings=parameters,
                            path=version_dir if version_dir.is_dir() else folder)
                model.name = record.name
                if platform is not None:
                    model.platform = platform
                built[version] = model
            except Exception as exc:
                log.debug("model '%s': %s() failed", record.name, class_name, exc_info=True)
                built[version] = ValueError(f"{class_name}() failed: {message_of(exc)}")
                continue
            if declared:
                for key, value in declared.items():
                    setattr(model, key, value)
                try:
                    check_model(model)
                except ValueError as exc:
                    built[version] = ValueError(f"{toml}: {message_of(exc)}")
        return built, ""

    # --- unloading --------------------------------------------------------------------------------------

    async def unload(self, name: str) -> None:
        """Unload every version of model `name` (UNAVAILABLE, reason "unloaded"). NotFound when unknown."""
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"model '{name}' is not in the model repository")
        async with record.lock:
            record.wanted = False
            for entry in record.versions.values():
                await self._stop(entry)
            self._drop_unused_modules(record)

    async def unload_all(self) -> None:
        """Unload every model (at shutdown)."""
        await asyncio.gather(*(self.unload(name) for name in sorted(self._records)))

    async def _stop(self, entry: _Version) -> None:
        entry.wanted = False
        model = entry.model
        if model is None:
            if entry.state is not ModelState.UNKNOWN:
                entry.state, entry.reason = ModelState.UNAVAILABLE, entry.reason or "unloaded"
            return
        entry.state, entry.reason = ModelState.UNLOADING, ""
        await self._retire(model)
        entry.model = None
        entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"

    async def _retire(self, model: Model) -> None:
        """Wait until no request runs on `model`, then call its unload() (errors are logged)."""
        key = id(model)
        with self._lease_lock:
            event = (
                self._drained.setdefault(key, (asyncio.get_running_loop(), asyncio.Event()))[1]
                if key in self._inflight else None
            )
        if event is not None:
            await event.wait()
        try:
            await call_hook(model.unload)
        except Exception:
            log.exception("model '%s' version %s: unload() failed", model.name, model.version)
        log.info("model '%s' version %s is unloaded", model.name, model.version)

    def _drop_unused_modules(self, record: _Record) -> None:
        used = {entry.generation for entry in record.versions.values() if entry.model is not None}
        for generation in [g for g in record.modules if g not in used]:
            for module in record.modules.pop(generation):
                sys.modules.pop(module, None)

    # --- lookups ----------------------------------------------------------------------------------------

    def _record(self, name: str) -> _Record:
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return record

    @staticmethod
    def _version(record: _Record, name: str, version: str) -> _Version:
        entry = record.versions.get(version)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return entry

    def get(self, name: str, version: str = "") -> Model:
        """The serving instance of `name` at `version` (empty: the highest ready version).

        NotFound for an unknown model or version; NotReady for a known one that is not ready.
        """
        record = self._record(name)
        if version:
            entry = self._version(record, name, version)
            if entry.state is not ModelState.READY or entry.model is None:
                raise NotReady(f"Request for unknown model: '{name}' version {version} is not at ready state")
            return entry.model
        best: _Version | None = None
        for entry in record.versions.values():
            if entry.state is ModelState.READY and entry.model is not None and (
                best is None or version_key(entry.version) > version_key(best.version)
            ):
                best = entry
        if best is None or best.model is None:
            raise NotReady(f"Request for unknown model: '{name}' has no available versions")
        return best.model

    def acquire(self, model: Model) -> None:
        """Keep the instance `model` (from `get`) from being unloaded until `release` (an inference holds it so:
        `accounting.Inference`)."""
        key = id(model)
        with self._lease_lock:
            self._inflight[key] = self._inflight.get(key, 0) + 1

    def release(self, model: Model) -> None:
        key = id(model)
        with self._lease_lock:
            count = self._inflight[key] - 1
            if count:
                self._inflight[key] = count
                return
            del self._inflight[key]
            waiting = self._drained.pop(key, None)
        if waiting is not None:
            loop, event = waiting
            loop.call_soon_threadsafe(event.set)

    def inflight(self) -> dict[tuple[str, str], int]:
        """The requests holding each model version that has an instance (leased, not released yet), by (name,
        version): the requests started and not finished."""
        with self._lease_lock:
            held = dict(self._inflight)
        return {(name, version): held.get(id(entry.model), 0)
                for name, record in list(self._records.items())
                for version, entry in list(record.versions.items()) if entry.model is not None}

    def is_ready(self, name: str, version: str = "") -> bool:
        """Whether `name` (at `version`, or any version) is READY. NotFound for an unknown model or version."""
        record = self._record(name)
        if version:
            return self._version(record, name, version).state is ModelState.READY
        return any(entry.state is ModelState.READY for entry in record.versions.values())

    def ready_versions(self, name: str) -> list[str]:
        """The READY versions of `name`, lowest first. NotFound for an unknown model."""
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        ready = [v for v, entry in record.versions.items() if entry.state is ModelState.READY]
        return sorted(ready, key=version_key)

    def ready(self) -> bool:
        """True when every model version asked to load is READY (true with no models)."""
        for record in self._records.values():
            if record.wanted and record.problem and not record.versions:
                return False
            if any(entry.wanted and entry.state is not ModelState.READY for entry in record.versions.values()):
                return False
        return True

    def names(self) -> list[str]:
        return sorted(self._records)

    def index(self, ready_only: bool = False) -> list[ModelStatus]:
        """Every known model version with its state, by name then version; only READY ones with ready_only."""
        out: list[ModelStatus] = []
        for name in sorted(self._records):
            record = self._records[name]
            if not record.versions:
                state = ModelState.UNAVAILABLE if record.problem else ModelState.UNKNOWN
                out.append(ModelStatus(name, "", state, record.problem))
                continue
            for version in sorted(record.versions, key=version_key):
                entry = record.versions[version]
                out.append(ModelStatus(name, version, entry.state, entry.reason))
        if ready_only:
            out = [status for status in out if status.state is ModelState.READY]
        return out
