"""Files beside the package (`<out>/deploy/...`, `<out>/pyproject.toml`): written, listed in the package's
manifest, checked by --check and removed when no longer generated, like the package's own files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import SPEC, oipgen

from oipgen.output import MANIFEST, Tree, diff, display, files_on_disk, is_current, manifest_bytes, write


def _tree(**beside: str) -> Tree:
    tree = Tree()
    tree.add("__init__.py", "# package\n")
    for path, text in beside.items():
        tree.add_beside(path.replace("__", "/"), text)
    tree.add(MANIFEST, manifest_bytes({"inputs_sha256": "x"}, tree))
    return tree


def test_files_beside_the_package_are_written_listed_and_checked(tmp_path: Path) -> None:
    package = tmp_path / "out" / "pkg"
    tree = _tree(deploy__Containerfile="FROM x\n", deploy__kserve__runtime_yaml="kind: X\n", top_toml="[a]\n")
    actions = write(package, tree)
    assert ("created", "../deploy/Containerfile") in actions
    assert (tmp_path / "out" / "deploy" / "Containerfile").read_text() == "FROM x\n"
    assert (tmp_path / "out" / "deploy" / "kserve" / "runtime_yaml").exists()
    assert (tmp_path / "out" / "top_toml").read_text() == "[a]\n"
    listed = json.loads((package / MANIFEST).read_text())["files"]
    assert "../deploy/Containerfile" in listed and "../top_toml" in listed
    assert is_current(package, "x")
    assert diff(package, tree).clean
    assert display(package, "../deploy/Containerfile") == (tmp_path / "out" / "deploy" / "Containerfile").as_posix()


def test_check_sees_changed_missing_and_extra_files_beside_the_package(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tree = _tree(deploy__Containerfile="FROM x\n", deploy__ray__app_py="app = 1\n")
    write(out / "pkg", tree)
    (out / "deploy" / "Containerfile").write_text("FROM y\n")
    assert not is_current(out / "pkg", "x")
    (out / "deploy" / "Containerfile").write_text("FROM x\n")
    (out / "deploy" / "ray" / "leftover.py").write_text("\n")
    assert not is_current(out / "pkg", "x")
    (out / "deploy" / "ray" / "app_py").unlink()
    (out / "unrelated.txt").write_text("not ours, never scanned\n")
    d = diff(out / "pkg", tree)
    assert d.missing == ["../deploy/ray/app_py"]
    assert d.extra == ["../deploy/ray/leftover.py"]
    assert "../unrelated.txt" not in files_on_disk(out / "pkg", {"../deploy"})


def test_files_no_longer_generated_beside_the_package_are_removed_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out / "pkg", _tree(deploy__Containerfile="FROM x\n", top_toml="[a]\n"))
    (out / "deploy" / "mine.txt").write_text("user file\n")
    actions = write(out / "pkg", _tree())
    assert ("removed", "../deploy/Containerfile") in actions and ("removed", "../top_toml") in actions
    assert not (out / "deploy" / "Containerfile").exists() and not (out / "top_toml").exists()
    assert (out / "deploy" / "mine.txt").read_text() == "user file\n"


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/x", "a//b", "./a", ""])
def test_paths_stay_plain_and_relative(path: str) -> None:
    with pytest.raises(ValueError, match="plain relative path"):
        Tree().add_beside(path, "x")


# --- a build that stays in its folder: through the command line, in a tmp project ----------------------------------


def _built(tmp_path: Path) -> Path:
    """A tmp project built with the repository's spec: returns its output folder (`out/oip`, `out/deploy`...)."""
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "out"


def _list_in_manifest(package: Path, *paths: str) -> None:
    doc = json.loads((package / MANIFEST).read_text())
    doc["files"].update({p: "0" * 64 for p in paths})
    (package / MANIFEST).write_text(json.dumps(doc))


@pytest.mark.parametrize("entry", ["../../victim", "ABSOLUTE", "../deploy/../../victim"])
def test_a_manifest_entry_outside_the_output_folder_is_an_error_and_nothing_is_deleted(
        tmp_path: Path, entry: str) -> None:
    out = _built(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not the build's\n")
    entry = str(victim) if entry == "ABSOLUTE" else entry
    stale = out / "oip" / "stale_module.py"  # listed and no longer generated: removed by a sound build
    stale.write_text("x = 1\n")
    _list_in_manifest(out / "oip", entry, "stale_module.py")
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", cwd=tmp_path)
    assert result.returncode == 1
    assert repr(entry) in result.stderr and "nothing was written or removed" in result.stderr
    assert "Traceback" not in result.stderr
    assert victim.read_text() == "not the build's\n"
    assert stale.exists()
    check = oipgen("build", "--check", "--spec", str(SPEC), "--out", "out", cwd=tmp_path)
    assert check.returncode == 1 and victim.exists()


def test_a_planted_tmp_symlink_is_not_followed(tmp_path: Path) -> None:
    out = _built(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not the build's\n")
    models = out / "oip" / "models.py"
    good = models.read_bytes()
    models.write_text("# stale\n")  # so that the build writes models.py again
    (out / "oip" / "models.py.oipgen-tmp").symlink_to(victim)
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "not the build's\n"
    assert models.read_bytes() == good and not models.is_symlink()
    assert not list((out / "oip").glob(".models.py.*.oipgen-tmp"))  # its own temporary file is gone


def test_a_symlinked_folder_leading_out_of_the_output_folder_is_refused(tmp_path: Path) -> None:
    out = _built(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(out / "deploy", elsewhere)
    (out / "deploy").symlink_to(elsewhere)
    containerfile = elsewhere / "Containerfile"
    containerfile.write_text("FROM mine\n")
    stale = elsewhere / "old.txt"
    stale.write_text("mine\n")
    _list_in_manifest(out / "oip", "../deploy/old.txt")
    result = oipgen("build", "--spec", str(SPEC), "--out", "out", cwd=tmp_path)
    assert result.returncode == 1
    assert "leads outside" in result.stderr and "nothing was written or removed" in result.stderr
    assert containerfile.read_text() == "FROM mine\n" and stale.exists()


# --- --check a person can read in a CI log, and --prune ------------------------------------------------------------


def _project(tmp_path: Path) -> Path:
    """A tmp project with its own copy of the spec in `myspec/`, built into `out/` by a relative --spec."""
    shutil.copytree(SPEC, tmp_path / "myspec")
    result = oipgen("build", "--spec", "myspec", "--out", "out", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path


def _renumber_platform(project: Path, number: int) -> None:
    proto = project / "myspec" / "grpc_service.proto"
    text = proto.read_text()
    assert text.count("  string platform = 3;\n") == 1
    proto.write_text(text.replace("  string platform = 3;\n", f"  string platform = {number};\n"))


def test_check_shows_a_renumbered_field_at_the_proto_level_in_a_few_kilobytes(tmp_path: Path) -> None:
    project = _project(tmp_path)
    _renumber_platform(project, 33)
    result = oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project)
    assert result.returncode == 1
    report = result.stderr
    assert len(report.encode()) < 3 * 1024, len(report.encode())
    lines = report.splitlines()
    assert "changed: grpc/grpc_service_pb2.py" in lines
    assert "-# descriptor: message inference.ModelMetadataResponse field platform = 3: string" in lines
    assert "+# descriptor: message inference.ModelMetadataResponse field platform = 33: string" in lines
    assert "AddSerializedFile" not in report and "\\x" not in report  # no serialized descriptor bytes
    assert not re.search(r"[0-9a-f]{64}", report)  # no hash lines: the manifest is one summary line
    [manifest] = [i for i, line in enumerate(lines) if line.startswith(f"{MANIFEST}: ")]
    assert lines[manifest] == (f"{MANIFEST}: differs in descriptors, files (1 entry), inputs_sha256, "
                               "spec_files (1 entry), spec_sha256")
    assert all(not line.startswith(("-", "+", "@@", " ")) for line in lines[manifest:])  # after every diff line
    assert lines[-1] == "oipgen: to fix it, run: oipgen build --spec myspec --out out"
    assert "make goldens" not in report
    fixed = oipgen("build", "--spec", "myspec", "--out", "out", cwd=project)
    assert fixed.returncode == 0, fixed.stderr
    assert oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project).returncode == 0


def test_check_shows_a_hand_edited_descriptor_without_a_traceback(tmp_path: Path) -> None:
    """The module on disk is anyone's to edit: a descriptor that is no descriptor, or one that refers to a oneof it
    lacks, is shown as the bytes it is (cut to a line), never run and never a traceback."""
    from google.protobuf import descriptor_pb2

    project = _project(tmp_path)
    module = project / "out" / "oip" / "grpc" / "grpc_service_pb2.py"
    good = module.read_text()
    broken = descriptor_pb2.FileDescriptorProto(name="grpc_service.proto", package="inference")
    broken.message_type.add(name="M").field.add(name="a", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                                                oneof_index=3)
    for blob in (b"\xff\xff not a descriptor", broken.SerializeToString(), None):
        lines = [f"DESCRIPTOR = _pool.POOL.AddSerializedFile({blob!r})" if "AddSerializedFile(" in line else line
                 for line in good.split("\n")]
        if blob is None:  # a module the parser gives up on
            lines = ["x = " + "-" * 100_000 + "1", *lines]
        module.write_text("\n".join(lines))
        result = oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "-DESCRIPTOR = _pool.POOL.AddSerializedFile(" in result.stderr
        assert "+# descriptor: message inference.ServerLiveRequest\n" in result.stderr


def test_check_cuts_long_lines_and_bounds_the_whole_report(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for path in sorted((project / "out" / "oip").rglob("*.py"))[:30]:
        path.write_text("x = '" + "y" * 100_000 + "'\n" + path.read_text())
    result = oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project)
    assert result.returncode == 1
    assert len(result.stderr.encode()) < 16 * 1024, len(result.stderr.encode())
    assert "-x = 'yyyy" in result.stderr and "y... (99847 more characters)" in result.stderr
    assert "... and 10 more changed" in result.stderr
    assert "... the diffs of 18 more changed file(s) are not shown" in result.stderr


def test_check_does_not_diff_a_file_too_long_to_diff(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "out" / "oip" / "models.py").write_text("".join(f"line_{i} = {i}\n" for i in range(200_000)))
    result = oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project)
    assert result.returncode == 1
    assert "models.py: 200001 lines on disk," in result.stderr and "too many to diff here" in result.stderr


def test_files_not_generated_are_removed_by_prune_and_nothing_else(tmp_path: Path) -> None:
    project = _project(tmp_path)
    out = project / "out"
    extras = [out / "oip" / "leftover.py", out / "oip" / "old" / "gone.py", out / "deploy" / "mine.yaml"]
    for path in extras:
        path.parent.mkdir(exist_ok=True)
        path.write_text("x = 1\n")
    victim = tmp_path / "victim"
    victim.write_text("not the build's\n")
    (out / "oip" / "link.py").symlink_to(victim)  # an extra that is a symlink: the link goes, never its target
    (out / "unrelated.txt").write_text("not in a folder the build writes\n")
    cache = out / "oip" / "__pycache__" / "models.cpython-311.pyc"
    cache.parent.mkdir(exist_ok=True)
    cache.write_bytes(b"\0")

    check = oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project)
    assert check.returncode == 1
    assert "extra (not generated): old/gone.py" in check.stderr
    assert check.stderr.splitlines()[-1] == ("oipgen: to fix it, run: oipgen build --spec myspec --out out --prune "
                                             "(--prune removes the 4 extra file(s); or delete them)")
    plain = oipgen("build", "--spec", "myspec", "--out", "out", cwd=project)
    assert plain.returncode == 0 and all(p.exists() for p in extras)
    assert "4 file(s) in the output are not generated" in plain.stderr
    assert "delete them, or run oipgen build --spec myspec --out out --prune" in plain.stderr

    (out / "oip" / "stale.py").write_text("x = 1\n")  # extra, and listed by the manifest: removed once
    _list_in_manifest(out / "oip", "stale.py")
    pruned = oipgen("build", "--prune", "--spec", "myspec", "--out", "out", cwd=project)
    assert pruned.returncode == 0, pruned.stderr
    assert "  removed  out/oip/stale.py" in pruned.stdout and not (out / "oip" / "stale.py").exists()
    assert "  pruned   out/oip/leftover.py" in pruned.stdout
    assert not any(p.exists() for p in extras) and not (out / "oip" / "old").exists()
    assert not (out / "oip" / "link.py").is_symlink() and victim.read_text() == "not the build's\n"
    assert (out / "unrelated.txt").exists() and cache.exists() and (out / "deploy" / "Containerfile").exists()
    assert oipgen("build", "--check", "--spec", "myspec", "--out", "out", cwd=project).returncode == 0


def test_check_and_prune_do_not_go_together(tmp_path: Path) -> None:
    result = oipgen("build", "--check", "--prune", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
