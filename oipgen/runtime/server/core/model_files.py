"""A model folder's files: its `model.toml` (what the repository reads of it, `parse_config` and
`parse_declarations`), its versions' order (`version_key`), its python file, imported by path under a unique
module name as a module of a package whose path is its folders (`import_class`), and what tells that any of its
files changed (`fingerprint`)."""

from __future__ import annotations

import gc
import hashlib
import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from ..model import DynamicBatching, Model

__all__ = ["MODEL_FILE", "MODULE_IDS", "TOML_KEYS", "drop_modules", "fingerprint", "import_class", "message_of",
           "parse_config", "parse_declarations", "version_key"]

MODEL_FILE: Final = "model.toml"
TOML_KEYS: Final = (
    "name", "class", "platform", "versions", "parameters", "max_batch_size", "decoupled", "dynamic_batching"
)
MODULE_IDS: Final = itertools.count(1)
"""Numbers the modules imported from model folders (and each load of a folder), unique in this process."""
_SMALL: Final = 64 * 1024  # files up to this size are fingerprinted by their content too


def message_of(exc: BaseException) -> str:
    """What an exception says: its message, or its type's name."""
    return str(exc) or type(exc).__name__


def fingerprint(folders: Iterable[Path]) -> tuple[object, ...]:
    """What changes when any file under `folders` does: every folder's path, every file's path, size, modification
    time and inode, and the content of the small ones (`model.toml`, python files: an edit within the file system's
    clock tick shows).
    Hidden entries (editors' swap files) and `__pycache__` (written by importing the model) are left out."""
    entries: list[object] = []
    for folder in sorted(folders):
        entries.append(str(folder))
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            entries.extend(os.path.relpath(os.path.join(root, d), folder) + "/" for d in dirs)  # an empty version
            for name in sorted(f for f in files if not f.startswith(".")):
                path = os.path.join(root, name)
                try:
                    stat = os.stat(path)
                    digest = b""
                    if stat.st_size <= _SMALL:
                        with open(path, "rb") as file:
                            digest = hashlib.blake2b(file.read(_SMALL + 1), digest_size=16).digest()
                except OSError:  # gone, or unreadable: its absence is the fingerprint
                    continue
                entries.append((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns, stat.st_ino, digest))
    return tuple(entries)


def version_key(version: str) -> tuple[int, int, str]:
    """Sort key of versions: numeric ones in numeric order and above the others, which sort as text."""
    if version.isascii() and version.isdigit():
        return (1, int(version), "")
    return (0, 0, version)



def parse_config(config: dict[str, Any], folder: Path) -> tuple[str, str | None, list[str], dict[str, Any]]:
    """(class, platform, versions, parameters) of a model.toml; ValueError naming what is wrong."""
    unknown = [key for key in config if key not in TOML_KEYS]
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(TOML_KEYS)}")
    target = config.get("class")
    if not isinstance(target, str) or not re.fullmatch(r"[^:]+:[A-Za-z_][A-Za-z0-9_]*", target):
        raise ValueError(f"'class' must be \"<python file>:<class name>\" (like \"model:MyModel\"), got {target!r}")
    name = config.get("name")
    if name is not None and (not isinstance(name, str) or not name or "/" in name):
        raise ValueError(f"'name' must be a non-empty string without '/', got {name!r}")
    platform = config.get("platform")
    if platform is not None and not isinstance(platform, str):
        raise ValueError(f"'platform' must be a string, got {platform!r}")
    parameters = config.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ValueError(f"'parameters' must be a table, got {parameters!r}")
    declared = config.get("versions")
    if declared is None:
        numeric = [p.name for p in folder.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()]
        versions = sorted(numeric, key=version_key) or ["1"]
    else:
        if not isinstance(declared, list) or not declared:
            raise ValueError(f"'versions' must be a non-empty list of strings, got {declared!r}")
        versions = []
        for item in declared:
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise ValueError(f"'versions' must be a list of strings, got {item!r}")
            version = str(item)
            if version in ("", ".", "..") or "/" in version or version in versions:
                raise ValueError(f"invalid or repeated version {version!r}")
            versions.append(version)
    return target, platform, versions, parameters


def parse_declarations(config: dict[str, Any]) -> dict[str, Any]:
    """The model attributes a model.toml overrides (max_batch_size, decoupled, dynamic_batching); ValueError naming
    what is wrong."""
    out: dict[str, Any] = {}
    if "max_batch_size" in config:
        size = config["max_batch_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"'max_batch_size' must be an integer >= 0, got {size!r}")
        out["max_batch_size"] = size
    if "decoupled" in config:
        if not isinstance(config["decoupled"], bool):
            raise ValueError(f"'decoupled' must be true or false, got {config['decoupled']!r}")
        out["decoupled"] = config["decoupled"]
    if "dynamic_batching" in config:
        table = config["dynamic_batching"]
        if not isinstance(table, dict):
            raise ValueError(f"'dynamic_batching' must be a table, got {table!r}")
        out["dynamic_batching"] = DynamicBatching.of(table)
    return out


def drop_modules(modules: dict[int, list[str]], used: set[int], free: bool = True) -> None:
    """Take out of sys.modules the modules of every load (generation) in `modules` but those `used`, and (`free`)
    free them now: a module is a cycle (its functions refer to its dict) that only a full collection frees, which a
    quiet server may not run for hours while the module holds what its model loaded at import (20 to 50 ms here)."""
    unused = [generation for generation in modules if generation not in used]
    for generation in unused:
        for name in modules.pop(generation):
            sys.modules.pop(name, None)
    if unused and free:
        gc.collect()


def import_class(file: Path, class_name: str, search: Iterable[Path], model: str, modules: list[str]) -> type[Model]:
    """Import `file` as a module of a fresh package (path: `search`) and return its Model subclass."""
    if not file.is_file():
        raise FileNotFoundError(f"no python file {file}")
    package = f"_{__name__.split('.')[0]}_model_{next(MODULE_IDS)}_{re.sub(r'[^0-9A-Za-z_]', '_', model)}"
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [str(p) for p in search]
    parent = importlib.util.module_from_spec(spec)
    sys.modules[package] = parent
    modules.append(package)
    name = f"{package}.{file.stem}"
    module = types.ModuleType(name)
    module.__file__ = str(file)
    module.__package__ = package
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=str(file))
    sys.modules[name] = module
    modules.append(name)
    try:
        code = compile(file.read_bytes(), str(file), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # compiled from the source each time: a reload sees every edit
    except Exception as exc:
        raise ImportError(f"cannot import {file.name}: {type(exc).__name__}: {message_of(exc)}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ImportError(f"{file.name} has no class {class_name!r}")
    if not isinstance(cls, type) or not issubclass(cls, Model):
        raise TypeError(
            f"{class_name} in {file.name} is not a subclass of {Model.__module__}.Model (does {file.name} import "
            f"Model from the package this server runs, `{Model.__module__.rsplit('.', 2)[0]}`?)"
        )
    return cls
