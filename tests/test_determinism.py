"""The same inputs give the same bytes: across processes, hash seeds and output locations."""

from __future__ import annotations

from pathlib import Path

from conftest import oipgen


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_builds_under_different_hash_seeds_are_byte_identical(tmp_path: Path) -> None:
    trees = []
    for seed in ("0", "1", "4242"):
        out = tmp_path / f"seed{seed}"
        result = oipgen("build", "--out", str(out), env={"PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        trees.append(_files(out / "oip"))
    assert trees[0] == trees[1] == trees[2]
    assert len(trees[0]) > 10
