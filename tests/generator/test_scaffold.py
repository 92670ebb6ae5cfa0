"""`oipgen scaffold model`: the folder it writes loads in the generated server and answers inference."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import BIN, ROOT, oipgen
from oip.grpc import grpc_service_pb2 as pb
from oip.server import DataPlane, InferRequest, ModelRepository, RequestedOutput, Tensor

from oipgen.scaffold import ScaffoldError, class_name, datatype_names, parse_tensor, scaffold_model

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_scaffolded_model_loads_and_infers(tmp_path: Path) -> None:
    result = oipgen("scaffold", "model", "my-model", "--repository", str(tmp_path),
                    "--input", "IMAGE:FP32:-1,3", "--input", "scale:FP64:[]",
                    "--output", "OUT:FP32:-1,3", "--output", "label:BYTES:[1]", "--output", "count:INT64:2")
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "my-model"
    assert sorted(p.name for p in folder.iterdir()) == ["model.py", "model.toml"]
    source = (folder / "model.py").read_text()
    assert "from oip.server import Model, TensorSpec" in source and "class MyModel(Model):" in source

    repository = ModelRepository(tmp_path)
    await repository.load_all()
    [status] = repository.index()
    assert (status.name, status.version, status.state.value, status.reason) == ("my-model", "1", "READY", "")
    dp = DataPlane(repository)
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="my-model"))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("IMAGE", "FP32", [-1, 3]),
                                                                          ("scale", "FP64", [])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUT", "FP32", [-1, 3]), ("label", "BYTES", [1]), ("count", "INT64", [2])]
    image = np.arange(6, dtype=np.float32).reshape(2, 3)
    response = await dp.model_infer(InferRequest(
        "my-model",
        inputs=[Tensor("IMAGE", "FP32", [2, 3], image), Tensor("scale", "FP64", [], np.array(2.0))],
        outputs=[RequestedOutput("count"), RequestedOutput("OUT"), RequestedOutput("label")],
    ))
    out = {t.name: t for t in response.outputs}
    assert [t.name for t in response.outputs] == ["count", "OUT", "label"]
    assert out["OUT"].data is not None and out["OUT"].data.tolist() == image.tolist()  # placeholder: the input
    assert out["count"].shape == [2] and out["label"].shape == [1]
    assert out["label"].data is not None and out["label"].data.tolist() == [b""]


def test_default_tensors_and_the_configured_package(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.oipgen]\npackage = "acme_oip"\nmodel_repository = "served"\nspec = "%s"\n' % (ROOT / "spec"))
    result = oipgen("scaffold", "model", "plain", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    source = (tmp_path / "served" / "plain" / "model.py").read_text()
    assert "from acme_oip.server import Model, TensorSpec" in source
    assert 'TensorSpec("INPUT0", "FP32", [-1])' in source and 'TensorSpec("OUTPUT0", "FP32", [-1])' in source
    assert 'class = "model:Plain"' in (tmp_path / "served" / "plain" / "model.toml").read_text()
    # The generated file is clean Python by the project's own linter.
    lint = subprocess.run([str(BIN / "ruff"), "check", "--isolated", "--select", "E,F,W,B,UP,SIM,RUF",
                           "--line-length", "120", str(tmp_path / "served")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_the_package_of_the_project_the_model_belongs_to(tmp_path: Path) -> None:
    """The nearest [tool.oipgen] above the repository (or the current folder) names the package the scaffolded model
    imports, from a sub-folder of the project or from outside it; --package overrides it."""
    project = tmp_path / "acme"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "acme"\n\n[tool.oipgen]\npackage = "acme_oip"\n'
                                            'spec = "%s"\n' % (ROOT / "spec"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def imports(model: str) -> list[str]:
        return [line for line in (project / "models" / model / "model.py").read_text().splitlines()
                if line.startswith("from ") and ".server import" in line]

    assert oipgen("scaffold", "model", "a", cwd=project / "src").returncode == 0  # into the project's models/
    assert imports("a") == ["from acme_oip.server import Model, TensorSpec"]
    assert oipgen("scaffold", "model", "b", "--repository", str(project / "models"), cwd=elsewhere).returncode == 0
    assert imports("b") == ["from acme_oip.server import Model, TensorSpec"]
    assert oipgen("scaffold", "model", "c", "--package", "other_oip", cwd=project / "src").returncode == 0
    assert imports("c") == ["from other_oip.server import Model, TensorSpec"]
    assert "python -m acme_oip serve" in (project / "models" / "a" / "model.toml").read_text()
    assert not (elsewhere / "models").exists() and not (project / "src" / "models").exists()


def test_rerunning_refuses_to_overwrite(tmp_path: Path) -> None:
    assert oipgen("scaffold", "model", "m", "--repository", str(tmp_path)).returncode == 0
    model_py = tmp_path / "m" / "model.py"
    model_py.write_text("# my work\n")
    again = oipgen("scaffold", "model", "m", "--repository", str(tmp_path), "--input", "A:INT8:1")
    assert again.returncode == 1
    assert "never overwrites" in again.stderr and "model.py" in again.stderr
    assert model_py.read_text() == "# my work\n"
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "model.toml").write_text("# mine\n")
    assert oipgen("scaffold", "model", "n", "--repository", str(tmp_path)).returncode == 1
    assert not (tmp_path / "n" / "model.py").exists()  # nothing written when any file exists


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--input", "A:FLOAT32:1"], "unknown datatype 'FLOAT32'"),
        (["--output", "A:fp32:1"], "unknown datatype 'fp32'"),
        (["--input", "A:FP32"], "expected NAME:DATATYPE:SHAPE"),
        (["--input", "A:FP32:1,x"], "not a comma-separated list"),
        (["--input", "A:FP32:-2"], "dimension -2 is invalid"),
        (["--input", "A:FP32:1", "--input", "A:INT8:1"], "given twice"),
    ],
)
def test_bad_tensors_are_refused(tmp_path: Path, args: list[str], words: str) -> None:
    result = oipgen("scaffold", "model", "m", "--repository", str(tmp_path), *args)
    assert result.returncode == 1 and words in result.stderr, result.stderr
    assert not (tmp_path / "m").exists()


def test_names() -> None:
    names = datatype_names(ROOT / "spec")
    assert names[0] == "BOOL" and "BF16" in names
    assert parse_tensor("input:0:INT64:[2, -1]", names).name == "input:0"
    assert parse_tensor("x:BYTES:[]", names).shape == ()
    assert class_name("resnet-50_v2") == "Resnet50V2"
    assert class_name("3d") == "Model3d"
    assert class_name("model") == "ModelModel"
    with pytest.raises(ScaffoldError, match="invalid model name"):
        scaffold_model(Path("/nonexistent"), "../escape", package="oip", datatypes=names)
    with pytest.raises(ScaffoldError, match="invalid package name"):
        scaffold_model(Path("/nonexistent"), "ok", package="not-a-package", datatypes=names)
    with pytest.raises(ScaffoldError, match="cannot read the datatype table"):
        datatype_names(Path("/nonexistent"))
