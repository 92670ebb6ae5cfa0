"""Target `models`: pydantic v2 models of every REST body, the datatype table, the numpy codecs, the
extensions (their names, operations and reserved parameter keys) and the REST side of the bindings (`bodies`:
each schema's plan, reading and completing bodies without protobuf).

The models come from datamodel-code-generator with pinned options (below): type aliases keep tensor `data` a
recursive union and parameter maps plain dicts of scalars, with `extra="allow"` so no parameter is dropped; every
class derives from `OipModel`, whose dumps leave out None fields.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..bindings import all_param_cases, bindings
from ..output import Tree
from . import Context, copy_top_level_runtime

# datamodel-code-generator writes the base class import from an absolute path; this placeholder module is
# rewritten to the package's own `_base` so the package stays relocatable.
_BASE_PLACEHOLDER = "oipgen_base_placeholder"

DCG_OPTIONS: dict[str, Any] = {
    "use_annotated": True,
    "field_constraints": True,
    "use_standard_collections": True,
    "use_union_operator": True,
    "use_type_alias": True,
    "disable_timestamp": True,
    "formatters": ["builtin"],
    # The formatter would otherwise take its line length (and more) from the nearest pyproject.toml of the
    # current folder: pinned here, and its settings are read from an empty folder, so any project gets the same bytes.
    "builtin_format_line_length": 120,
    "base_class": f"{_BASE_PLACEHOLDER}.OipModel",
}


def build(ctx: Context, tree: Tree) -> None:
    from datamodel_code_generator import (  # type: ignore[attr-defined]
        DataModelType,
        InputFileType,
        PythonVersion,
        generate,
    )

    with tempfile.TemporaryDirectory() as settings:
        (Path(settings) / "pyproject.toml").write_text("[tool]\n", encoding="utf-8")
        code = generate(
            ctx.api.openapi,
            input_file_type=InputFileType.OpenAPI,
            output_model_type=DataModelType.PydanticV2BaseModel,
            target_python_version=PythonVersion.PY_311,
            custom_file_header=ctx.header + '\n"""Pydantic models of the REST bodies of the protocol."""',
            settings_path=Path(settings),
            **DCG_OPTIONS,
        )
    if not isinstance(code, str):
        raise RuntimeError("datamodel-code-generator returned several modules; expected one")
    placeholder = f"from {_BASE_PLACEHOLDER} import OipModel"
    if code.count(placeholder) != 1:
        raise RuntimeError("datamodel-code-generator output has no base-class import to relocate")
    tree.add("models.py", code.replace(placeholder, "from ._base import OipModel"))
    copy_top_level_runtime(ctx, tree, "models")  # _base, codec, framing, bodies_base
    tree.add("datatypes.py", ctx.renderer.render("datatypes.py.jinja"))
    tree.add("extensions.py", ctx.renderer.render("extensions.py.jinja"))
    tree.add("bodies.py", ctx.renderer.render(
        "bodies.py.jinja", bindings=bindings(ctx.api), param_cases=all_param_cases(ctx.api)))
