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


@dataclass
class Diff:
    changed: list[str]
    missing: list[str]
    extra: list[str]
    details: list[str]

    @property
    def clean(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def summary(self, limit: int = 40) -> str:
        lines = [f"changed: {p}" for p in self.changed]
        lines += [f"missing: {p}" for p in self.missing]
        lines += [f"extra (not generated): {p}" for p in self.extra]
        body = self.details[:limit]
        if len(self.details) > limit:
            body.append(f"... {len(self.details) - limit} more diff lines")
        return "\n".join(lines + (["", *body] if body else []))


def diff(package_dir: Path, tree: Tree) -> Diff:
    on_disk = set(files_on_disk(package_dir, _beside_roots(tree.files)))
    changed: list[str] = []
    missing: list[str] = []
    details: list[str] = []
    for rel in sorted(tree.files):
        want = tree.files[rel]
        if rel not in on_disk:
            missing.append(rel)
            continue
        have = (package_dir / rel).read_bytes()
        if have != want:
            changed.append(rel)
            if len(details) < 200:
                details += list(
                    difflib.unified_diff(
                        have.decode("utf-8", "replace").splitlines(),
                        want.decode("utf-8", "replace").splitlines(),
                        f"{rel} (on disk)",
                        f"{rel} (from spec)",
                        n=1,
                        lineterm="",
                    )
                )[:60]
    extra = sorted(on_disk - set(tree.files))
    return Diff(changed, missing, extra, details)


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
