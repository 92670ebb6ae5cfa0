"""The same inputs give the same bytes: across processes, hash seeds and output locations."""

from __future__ import annotations

from pathlib import Path

from conftest import GENERATED, SPEC, oipgen


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


def test_the_current_folders_pyproject_does_not_change_the_output(tmp_path: Path) -> None:
    """Formatter settings of the project oipgen runs in (its ruff, black or isort line length) leave the bytes alone."""
    (tmp_path / "pyproject.toml").write_text('[tool.ruff]\nline-length = 60\n[tool.black]\nline-length = 60\n'
                                             '[tool.isort]\nline_length = 60\n')
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", "--target", "models", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "oip" / "models.py").read_bytes() == (GENERATED / "oip" / "models.py").read_bytes()
