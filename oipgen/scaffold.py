"""`oipgen scaffold model NAME`: start a model folder for the generated server.

Writes `<repository>/<NAME>/model.toml` and `<repository>/<NAME>/model.py`: a `Model` subclass that declares the
tensors given as `NAME:DATATYPE:SHAPE` and an `infer` with a runnable placeholder to replace. It never
overwrites a file: when either file exists it writes nothing and says so.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from .api import camel_case, is_safe_identifier

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Names the generated module binds itself: a model class named like one of them would shadow it.
_RESERVED = frozenset({"Any", "Model", "TensorSpec", "codec", "np", "npt", "annotations"})


class ScaffoldError(ValueError):
    """A scaffold request that cannot be honoured; the message says why, for a person."""


@dataclass(frozen=True)
class TensorArg:
    name: str
    datatype: str
    shape: tuple[int, ...]

    def spec(self) -> str:
        return f"TensorSpec({_literal(self.name)}, {_literal(self.datatype)}, {list(self.shape)})"


def datatype_names(spec_dir: Path) -> tuple[str, ...]:
    """The datatype names of `spec_dir/datatypes.yaml`, in order; ScaffoldError when it cannot be read."""
    path = spec_dir / "datatypes.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        names = tuple(str(row["name"]) for row in data["datatypes"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ScaffoldError(f"cannot read the datatype table {path} ({exc}); pass --spec DIR") from exc
    if not names:
        raise ScaffoldError(f"{path} lists no datatypes")
    return names


def parse_tensor(text: str, datatypes: Sequence[str]) -> TensorArg:
    """`NAME:DATATYPE:SHAPE` (SHAPE: comma-separated dimensions, -1 for any size, optionally in brackets; `[]`
    for a scalar). The name may itself contain colons."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise ScaffoldError(f"tensor {text!r}: expected NAME:DATATYPE:SHAPE, like INPUT0:FP32:1,16")
    name, datatype, shape_text = parts
    if not name or not name.isprintable() or name != name.strip():
        raise ScaffoldError(f"tensor {text!r}: the name must be non-empty printable text without surrounding spaces")
    if datatype not in datatypes:
        raise ScaffoldError(f"tensor {name!r}: unknown datatype {datatype!r}; valid datatypes: {', '.join(datatypes)}")
    body = shape_text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1].strip()
    dims: list[int] = []
    if body:
        for item in body.split(","):
            try:
                dim = int(item.strip())
            except ValueError:
                raise ScaffoldError(
                    f"tensor {name!r}: shape {shape_text!r} is not a comma-separated list of integers"
                ) from None
            if dim < -1:
                raise ScaffoldError(f"tensor {name!r}: dimension {dim} is invalid (>= 0, or -1 for any size)")
            dims.append(dim)
    return TensorArg(name, datatype, tuple(dims))


def class_name(model_name: str) -> str:
    """The Python class name for a model name: `my-model` -> `MyModel`, `2d` -> `Model2d`."""
    name = camel_case(model_name)
    if name in _RESERVED:
        name += "Model"
    if not is_safe_identifier(name):
        raise ScaffoldError(f"cannot derive a Python class name from the model name {model_name!r}")
    return name


def project_root(start: Path) -> Path | None:
    """The folder of the nearest `pyproject.toml` with a `[tool.oipgen]` table, from `start` (a folder, which need
    not exist yet) up: the project a model folder there belongs to, whose configured package it must import."""
    for folder in (start.absolute(), *start.absolute().parents):
        try:
            data = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if isinstance(data.get("tool", {}).get("oipgen"), dict):
            return folder
    return None


def render_toml(model_name: str, cls: str, package: str) -> str:
    return (
        f"# The {model_name} model. Serve the repository with `python -m {package} serve --model-repository DIR`.\n"
        f'class = "model:{cls}"  # <python file in this folder>:<Model subclass>\n'
        '# platform = "python"  # reported in model metadata\n'
        '# versions = ["1"]  # default: the numeric sub-folders, else ["1"]\n'
        "\n"
        "[parameters]  # passed to the model as `self.settings`\n"
    )


def _literal(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Python string literal


def _placeholder(output: TensorArg, inputs: Sequence[TensorArg]) -> tuple[str, str]:
    """The expression of a placeholder output and its comment."""
    for tensor in inputs:
        if tensor.datatype == output.datatype and tensor.shape == output.shape:
            return f"inputs[{_literal(tensor.name)}]", f"placeholder: {tensor.name} unchanged"
    shape = [1 if d == -1 else d for d in output.shape]
    if output.datatype == "BYTES":
        return f'np.full({shape}, b"", dtype=object)', "placeholder: empty elements"
    return f"np.zeros({shape}, dtype=codec.dtype_of({_literal(output.datatype)}))", "placeholder: zeros"


def render_model(model_name: str, cls: str, package: str, inputs: Sequence[TensorArg],
                 outputs: Sequence[TensorArg]) -> str:
    placeholders = [(output, *_placeholder(output, inputs)) for output in outputs]
    needs_codec = any("codec." in expr for _, expr, _ in placeholders)
    needs_numpy = any("np." in expr for _, expr, _ in placeholders)
    lines = [
        f'"""The {model_name} model."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        *(["import numpy as np"] if needs_numpy else []),
        "import numpy.typing as npt",
        "",
        *([f"from {package} import codec"] if needs_codec else []),
        f"from {package}.server import Model, TensorSpec",
        "",
        "",
        f"class {cls}(Model):",
        "    inputs = (",
        *(f"        {t.spec()}," for t in inputs),
        "    )",
        "    outputs = (",
        *(f"        {t.spec()}," for t in outputs),
        "    )",
        "",
        "    def load(self) -> None:",
        "        # Read weights or warm up here. `self.settings` holds the [parameters] of model.toml and `self.path`",
        "        # this folder. An exception makes the model UNAVAILABLE with its message as the reason.",
        "        pass",
        "",
        "    def infer(self, inputs: dict[str, npt.NDArray[Any]], parameters: dict[str, Any]) -> dict[str, Any]:",
        "        # TODO: compute the outputs. Each input is a numpy array of its declared datatype and shape (BYTES:",
        "        # an object array of bytes); `parameters` holds the request's parameters. A plain method runs in a",
        "        # worker thread; make it `async def` to run on the event loop instead.",
        "        return {",
        *(f"            {_literal(o.name)}: {expr},  # {comment}" for o, expr, comment in placeholders),
        "        }",
    ]
    return "\n".join(lines) + "\n"


def scaffold_model(repository: Path, model_name: str, *, package: str, datatypes: Sequence[str],
                   inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> list[Path]:
    """Write the model folder; the files written. ScaffoldError (nothing written) when a file exists or an
    argument is invalid. Without inputs: INPUT0:FP32:-1; without outputs: OUTPUT0 like the first input."""
    if not MODEL_NAME.fullmatch(model_name):
        raise ScaffoldError(
            f"invalid model name {model_name!r}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )
    if not all(is_safe_identifier(part) for part in package.split(".")):
        raise ScaffoldError(f"invalid package name {package!r}")
    cls = class_name(model_name)
    ins = [parse_tensor(t, datatypes) for t in inputs] or [TensorArg("INPUT0", "FP32", (-1,))]
    outs = [parse_tensor(t, datatypes) for t in outputs] or [TensorArg("OUTPUT0", ins[0].datatype, ins[0].shape)]
    for kind, tensors in (("input", ins), ("output", outs)):
        names = [t.name for t in tensors]
        for name in names:
            if names.count(name) > 1:
                raise ScaffoldError(f"{kind} {name!r} is given twice")
    folder = repository / model_name
    files = {folder / "model.toml": render_toml(model_name, cls, package),
             folder / "model.py": render_model(model_name, cls, package, ins, outs)}
    existing = [path for path in files if path.exists()]
    if existing:
        raise ScaffoldError(
            f"{', '.join(map(str, existing))} already exist{'s' if len(existing) == 1 else ''}; scaffold never "
            "overwrites a file (remove it or choose another model name)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for path, text in files.items():
        with path.open("x", encoding="utf-8") as f:  # "x": fail rather than overwrite, even in a race
            f.write(text)
        written.append(path)
    return written
