"""The generated tree: its manifest, writing it without touching anything else, and checking it is current.

This module imports nothing heavy, so that `oipgen build --check` on an up-to-date tree answers in about the
time the interpreter takes to start: it compares the manifest's input hash and file hashes, and only when they
disagree does the caller rebuild in memory for a real diff.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import posixpath
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "_oipgen_manifest.json"
# Paths are relative to the package directory; one starting with BESIDE names a file beside the package, in the
# output directory (`../deploy/Containerfile` is `<out>/deploy/Containerfile`). The manifest lists those too, so
# --check, the golden record and removal of files no longer generated cover them like the package's own.
BESIDE = "../"
_IGNORED_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache"}
_IGNORED_SUFFIXES = {".pyc", ".pyo"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_plain(path: str) -> bool:
    """The one rule for a path of the tree, written by a target or read back from a manifest: relative, normalized,
    no `..` (beyond the one BESIDE prefix), so that it lands inside the output folder."""
    inner = path.removeprefix(BESIDE)
    return bool(inner) and posixpath.normpath(inner) == inner and not inner.startswith(("/", ".."))


class UnsafePathError(ValueError):
    """A path that would leave the output folder: listed in a manifest, or reached through a symlink."""


def landing(package_dir: Path, rel: str) -> Path:
    """Where a tree path lands on disk, held inside the output folder: the folder that will hold it, symlinks
    followed, is the output folder or inside it."""
    out = package_dir.parent.resolve()
    target = Path(display(package_dir, rel))
    folder = target.parent.resolve()
    if folder != out and out not in folder.parents:
        raise UnsafePathError(f"{target} leads outside {package_dir.parent} (through a symlink to {folder})")
    return target


@dataclass
class Tree:
    """Files of one generated package, by path relative to the package directory."""

    files: dict[str, bytes] = field(default_factory=dict)

    def add(self, path: str, content: str | bytes) -> None:
        if not is_plain(path):
            raise ValueError(f"not a plain relative path: {path!r}")
        if path in self.files:
            raise ValueError(f"two targets write {path}")
        self.files[path] = content.encode("utf-8") if isinstance(content, str) else content

    def add_beside(self, path: str, content: str | bytes) -> None:
        """A file beside the package, in the output directory: `deploy/Containerfile` is
        `<out>/deploy/Containerfile`."""
        self.add(BESIDE + path, content)


def display(package_dir: Path, rel: str) -> str:
    """Where a tree path lands, for messages (`generated/deploy/Containerfile`, not `generated/oip/../deploy/...`)."""
    return posixpath.normpath((package_dir / rel).as_posix())


def _beside_roots(paths: Iterable[str]) -> set[str]:
    """The top-level folders (or files) beside the package that `paths` write into: the places scanned for
    extra files."""
    return {BESIDE + p.removeprefix(BESIDE).split("/")[0] for p in paths if p.startswith(BESIDE)}


def manifest_bytes(meta: dict[str, Any], tree: Tree) -> bytes:
    doc = {**meta, "files": {p: sha256(tree.files[p]) for p in sorted(tree.files)}}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def read_manifest(package_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((package_dir / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def listed_files(package_dir: Path, manifest: dict[str, Any] | None) -> dict[str, str]:
    """The files a manifest lists, by tree path, each held to the rule of the paths the build writes: the manifest
    is repository content that anyone may edit, and the build removes what it lists. UnsafePathError names the
    first entry that breaks the rule."""
    files = (manifest or {}).get("files")
    if not isinstance(files, dict):
        return {}
    for rel in files:
        if not is_plain(rel):
            raise UnsafePathError(f"{package_dir / MANIFEST} lists {rel!r}, which is not a plain relative path "
                                  f"inside {package_dir.parent}")
    return {rel: str(digest) for rel, digest in files.items()}


def files_on_disk(package_dir: Path, beside: set[str] | None = None) -> list[str]:
    """Every file of the package directory, and of the `beside` roots (`../deploy`: that folder beside the
    package, or that one file), as tree paths."""
    out = []
    roots = [(package_dir, "")] + [(package_dir / root, root) for root in sorted(beside or ())]
    for top, prefix in roots:
        if top.is_file():
            out.append(prefix)
            continue
        if not top.is_dir():
            continue
        for p in top.rglob("*"):
            rel = p.relative_to(top)
            if p.is_dir() or _IGNORED_DIRS & set(rel.parts) or p.suffix in _IGNORED_SUFFIXES:
                continue
            out.append(f"{prefix}/{rel.as_posix()}" if prefix else rel.as_posix())
    return sorted(out)


def is_current(package_dir: Path, inputs_hash: str) -> bool:
    """True when the manifest was made from these inputs and every file on disk is exactly what it lists."""
    manifest = read_manifest(package_dir)
    if manifest is None or manifest.get("inputs_sha256") != inputs_hash:
        return False
    try:
        listed = listed_files(package_dir, manifest)
    except UnsafePathError:
        return False
    if not listed:
        return False
    if files_on_disk(package_dir, _beside_roots(listed)) != sorted([*listed, MANIFEST]):
        return False
    for rel, digest in listed.items():
        try:
            if sha256((package_dir / rel).read_bytes()) != digest:
                return False
        except OSError:
            return False
    return True


# Bounds of the --check report, so that a CI log shows it whole: lines cut at _WIDTH characters, at most _PER_FILE
# diff lines per file and about _DETAILS in all (the files after that are counted), _LISTED paths per kind
# (changed, missing, extra); a file of more than _DIFFABLE_LINES lines is not diffed.
_WIDTH = 160
_PER_FILE = 24
_DETAILS = 60
_LISTED = 20
_DIFFABLE_LINES = 20_000


@dataclass
class Diff:
    changed: list[str]
    missing: list[str]
    extra: list[str]
    details: list[str]
    manifest: str | None = None  # how the manifest differs, in one line; None when it does not

    @property
    def clean(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def summary(self) -> str:
        """Changed, missing and extra files, a diff of each change (descriptors at the proto level), and last the
        manifest's difference in one line."""
        lines: list[str] = []
        kinds = (("changed", self.changed), ("missing", self.missing), ("extra (not generated)", self.extra))
        for kind, paths in kinds:
            lines += [f"{kind}: {p}" for p in paths[:_LISTED]]
            if len(paths) > _LISTED:
                lines.append(f"... and {len(paths) - _LISTED} more {kind.split()[0]}")
        tail = [f"{MANIFEST}: {self.manifest}"] if self.manifest else []
        return "\n".join(lines + (["", *self.details] if self.details else []) + tail)


def diff(package_dir: Path, tree: Tree) -> Diff:
    on_disk = set(files_on_disk(package_dir, _beside_roots(tree.files)))
    changed: list[str] = []
    missing: list[str] = []
    details: list[str] = []
    manifest = None
    unshown = 0
    for rel in sorted(tree.files):
        want = tree.files[rel]
        if rel not in on_disk:
            missing.append(rel)
            continue
        have = (package_dir / rel).read_bytes()
        if have == want:
            continue
        changed.append(rel)
        if rel == MANIFEST:
            manifest = _manifest_change(have, want)
        elif len(details) < _DETAILS:
            old_lines, new_lines = _readable(rel, have), _readable(rel, want)
            if max(len(old_lines), len(new_lines)) > _DIFFABLE_LINES:  # difflib's time grows with the square
                details.append(f"{rel}: {len(old_lines)} lines on disk, {len(new_lines)} from the spec: too many to "
                               "diff here")
                continue
            lines = difflib.unified_diff(old_lines, new_lines, f"{rel} (on disk)", f"{rel} (from spec)", n=1,
                                         lineterm="")
            shown = [_cut(line) for line in lines]
            room = min(_PER_FILE, _DETAILS - len(details))
            details += shown[:room]
            if len(shown) > room:
                details.append(f"... {len(shown) - room} more lines of this diff")
        else:
            unshown += 1
    if unshown:
        details.append(f"... the diffs of {unshown} more changed file(s) are not shown")
    extra = sorted(on_disk - set(tree.files))
    return Diff(changed, missing, extra, details, manifest)


def _cut(line: str) -> str:
    return line if len(line) <= _WIDTH else f"{line[:_WIDTH]}... ({len(line) - _WIDTH} more characters)"


def _manifest_change(have: bytes, want: bytes) -> str:
    """How the manifest on disk differs from the one the spec generates, in one line: the keys, and for tables
    (files, spec_files...) how many entries, instead of the hash lines."""
    try:
        old = json.loads(have)
        new = json.loads(want)
    except ValueError:
        return "unreadable on disk"
    if not isinstance(old, dict) or not isinstance(new, dict):
        return "unreadable on disk"
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            count = sum(a.get(k) != b.get(k) for k in set(a) | set(b))
            parts.append(f"{key} ({count} {'entry' if count == 1 else 'entries'})")
        else:
            parts.append(key)
    return f"differs in {', '.join(parts)}" if parts else "differs in formatting"


def _readable(rel: str, data: bytes) -> list[str]:
    """A file's lines as the --check diff shows them. In a protoc module (`*_pb2.py`) the serialized descriptor
    is shown at the proto level, one line per field (`oipgen.breaking.proto_view`), and the byte offsets into it
    as one line; everything else as it is."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if not rel.endswith("_pb2.py"):
        return lines
    from .breaking import descriptor_view

    found = _serialized_descriptor(text)
    if found is not None:
        start, end, blob = found
        view = descriptor_view(blob)
        if view is not None:
            lines = [*lines[:start - 1], *(f"# descriptor: {line}" for line in view), *lines[end:]]
    offsets = [line for line in lines if "._serialized_start=" in line or "._serialized_end=" in line]
    if offsets:
        digest = sha256("\n".join(offsets).encode())[:12]
        first = lines.index(offsets[0])
        drop = set(offsets)
        kept = [line for line in lines if line not in drop]
        kept.insert(first, f"# {len(offsets)} offsets into the serialized descriptor (sha256 {digest})")
        lines = kept
    return lines


def _serialized_descriptor(text: str) -> tuple[int, int, bytes] | None:
    """The first and last line of the `AddSerializedFile(b'...')` call of a protoc module, and its bytes, read
    from the syntax tree (never executed)."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # the parser's answers to a hostile module
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bytes)):
            return node.lineno, node.end_lineno or node.lineno, node.args[0].value
    return None


def write(package_dir: Path, tree: Tree) -> list[tuple[str, str]]:
    """Write the tree; return (action, path) for each file touched.

    Unchanged files are left alone (their mtimes too); files the previous manifest listed that are no longer
    generated are removed; nothing else in the directory is ever deleted. A file beside the package that exists,
    differs and is not listed in the previous manifest (a project's own pyproject.toml, say) is never overwritten:
    FileExistsError, and nothing is written. Every path, written or removed, must land inside the output folder
    (UnsafePathError, and nothing is written or removed).
    """
    previous = set(listed_files(package_dir, read_manifest(package_dir)))
    targets = {rel: landing(package_dir, rel) for rel in sorted(set(tree.files) | previous)}
    for rel in sorted(tree.files):  # a file beside the package that someone else wrote is never overwritten
        target = targets[rel]
        if rel.startswith(BESIDE) and rel not in previous and target.exists() and (
                not target.is_file() or target.read_bytes() != tree.files[rel]):
            raise FileExistsError(f"{target} exists and was not written by oipgen; nothing was written (choose "
                                  f"another output folder, or leave out the target that writes it)")
    actions: list[tuple[str, str]] = []
    for rel in sorted(tree.files):
        target = targets[rel]
        data = tree.files[rel]
        if target.is_file() and not target.is_symlink() and target.read_bytes() == data:
            continue
        actions.append(("updated" if target.exists() else "created", rel))
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace(target, data)
    for rel in sorted(previous - set(tree.files)):
        target = targets[rel]
        if target.is_file() or target.is_symlink():
            target.unlink()
            actions.append(("removed", rel))
    return actions


def extra_files(package_dir: Path, tree: Tree) -> list[str]:
    """The files in the places the tree writes (the package folder, the folders beside it) that it does not hold:
    what --check reports as extra and --prune removes."""
    return sorted(set(files_on_disk(package_dir, _beside_roots(tree.files))) - set(tree.files))


def prune(package_dir: Path, extra: list[str]) -> list[tuple[str, str]]:
    """Remove `extra` (from extra_files), and the folders that leaves empty; return ("pruned", path) for each file.
    Every path is checked to land inside the output folder before anything is removed (UnsafePathError)."""
    targets = [(rel, landing(package_dir, rel)) for rel in extra]
    roots = {package_dir.resolve(), package_dir.parent.resolve()}
    actions = []
    for rel, target in targets:
        if not (target.is_file() or target.is_symlink()):  # removed already, as listed by the previous manifest
            continue
        target.unlink()
        actions.append(("pruned", rel))
        folder = target.parent
        while folder.resolve() not in roots and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return actions


def _replace(target: Path, data: bytes) -> None:
    """Write `data` to a file of a fresh name in the target's folder, created exclusively (a name planted there,
    a symlink say, is never followed), then rename it over the target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.oipgen-tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
