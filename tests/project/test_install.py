"""oipgen installed from its wheel, used in an empty project folder as a new user would: the standard spec and the
templates ship inside the distribution, so `oipgen build` and `oipgen scaffold model` need no checkout of oipgen,
and `oipgen spec export` hands out the spec to own; at the declared floors of its requirements it writes the same
package. The venvs holding oipgen's requirements are cached (tests/venvs.py); the wheel is built and reinstalled
on each run (timings: see test_dist.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import GENERATED, ROOT, SPEC
from venvs import cached_venv, pip, run


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def oipgen_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("oipgen-wheel")
    result = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom hatchling.build import build_wheel\nprint(build_wheel(sys.argv[1]))",
         str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out / result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def venv(oipgen_wheel: Path) -> Path:
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    venv = cached_venv("oipgen", requirements)
    pip(venv, "--no-deps", "--force-reinstall", str(oipgen_wheel))
    return venv


def test_the_build_at_the_declared_floors(oipgen_wheel: Path, tmp_path: Path) -> None:
    """oipgen at the lowest version of every requirement it declares (its writers are pinned) writes exactly the
    committed package too."""
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = sorted(re.sub(r">=([\w.]+).*", r"==\1", requirement) for requirement in requirements)
    assert all("==" in pinned and "<" not in pinned for pinned in floors), floors
    venv = cached_venv("oipgen-floors", floors)
    pip(venv, "--no-deps", "--force-reinstall", str(oipgen_wheel))
    result = oipgen(venv, tmp_path, "build", "--out", "out", "--quiet")
    assert result.returncode == 0, result.stderr
    assert _files(tmp_path / "out") == _files(GENERATED)


def oipgen(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "oipgen"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin"})


def test_the_wheel_holds_the_spec_and_the_templates(oipgen_wheel: Path) -> None:
    names = set(zipfile.ZipFile(oipgen_wheel).namelist())
    for rel in _files(SPEC):
        assert f"oipgen/spec/{rel}" in names, rel
    for rel in _files(ROOT / "templates"):
        assert f"oipgen/templates/{rel}" in names, rel


def test_build_and_scaffold_in_an_empty_folder(venv: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    result = oipgen(venv, project, "build", "--out", "vendor", "--package", "acme_oip")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((project / "vendor" / "acme_oip" / "_oipgen_manifest.json").read_text())
    golden = json.loads((GENERATED / "oip" / "_oipgen_manifest.json").read_text())
    assert manifest["spec_sha256"] == golden["spec_sha256"] and manifest["spec_files"] == golden["spec_files"]
    assert (project / "vendor" / "pyproject.toml").is_file()
    assert oipgen(venv, project, "build", "--out", "vendor", "--package", "acme_oip", "--check").returncode == 0

    # The installed oipgen writes exactly the committed package: its spec and templates are this checkout's.
    result = oipgen(venv, project, "build", "--out", "out", "--quiet")
    assert result.returncode == 0, result.stderr
    assert _files(project / "out") == _files(GENERATED)

    result = oipgen(venv, project, "scaffold", "model", "doubler", "--input", "X:FP32:-1", "--output", "Y:FP32:-1")
    assert result.returncode == 0, result.stderr
    model = (project / "models" / "doubler" / "model.py").read_text()
    assert 'TensorSpec("X", "FP32", [-1])' in model and "from oip.server import" in model
    result = oipgen(venv, project, "scaffold", "model", "bad", "--input", "X:FP99:-1")
    assert result.returncode == 1 and "unknown datatype 'FP99'" in result.stderr  # the bundled datatype table

    # Where the data came from: the installed distribution, not this checkout.
    where = run(venv, "from oipgen import bundled, render; print(bundled.builtin_spec()); "
                      "print(render.builtin_templates())", cwd=project).stdout.split()
    assert all(Path(path).resolve().is_relative_to(venv.resolve()) for path in where), where  # .cache may be a link


def test_spec_export_and_a_project_spec(venv: Path, tmp_path: Path) -> None:
    result = oipgen(venv, tmp_path, "spec", "export", "protocol")
    assert result.returncode == 0, result.stderr
    assert _files(tmp_path / "protocol") == _files(SPEC)
    (tmp_path / "protocol" / "openapi.yaml").write_text("changed")
    result = oipgen(venv, tmp_path, "spec", "export", "protocol")
    assert result.returncode == 1 and "nothing was written" in result.stderr
    assert (tmp_path / "protocol" / "openapi.yaml").read_text() == "changed"  # never overwritten

    (tmp_path / "protocol" / "openapi.yaml").write_bytes((SPEC / "openapi.yaml").read_bytes())
    (tmp_path / "spec").mkdir()  # an unrelated empty ./spec is not used when [tool.oipgen] names the spec
    (tmp_path / "pyproject.toml").write_text('[tool.oipgen]\nspec = "protocol"\nout = "src"\ntargets = ["models"]\n')
    result = oipgen(venv, tmp_path, "build")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "src" / "oip" / "models.py").is_file() and not (tmp_path / "src" / "pyproject.toml").exists()
    result = oipgen(venv, tmp_path, "build", "--spec", "spec")
    assert result.returncode == 2 and "spec" in result.stderr  # --spec wins, and an empty spec is a problem
