"""Regeneration in other projects' CI: the pre-commit hooks and the documented recipe, on a throwaway project."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import yaml
from conftest import BIN, ROOT, SPEC, oipgen


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


def test_readme_documents_the_ci_recipe() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "oipgen build --check" in readme
    assert ".pre-commit-hooks.yaml" in readme and "id: oipgen-check" in readme
    assert oipgen("--version").stdout.startswith("oipgen ")
