"""Virtual environments the suite installs packages into from the package index, cached under `.cache/venvs/`
(git-ignored) and keyed by what they hold, so that a second run reuses them.

`cached_venv(name, requirements)` returns a venv holding exactly `requirements` (requirement strings). It is
built once per key (the requirements and the Python version),
under a lock (concurrent sessions wait for each other), and marked complete only when pip succeeded, so an
interrupted install is redone. When the index cannot be reached the test fails with pip's message: CI has the
index, so a missing package is an error there, not a skip. `rm -rf .cache` starts over (newest versions again).

The requirements go in with uv (a dev dependency: a fresh clone builds every venv here, and uv does in seconds
what pip does in a minute); what `install` names, the distribution under test, goes in with pip, as users
install it. uv compiles the bytecode, as pip does (otherwise every process that imports the libraries
compiles them again). Without uv beside this python, pip installs everything.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import ROOT

CACHE = Path(os.environ.get("OIP_TEST_VENVS") or ROOT / ".cache" / "venvs")
INSTALL_TIMEOUT = 900.0
PIP = ("-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input")
UV = Path(sys.executable).parent / "uv"


def key(requirements: Sequence[str]) -> str:
    h = hashlib.sha256(f"{sys.version_info[:3]}\n".encode())
    for item in sorted(requirements):
        h.update(item.encode() + b"\n")
    return h.hexdigest()[:16]


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def cached_venv(name: str, requirements: Sequence[str], *, install: Sequence[str] | None = None,
                timeout: float = INSTALL_TIMEOUT) -> Path:
    """A venv holding `requirements`, from the cache or built now (see the module's documentation). `install`:
    what pip installs when the venv is built, if not `requirements` themselves (a local distribution whose
    requirements `requirements` lists, say: the key then follows its requirements, not its code)."""
    venv = CACHE / f"{name}-{key(requirements)}"
    done = venv / ".installed"
    if done.is_file():
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        steps = [[*installer(venv), *requirements]] if install is None or UV.is_file() else []
        if install is not None:
            steps.append([str(python(venv)), *PIP, *install])
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, timeout=timeout)
            if result.returncode != 0:
                pytest.fail(f"could not install {' '.join(requirements)} into {venv} from the package index (these "
                            f"tests need the index; CI has it):\n{result.stderr[-3000:]}", pytrace=False)
        (venv / "requirements.txt").write_text("\n".join(requirements if install is None else install) + "\n")
        done.write_text("")
    return venv


def installer(venv: Path) -> list[str]:
    """The command line that installs requirements into `venv` (its arguments follow): uv's, or pip's without
    uv beside this python."""
    if UV.is_file():
        return [str(UV), "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python(venv))]
    return [str(python(venv)), *PIP]


def pip(venv: Path, *args: str, timeout: float = INSTALL_TIMEOUT) -> None:
    """`pip install ARGS` into `venv` (the package's own wheel, on each run); fails the test when pip does."""
    result = subprocess.run([str(python(venv)), *PIP, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"pip install {' '.join(args)} failed in {venv}:\n{result.stderr[-3000:]}", pytrace=False)


def installed(venv: Path) -> dict[str, str]:
    """Distribution name (normalized) -> version, of everything in `venv`."""
    out = run(venv, """
        import importlib.metadata as m, json, re
        print(json.dumps({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in m.distributions()}))
    """)
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


def run(venv: Path, code: str, *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `code` with the venv's python (nothing of this process's environment but PATH and what `env` adds);
    fails the test, with its output, when it exits other than 0."""
    result = subprocess.run([str(python(venv)), "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                            text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", **(env or {})})
    if result.returncode != 0:
        pytest.fail(f"{python(venv)} exited with {result.returncode}:\n{result.stdout[-3000:]}\n"
                    f"{result.stderr[-5000:]}", pytrace=False)
    return result
