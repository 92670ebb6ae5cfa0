"""Regeneration in other projects' CI: the pre-commit hooks and the documented recipe, on a throwaway project."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml
from conftest import BIN, ROOT, SPEC, oipgen
from venvs import cached_venv


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "acme"
    shutil.copytree(SPEC, project / "protocol")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "acme"\nversion = "1.0"\n\n'
        '[tool.oipgen]\nspec = "protocol"\nout = "src"\npackage = "acme_oip"\n'
    )
    return project


def _hook(hook_id: str) -> list[str]:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    hook = hooks[hook_id]
    assert hook["pass_filenames"] is False and hook["language"] == "python"
    argv = shlex.split(hook["entry"])
    assert argv[0] == "oipgen"
    return [str(BIN / "oipgen"), *argv[1:]]


def test_hooks_keep_a_vendored_copy_in_step_with_its_spec(tmp_path: Path) -> None:
    import subprocess

    project = _project(tmp_path)
    check, build = _hook("oipgen-check"), _hook("oipgen-build")

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=300)

    assert run(check).returncode == 1  # nothing vendored yet
    assert run(build).returncode == 0
    assert (project / "src" / "acme_oip" / "convert.py").exists()
    assert run(check).returncode == 0

    # The spec changes upstream: the check fails and names what is stale; the build hook mends it.
    proto = project / "protocol" / "grpc_service.proto"
    text = proto.read_text().replace("message ServerLiveRequest {", "message Ping {}\n\nmessage ServerLiveRequest {", 1)
    proto.write_text(text)
    stale = run(check)
    assert stale.returncode == 1 and "changed: grpc/grpc_service_pb2.py" in stale.stderr
    # Only what the change reaches is stale: the runtime modules and the REST models are not.
    assert "changed: server/core/dataplane.py" not in stale.stderr and "changed: models.py" not in stale.stderr
    assert run(build).returncode == 0
    assert run(check).returncode == 0


def test_a_changed_golden_example_rewrites_only_the_cases(tmp_path: Path) -> None:
    """The spec's hash lives in the manifest only: a golden example that changes makes the golden cases stale
    (package data) and nothing else, not every file that once carried the hash."""
    import subprocess

    project = _project(tmp_path)
    check, build = _hook("oipgen-check"), _hook("oipgen-build")
    assert subprocess.run(build, cwd=project, capture_output=True, text=True, timeout=300).returncode == 0
    example = project / "protocol" / "examples" / "server_live.yaml"
    text = example.read_text()
    assert "summary:" in text
    example.write_text(text.replace("summary:", "summary: Changed.", 1))
    stale = subprocess.run(check, cwd=project, capture_output=True, text=True, timeout=300)
    assert stale.returncode == 1
    changed = sorted(line.split("changed: ", 1)[1] for line in stale.stderr.splitlines() if "changed: " in line)
    assert changed == ["_oipgen_manifest.json", "conformance.json"], stale.stderr


# --- the recipes of docs/install.md, run as printed ----------------------------------------------------------

INSTALL_PAGE = ROOT / "docs" / "install.md"


def _yaml_block(marker: str) -> str:
    """The one yaml block of docs/install.md (the page the user reads) whose text holds `marker`."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", INSTALL_PAGE.read_text(), re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if marker in b]
    return block


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=acme", "-c", "user.email=acme@localhost", *args], cwd=repo,
                          capture_output=True, text=True, check=True, timeout=120)
    return done.stdout


def _break_the_spec(project: Path) -> None:
    """A change that breaks clients (a field renumbered) and leaves the vendored copy stale."""
    proto = project / "protocol" / "grpc_service.proto"
    text = proto.read_text()
    old = "message ModelMetadataRequest {\n  // Model name.\n  string name = 1;"
    assert old in text
    proto.write_text(text.replace(old, old.replace("= 1;", "= 7;")))


def test_the_ci_workflow_runs_as_printed(tmp_path: Path) -> None:
    """The workflow's `run:` steps, word for word, in a throwaway project: oipgen installed from a git URL pinned to
    a commit (this checkout's HEAD, in place of the URL the reader fills in), the check and the breaking-change
    gate passing on a current copy and failing on a stale copy and a breaking spec."""
    workflow = yaml.safe_load(_yaml_block("jobs:"))
    pinned = workflow["env"]["OIPGEN"]
    assert re.fullmatch(r"git\+https://\S+@[0-9a-f]{40}", pinned), pinned  # a git URL pinned to a full commit
    steps = [step["run"] for step in workflow["jobs"]["oip"]["steps"] if "run" in step]
    assert [s.split()[:2] for s in steps] == [["pip", "install"], ["oipgen", "build"], ["oipgen", "breaking"]]

    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    venv = cached_venv("oipgen-recipe", requirements)  # what CI's runner caches: oipgen's requirements
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y", "oipgen"],
                   capture_output=True, timeout=120)
    head = _git(ROOT, "rev-parse", "HEAD").strip()
    # The reader's URL is theirs to fill in; here it is this checkout (git+file needs a host for pip to parse it).
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OIPGEN": f"git+file://localhost{ROOT}@{head}",
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}

    def step(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-ec", command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)

    project = _project(tmp_path)
    installed = step(steps[0], project)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import oipgen; print(oipgen.__file__)"],
                           capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert Path(where.stdout.strip()).resolve().is_relative_to(venv.resolve()), where  # installed, not this checkout
    assert step("oipgen build --quiet", project).returncode == 0  # the project vendors its copy
    origin = tmp_path / "origin.git"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "acme vendors the OIP package")
    _git(project, "remote", "add", "origin", str(origin))
    _git(project, "push", "-q", "origin", "main")
    checkout = tmp_path / "checkout"  # actions/checkout with fetch-depth: 0
    _git(tmp_path, "clone", "-q", str(origin), str(checkout))
    for command in steps[1:]:
        result = step(command, checkout)
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr[-3000:]}"

    _break_the_spec(checkout)
    check, breaking = (step(command, checkout) for command in steps[1:])
    assert check.returncode == 1 and "changed: grpc/grpc_service_pb2.py" in check.stderr, check.stderr[-3000:]
    assert breaking.returncode == 1 and "inference.ModelMetadataRequest" in breaking.stdout, breaking.stdout


def test_the_pre_commit_hooks_run_as_printed(tmp_path: Path) -> None:
    """docs/install.md's .pre-commit-config.yaml, byte for byte, run by pre-commit with this checkout's oipgen on
    PATH: both hooks pass on a current copy and fail on a stale copy and a breaking spec."""
    config = _yaml_block("repos:")
    hooks = yaml.safe_load(config)["repos"][0]["hooks"]
    assert [h["id"] for h in hooks] == ["oipgen-check", "oipgen-breaking"]
    pre_commit = cached_venv("pre-commit", ["pre-commit>=4,<5"])
    project = _project(tmp_path)
    (project / ".pre-commit-config.yaml").write_text(config)
    assert oipgen("build", "--quiet", cwd=project).returncode == 0
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "acme vendors the OIP package")
    _git(project, "update-ref", "refs/remotes/origin/main", "HEAD")
    env = {"PATH": f"{BIN}:{pre_commit / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["pre-commit", "run", "--all-files"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=600)

    current = run()
    assert current.returncode == 0, current.stdout[-3000:] + current.stderr[-3000:]
    assert current.stdout.count("Passed") == 2, current.stdout
    _break_the_spec(project)
    stale = run()
    assert stale.returncode == 1, stale.stdout[-3000:]
    assert stale.stdout.count("Failed") == 2, stale.stdout
    assert "changed: grpc/grpc_service_pb2.py" in stale.stdout and "inference.ModelMetadataRequest" in stale.stdout


def test_the_hooks_file_pins_by_commit() -> None:
    """.pre-commit-hooks.yaml (for `repo: URL`) tells users to pin a commit: oipgen has no release tags."""
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "commit" in text and "version" not in text
    assert oipgen("--version").stdout.startswith("oipgen ")
