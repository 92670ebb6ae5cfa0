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

The index lists every model folder of the repository as it is now, loaded or not, and every model added from
Python. Each version has a state (LOADING, READY, UNLOADING, UNAVAILABLE, as Triton names them) and a reason: a
model that fails to import, construct or load is UNAVAILABLE with the reason (the error message, cut to
`MAX_REASON` characters), and so is one never loaded ("not loaded") or unloaded ("unloaded"); the others keep
serving. A request for a model that failed answers its name and the reason (`get`, `failure`).

Loading a loaded folder model reloads it from disk: the new instances load while the old ones keep serving,
then replace them; if the reload fails, the old instances stay. `sync` does what polling the folder does (load
what is new, reload what changed, unload what is gone). Loads and unloads of one model are serialized by a lock
per model, and an instance is unloaded only after its in-flight requests finish (`leases`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..errors import ModelFailure, NotFound, NotReady, OipError, clip
from ..model import Model, call_hook, check_model
from .leases import Leases
from .model_files import (
    MODEL_FILE,
    MODULE_IDS,
    drop_modules,
    fingerprint,
    import_class,
    message_of,
    parse_config,
    parse_declarations,
    version_key,
)

__all__ = ["MAX_REASON", "MODEL_FILE", "ModelRepository", "ModelState", "ModelStatus", "version_key"]

log = logging.getLogger(__name__)

MAX_REASON: Final = 500
"""The most characters of a reason the index keeps (a load error's message may be any length)."""
NOT_LOADED: Final = "not loaded"
UNLOADED: Final = "unloaded"


class ModelState(enum.Enum):
    """The state of one model version, named as in Triton's repository index (this server never reports UNKNOWN:
    a version not loaded yet is UNAVAILABLE, reason "not loaded")."""

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
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = NOT_LOADED
    model: Model | None = None  # the serving instance (READY), or the one being loaded or unloaded
    wanted: bool = False  # loading was asked for and no unload since: it counts for server readiness
    failed: bool = False  # the last load of this version failed (`reason` says why)
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
        self.loading = False
        self.fingerprint: object = None  # the folder's files at the last load (`model_files.fingerprint`)
        self.lock = asyncio.Lock()
        self.modules: dict[int, list[str]] = {}  # generation -> module names in sys.modules

    def drop_unused_modules(self, free: bool = True) -> None:
        drop_modules(self.modules, {e.generation for e in self.versions.values() if e.model is not None}, free)


class ModelRepository:
    """The models a server serves, by name and version."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None and not self.path.is_dir():
            raise ValueError(f"model repository {self.path} is not a directory")
        self._records: dict[str, _Record] = {}
        self._leases = Leases()
        self._on_retired: list[Callable[[Model], None]] = []

    def on_retired(self, hook: Callable[[Model], None]) -> None:
        """Call `hook` with each instance retired (unloaded, reloaded) once no request holds it: to let go of what
        is kept per instance (a batch queue, a lean plan), so that it and its module can be freed."""
        self._on_retired.append(hook)

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

    async def scan(self) -> None:
        """Read the model folders of `path` as they are now: new ones are added (not loaded), and a model whose
        folder is gone is forgotten unless it is loaded or asked to be."""
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
            elif record.folder not in folders:  # the name moved to another folder
                record.folder = folders[0]
            record.conflict = [folder for folder in folders if folder != record.folder]
        for name, record in list(self._records.items()):
            if record.folder is not None and name not in found and not self._in_use(record):
                del self._records[name]

    @staticmethod
    def _in_use(record: _Record) -> bool:
        """Whether the model is asked to be loaded, loading or unloading, or has an instance."""
        return record.wanted or record.lock.locked() or any(e.model is not None for e in record.versions.values())

    async def sync(self) -> list[str]:
        """Make the folder models those of `path` as it is now (what polling the repository does): load the new
        folders, reload those whose files changed since their last load (`model_files.fingerprint`; a failed
        reload keeps the loaded instances), unload and forget those that are gone. What it did, one line per
        model (failures are logged where they happen)."""
        found = await asyncio.to_thread(self._find_folders)
        prints = await asyncio.to_thread(lambda: {name: fingerprint(folders) for name, folders in found.items()})
        self._add_folders(found)
        done: list[str] = []
        for name in sorted(self._records):
            record = self._records.get(name)
            if record is None or record.folder is None:
                continue
            if name not in found:
                await self.unload(name)
                if not self._in_use(record):
                    self._records.pop(name, None)
                done.append(f"model '{name}': its folder is gone, unloaded")
            elif record.fingerprint != prints[name] or not record.wanted:
                what = "reloaded" if record.fingerprint is not None else "loaded"
                try:
                    await self._load(name)
                except OipError as exc:
                    what = f"failed to load: {exc.message}"
                done.append(f"model '{name}': {what}")
        return done

    # --- loading ----------------------------------------------------------------------------------------

    async def load_all(self) -> None:
        """Scan the folder and load every model; failures are recorded (and logged), never raised."""
        await self.scan()
        await self.load_quietly(sorted(self._records))

    async def load_quietly(self, names: list[str]) -> None:
        """Load the models `names` together; failures are recorded (and logged), never raised."""
        await asyncio.gather(*(self._load_quietly(name) for name in names))

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
            await self.scan()
        await self._load(name)

    async def _load(self, name: str) -> None:
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"model '{name}' is not in the model repository")
        async with record.lock:
            record.wanted = record.loading = True
            try:
                if record.folder is not None:
                    failures = await self._load_folder(record)
                else:
                    failures = await self._load_added(record)
            finally:
                record.loading = False
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
            record.problem = problem = clip(problem, MAX_REASON)
            for entry in record.versions.values():
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason, entry.failed = ModelState.UNAVAILABLE, problem, True
            record.drop_unused_modules()
            log.error("model '%s': %s", record.name, problem)
            return [problem]
        record.problem = ""
        failures: list[str] = []
        for version in sorted(built, key=version_key):
            made = built[version]
            entry = record.versions.setdefault(version, _Version(version))
            entry.wanted = True
            if isinstance(made, Exception):
                reason = clip(message_of(made), MAX_REASON)
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason, entry.model, entry.failed = ModelState.UNAVAILABLE, reason, None, True
                log.error("model '%s' version %s: %s", record.name, version, reason)
                failures.append(f"version {version}: {reason}")
                continue
            if entry.state is ModelState.READY and entry.model is not None:
                error = await self._replace(record, entry, entry.model, made, generation)
                if error:
                    log.error("model '%s' version %s: reload failed, the loaded instance stays: %s",
                              record.name, version, error)
                    failures.append(f"version {version}: {error}")
            else:
                entry.model, entry.generation = made, generation
                error = await self._start(record, entry, made)
                if error:
                    failures.append(f"version {version}: {error}")
        for version, entry in record.versions.items():
            if version not in built and entry.wanted:  # no longer declared: unload it
                await self._stop(entry)
        record.drop_unused_modules()
        return failures

    async def _replace(self, record: _Record, entry: _Version, old: Model, model: Model, generation: int) -> str:
        """Load `model` beside `old`, then serve it and retire `old` (referred to here alone: gone before its
        module is); the error message, or "" on success."""
        error = await self._load_instance(record, model)
        if not error:
            entry.model, entry.generation, entry.reason = model, generation, ""
            await self._retire(old)
        return error

    async def _start(self, record: _Record, entry: _Version, model: Model) -> str:
        """Load `model` into `entry` (not serving yet); the error message, or "" on success."""
        entry.state, entry.reason = ModelState.LOADING, ""
        self._leases.admit(model)
        error = await self._load_instance(record, model)
        if error:
            entry.state, entry.reason, entry.model, entry.failed = ModelState.UNAVAILABLE, error, None, True
            log.error("model '%s' version %s failed to load: %s", record.name, entry.version, error)
        else:
            entry.state, entry.failed = ModelState.READY, False
            log.info("model '%s' version %s is ready", record.name, entry.version)
        return error

    @staticmethod
    async def _load_instance(record: _Record, model: Model) -> str:
        try:
            await call_hook(model.load)
            check_model(model)
        except Exception as exc:
            log.debug("model '%s' load() failed", record.name, exc_info=True)
            return clip(message_of(exc), MAX_REASON)
        return ""

    def _instantiate(self, record: _Record, generation: int) -> tuple[dict[str, Model | Exception], str]:
        """Read model.toml, import the python file(s) and construct one instance per version (in a thread).
        Returns the instances (or the error of each version) and a problem that concerns the whole model."""
        folder = record.folder
        assert folder is not None
        record.fingerprint = fingerprint([folder, *record.conflict])  # before reading: a change meanwhile shows
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

    async def unload(self, name: str, free: bool = True) -> None:
        """Unload every version of model `name` (UNAVAILABLE, reason "unloaded"). NotFound when unknown. `free`
        False: what its modules held is left to the process's end (a full collection per model at shutdown)."""
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"model '{name}' is not in the model repository")
        async with record.lock:
            record.wanted = False
            for entry in record.versions.values():
                await self._stop(entry)
            record.drop_unused_modules(free)

    async def unload_all(self) -> None:
        """Unload every model (at shutdown)."""
        await asyncio.gather(*(self.unload(name, free=False) for name in sorted(self._records)))

    async def _stop(self, entry: _Version) -> None:
        entry.wanted = False
        model = entry.model
        if model is None:  # never loaded: still "not loaded"; failed: the failure is over, it is unloaded
            if entry.reason != NOT_LOADED:
                entry.state, entry.reason, entry.failed = ModelState.UNAVAILABLE, UNLOADED, False
            return
        entry.state, entry.reason = ModelState.UNLOADING, ""
        await self._retire(model)
        entry.model = None
        entry.state, entry.reason = ModelState.UNAVAILABLE, UNLOADED

    async def _retire(self, model: Model) -> None:
        """Lease `model` no more, wait until no request runs on it, then call its unload() (its errors are logged)
        and the `on_retired` hooks."""
        await self._leases.retire(model)
        try:
            await call_hook(model.unload)
        except Exception:
            log.exception("model '%s' version %s: unload() failed", model.name, model.version)
        for hook in self._on_retired:  # the data plane's: dict updates that do not raise
            hook(model)
        log.info("model '%s' version %s is unloaded", model.name, model.version)

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

        NotFound for an unknown model or version; NotReady for a known one that is not ready, naming the model
        and why (the reason of a failed load, "unloaded", "not loaded").
        """
        record = self._record(name)
        if version:
            entry = self._version(record, name, version)
            if entry.state is not ModelState.READY or entry.model is None:
                raise NotReady(self._why_not_ready(record, version))
            return entry.model
        best: _Version | None = None
        for entry in record.versions.values():
            if entry.state is ModelState.READY and entry.model is not None and (
                best is None or version_key(entry.version) > version_key(best.version)
            ):
                best = entry
        if best is None or best.model is None:
            raise NotReady(self._why_not_ready(record))
        return best.model

    @staticmethod
    def _why_not_ready(record: _Record, version: str = "") -> str:
        def why(entry: _Version) -> str:
            reason = entry.reason or entry.state.value.lower()
            return f"failed to load: {reason}" if entry.failed else reason

        if version:
            return f"model '{record.name}' version {version} is not ready: {why(record.versions[version])}"
        reasons = [f"version {v}: {why(record.versions[v])}" for v in sorted(record.versions, key=version_key)]
        if record.problem:
            reasons.insert(0, f"failed to load: {record.problem}")
        return f"model '{record.name}' has no ready version: {'; '.join(reasons) or NOT_LOADED}"

    def failure(self, name: str, version: str = "") -> str:
        """Why model `name` (at `version`, or any version) failed to load, naming it, when it is not ready because
        a load asked for failed; "" otherwise (ready, loading, unloaded, never loaded). NotFound for an unknown
        model or version."""
        record = self._record(name)
        if version:
            entry = self._version(record, name, version)
            failed = entry.state is not ModelState.READY and entry.wanted and (entry.failed or bool(record.problem))
        else:
            failed = record.wanted and not record.loading and (
                bool(record.problem) or any(e.wanted and e.failed for e in record.versions.values())
            ) and not any(e.state is ModelState.READY for e in record.versions.values())
        return self._why_not_ready(record, version) if failed else ""

    def acquire(self, model: Model) -> Model:
        """Keep an instance of `model`'s version (from `get`) from being unloaded until `release` (an inference
        holds it so: `accounting.Inference`). The instance to run: `model`, or the one that replaced it when a
        reload retired it since `get` (a gRPC thread may be that late); NotReady when its version is not ready."""
        while not self._leases.hold(model):
            successor = self.get(model.name, model.version)
            if successor is model:  # retired yet serving: never spin on it
                raise NotReady(f"model '{model.name}' version {model.version} is being replaced; try again")
            model = successor
        return model

    def release(self, model: Model) -> None:
        """The request that `acquire`d `model` is done."""
        self._leases.release(model)

    def inflight(self) -> dict[tuple[str, str], int]:
        """The requests holding each model version that has an instance (leased, not released yet), by (name,
        version): the requests started and not finished."""
        held = self._leases.held()
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
            if record.wanted and (record.loading or record.problem) and not record.versions:
                return False
            if any(entry.wanted and entry.state is not ModelState.READY for entry in record.versions.values()):
                return False
        return True

    def names(self) -> list[str]:
        return sorted(self._records)

    def index(self, ready_only: bool = False) -> list[ModelStatus]:
        """Every known model version with its state, by name then version; only READY ones with ready_only. A
        model without versions yet is one entry without a version: LOADING, or UNAVAILABLE with the reason."""
        out: list[ModelStatus] = []
        for name in sorted(self._records):
            record = self._records[name]
            if not record.versions:
                if record.loading:
                    out.append(ModelStatus(name, "", ModelState.LOADING))
                else:
                    out.append(ModelStatus(name, "", ModelState.UNAVAILABLE, record.problem or NOT_LOADED))
                continue
            for version in sorted(record.versions, key=version_key):
                entry = record.versions[version]
                out.append(ModelStatus(name, version, entry.state, entry.reason))
        if ready_only:
            out = [status for status in out if status.state is ModelState.READY]
        return out
