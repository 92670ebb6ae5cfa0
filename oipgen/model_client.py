"""`oipgen client`: a typed client module for one model, rendered from the model's metadata.

The metadata is the model's own spec: the REST answer of `GET /v2/models/NAME[/versions/V]` (fetched from a
server, or read from a file). The module (`templates/model_client/client.py.jinja`) holds a sync and an async
client class named after the model, whose `infer` takes one keyword-only argument per input tensor, typed with
the numpy scalar type of its datatype, and returns a frozen dataclass with one attribute per output.

Tensor names become Python names by `python_names`: a name that is a usable identifier stays as it is; in any
other name every character outside ASCII letters, digits and `_` becomes `_`, `t_` goes in front of a name that
would start with a digit or with `__`, and `_` goes after a Python keyword or a name `infer` uses for its own
options; a name still taken gets `_2`, `_3`... (`2`, `3`... after a `_`). The output depends on the metadata,
the options and the oipgen version only: the same model gives the same bytes from a server or a file.
"""

from __future__ import annotations

import contextlib
import json
import keyword
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import __version__
from .api import Datatype, camel_case, is_safe_identifier

TEMPLATE = "model_client/client.py.jinja"
# The keyword arguments `infer` has besides the inputs: an input of one of these names is renamed.
INFER_OPTIONS = frozenset({"self", "request_id", "parameters", "headers", "timeout"})
_FETCH_TIMEOUT = 30.0
_NUMPY_CODE = re.compile(r"[<>|=]?([biuf])(\d+)")
_NUMPY_KINDS = {"b": "bool_", "i": "int", "u": "uint", "f": "float"}


class ClientError(ValueError):
    """Metadata or options that cannot make a client; the message says why, for a person."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the model: its name, Python name, datatype, shape (-1: any size) and numpy annotation."""

    name: str
    python: str
    datatype: str
    shape: tuple[int, ...]
    annotation: str


@dataclass(frozen=True)
class ModelInfo:
    """What the module is rendered from."""

    name: str
    version: str
    platform: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def fetch_metadata(server: str, model: str, version: str = "", timeout: float = _FETCH_TIMEOUT) -> Any:
    """The model's metadata from a server's REST endpoint (`http://host:8000`; scheme-less means http)."""
    base = (server if "://" in server else "http://" + server).rstrip("/")
    path = f"/v2/models/{quote(model, safe='')}" + (f"/versions/{quote(version, safe='')}" if version else "")
    request = urllib.request.Request(base + path, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = str(json.loads(detail)["error"])
        raise ClientError(f"GET {base}{path}: {exc.code} {detail}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ClientError(f"GET {base}{path}: {getattr(exc, 'reason', exc)}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise ClientError(f"GET {base}{path}: the answer is not JSON") from None


def read_metadata(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read the metadata file {path}: {exc}") from None


def python_names(names: Sequence[str], reserved: Iterable[str] = ()) -> list[str]:
    """The Python names of `names`, in order, all distinct (the rules are in the module's docstring)."""
    taken = set(reserved)
    usable = [is_safe_identifier(n) and n not in taken for n in names]
    out: list[str | None] = [n if ok else None for n, ok in zip(names, usable, strict=True)]
    used = taken | {n for n in out if n is not None}
    for i, name in enumerate(names):
        if out[i] is not None:
            continue
        base = re.sub(r"[^A-Za-z0-9_]", "_", name)
        if base[:1].isdigit() or base.startswith("__") or not base:
            base = "t_" + base
        if keyword.iskeyword(base) or base in taken:
            base += "_"
        candidate, n = base, 1
        while candidate in used:
            n += 1
            candidate = f"{base}{'' if base.endswith('_') else '_'}{n}"
        out[i] = candidate
        used.add(candidate)
    return [n for n in out if n is not None]


def _scalar(numpy: str) -> str:
    """The numpy scalar type of a datatype table's `numpy` entry, as an expression of the generated module."""
    if numpy == "object":
        return "np.object_"
    match = _NUMPY_CODE.fullmatch(numpy)
    if match:
        kind, size = match.groups()
        return f"np.{_NUMPY_KINDS[kind]}" if kind == "b" else f"np.{_NUMPY_KINDS[kind]}{int(size) * 8}"
    if is_safe_identifier(numpy):
        return f"ml_dtypes.{numpy}"  # the table's other names are ml_dtypes' types (bfloat16)
    raise ClientError(f"the datatype table's numpy type {numpy!r} has no Python annotation")


def annotation(datatype: Datatype, *, as_input: bool) -> str:
    """The annotation of a tensor: the numpy array of its datatype's scalar type. BYTES inputs may also be
    arrays of `bytes_` or `str_` (the clients encode those as BYTES); BYTES outputs are object arrays of bytes."""
    scalar = _scalar(datatype.numpy)
    if scalar == "np.object_" and as_input:
        return "npt.NDArray[np.object_] | npt.NDArray[np.bytes_] | npt.NDArray[np.str_]"
    return f"npt.NDArray[{scalar}]"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClientError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _tensors(doc: Mapping[str, Any], key: str, datatypes: Mapping[str, Datatype],
             reserved: frozenset[str]) -> tuple[TensorInfo, ...]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise ClientError(f"the metadata's {key!r} must be a list of tensors")
    rows: list[tuple[str, Datatype, tuple[int, ...]]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ClientError(f"{key}[{i}] must be an object with name, datatype and shape")
        name = _text(item.get("name"), f"{key}[{i}].name")
        datatype = _text(item.get("datatype"), f"{key}[{i}].datatype")
        if datatype not in datatypes:
            raise ClientError(f"{key[:-1]} {name!r}: unknown datatype {datatype!r} (known: {', '.join(datatypes)})")
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int and d >= -1 for d in shape):
            raise ClientError(f"{key[:-1]} {name!r}: shape must be a list of integers >= -1, got {shape!r}")
        if name in (r[0] for r in rows):
            raise ClientError(f"{key[:-1]} {name!r} is listed twice")
        rows.append((name, datatypes[datatype], tuple(shape)))
    names = python_names([r[0] for r in rows], reserved)
    return tuple(
        TensorInfo(name, python, dt.name, shape, annotation(dt, as_input=key == "inputs"))
        for (name, dt, shape), python in zip(rows, names, strict=True)
    )


def model_info(doc: Any, datatypes: Sequence[Datatype], *, model: str | None = None, version: str = "") -> ModelInfo:
    """The model of a metadata document (REST JSON). `model`, when given, must be the document's name."""
    if not isinstance(doc, dict):
        raise ClientError(f"the metadata must be a JSON object, got {type(doc).__name__}")
    name = _text(doc.get("name"), "the metadata's 'name'")
    if model is not None and model != name:
        raise ClientError(f"the metadata describes model {name!r}, not {model!r}")
    table = {d.name: d for d in datatypes}
    platform = doc.get("platform", "")
    return ModelInfo(
        name=name,
        version=version,
        platform=platform if isinstance(platform, str) else "",
        inputs=_tensors(doc, "inputs", table, INFER_OPTIONS),
        outputs=_tensors(doc, "outputs", table, frozenset()),
    )


def header(model: ModelInfo) -> str:
    """The module's first lines. No timestamp and no server address: the same metadata gives the same bytes."""
    version = f" version {model.version}" if model.version else ""
    return (
        f"# @generated by oipgen {__version__} from the metadata of model {model.name!r}{version}. DO NOT EDIT.\n"
        "# Regenerate with `oipgen client`; hand edits are overwritten.\n"
        "# ruff: noqa\n"
        "# isort: skip_file"
    )


def render_client(model: ModelInfo, *, package: str, templates: Path | None = None) -> str:
    """The module's text."""
    from .render import Renderer

    if not package or not all(is_safe_identifier(part) for part in package.split(".")):
        raise ClientError(f"--package {package!r} is not an importable package name")
    base = camel_case(model.name)
    renderer = Renderer(templates, {"oipgen_version": __version__})
    renderer.env.filters["doc"] = lambda value: repr(value).replace('"', '\\"')
    return renderer.render(
        TEMPLATE,
        header=header(model),
        model=model,
        package=package,
        client_class=f"{base}Client",
        async_class=f"Async{base}Client",
        outputs_class=f"{base}Outputs",
        ml_dtypes=any(t.annotation.count("ml_dtypes.") for t in (*model.inputs, *model.outputs)),
    )
