"""`oipgen client`: a typed client module for one model, rendered from the model's metadata.

The metadata is the model's own spec: the REST answer of `GET /v2/models/NAME[/versions/V]` (fetched from a
server, or read from a file). The module (`templates/model_client/client.py.jinja`) holds a sync and an async
client class named after the model, whose `infer` takes one keyword-only argument per input tensor, typed with
the numpy scalar type of its datatype, and returns a frozen dataclass with one attribute per output.

Tensor names become Python names by `python_names`: a name that is a usable identifier stays as it is; in any
other name every character outside ASCII letters, digits and `_` becomes `_`; `_` goes after a Python keyword or
a name the module's own code uses (`own_names`: its globals, imports, the builtins it reads, `infer`'s options),
and `t_` in front of a name that would start with a digit or with `__`; a name still taken gets `_2`, `_3`...
(`2`, `3`... after a `_`). The output depends on the metadata, the options and the oipgen version only: the same
model gives the same bytes from a server or a file.

The metadata is hostile until checked: it is read up to MAX_ANSWER_BYTES within one deadline, every name is
bounded and enters the module only as a literal the generator writes (`repr`, which escapes what is not
printable) or as an identifier it made, and the module's first two lines, where PEP 263 looks for an encoding,
are oipgen's own: the encoding (UTF-8) and the @generated line.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import http.client
import json
import keyword
import math
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from . import __version__
from .api import Datatype, camel_case, is_safe_identifier

TEMPLATE = "model_client/client.py.jinja"
# Line 1 of every module: its encoding, stated by oipgen. PEP 263 reads a `coding` comment on line 1 or 2, so
# these two lines are oipgen's own words only; outside text starts after the header's five lines (editors' mode
# lines are read in the first five).
ENCODING_LINE = "# -*- coding: utf-8 -*-"
FETCH_DEADLINE = 30.0  # seconds for the whole fetch: connect, TLS, request, answer
MAX_ANSWER_BYTES = 16 << 20  # the metadata (an answer or a file) is read this far and refused beyond
MAX_ERROR_BYTES = 64 << 10  # of an error answer, read for its message
MAX_DIMENSIONS = 64  # numpy's limit: an array with more dimensions cannot exist, so no call could pass it
MAX_DIMENSION = 2**63 - 1  # int64, the protocol's type of a dimension
MAX_TENSORS = 1024  # inputs, and outputs
MAX_NAME = 256  # characters of a model, version, platform or tensor name
MAX_MESSAGE = 400  # characters of a refusal, outside text included
_NUMPY_CODE = re.compile(r"[<>|=]?([biuf])(\d+)")
_NUMPY_KINDS = {"b": "bool_", "i": "int", "u": "uint", "f": "float"}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")


class ClientError(ValueError):
    """Metadata or options that cannot make a client; the message says why, for a person."""


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` as one printable line: characters that are not printable (newlines of every kind included) escaped,
    and cut at `limit` characters."""
    line = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[: limit + 1])
    return line if len(line) <= limit else line[:limit] + "..."


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


# --- fetching -----------------------------------------------------------------------------------------------------

class _Deadline:
    """One deadline over a whole exchange. When it passes, the connection's socket is shut down: a read that is
    waiting returns at once, so a server that drips a byte just in time for each read cannot hold the fetch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self.passed = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            self.passed = True
            raise TimeoutError
        return left

    def watch(self, sock: socket.socket) -> None:
        """Cut `sock`'s connection at the deadline. A duplicate is kept: shutting it down ends the connection
        under TLS too, whose socket takes over the original."""
        with self._lock:
            self._socket = sock.dup()
            if self.passed:
                self._socket.shutdown(socket.SHUT_RDWR)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            if self._socket is not None:
                with contextlib.suppress(OSError):
                    self._socket.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self._socket is not None:
                self._socket.close()


def fetch_metadata(server: str, model: str, version: str = "", deadline: float = FETCH_DEADLINE) -> Any:
    """The model's metadata from a server's REST endpoint (`http://host:8000`, `https://...`; scheme-less means
    http), within `deadline` seconds for the whole exchange. Redirects are not followed, proxies not used."""
    _name(model, "--model")
    _name(version, "--version", empty=True)
    parts = urlsplit(server if "://" in server else "http://" + server)
    path = f"{parts.path.rstrip('/')}/v2/models/{quote(model, safe='')}"
    path += f"/versions/{quote(version, safe='')}" if version else ""
    where = f"GET {parts.scheme}://{parts.netloc}{path}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientError(f"--server {server!r} is not an http:// or https:// address")
    if not (0 < deadline < math.inf):
        raise ClientError(f"the deadline must be a positive number of seconds, got {deadline}")
    clock = _Deadline(deadline)
    try:
        status, body = _get(parts.scheme == "https", parts.hostname, parts.port, path, clock)
    except ClientError as exc:
        raise ClientError(f"{where}: {exc}") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ClientError(f"{where}: {_transport_failure(exc, clock)}") from None
    finally:
        clock.close()
    if status != 200:
        raise ClientError(f"{where}: {status} {_error_detail(body)}".rstrip()
                          + (" (redirects are not followed)" if 300 <= status < 400 else ""))
    return _parse(body, f"{where}: the answer")


def _get(tls: bool, host: str, port: int | None, path: str, clock: _Deadline) -> tuple[int, bytes]:
    """One GET over a connection of our own, so that the deadline can cut it; the status and the body (capped)."""
    port = port if port is not None else (443 if tls else 80)
    sock = _connect(host, port, clock)
    clock.watch(sock)
    connection: http.client.HTTPConnection
    if tls:
        context = ssl.create_default_context()
        sock = context.wrap_socket(sock, server_hostname=host)
        connection = http.client.HTTPSConnection(host, port, context=context)
    else:
        connection = http.client.HTTPConnection(host, port)
    connection.sock = sock  # connected already: http.client sends on it without connecting again
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return response.status, response.read(MAX_ERROR_BYTES)
        if response.length is not None and response.length > MAX_ANSWER_BYTES:
            raise ClientError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB "
                              f"(Content-Length {response.length})")
        body = bytearray()
        while chunk := response.read(min(1 << 16, MAX_ANSWER_BYTES + 1 - len(body))):
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise ClientError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB")
        if response.length:  # http.client returns short reads of a Content-Length body without complaint
            raise http.client.IncompleteRead(bytes(body), response.length)
        return response.status, bytes(body)
    finally:
        connection.close()


def _connect(host: str, port: int, clock: _Deadline) -> socket.socket:
    """A TCP connection to `host` within the deadline, the name lookup included: the resolver has no timeout of
    its own, so it runs in a daemon thread that is left behind when the deadline passes."""
    found: list[Any] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as exc:  # OSError, or UnicodeError for a name IDNA cannot encode: raised by the caller
            found.append(exc)
        finally:
            done.set()

    threading.Thread(target=look_up, name="oipgen-name-lookup", daemon=True).start()
    if not done.wait(clock.left()):
        raise TimeoutError(f"looking up {host!r}")
    if isinstance(found[0], Exception):
        raise found[0]
    failure: OSError | None = None
    for family, kind, proto, _, address in found[0]:  # each address in turn, as socket.create_connection does
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(clock.left())
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            failure = exc
    raise failure or OSError(f"no address for {host!r}")


def _transport_failure(exc: Exception, clock: _Deadline) -> str:
    """What went wrong on the way, in words (the exception's own text only where it names no outside text)."""
    if clock.passed or isinstance(exc, TimeoutError):
        return f"no complete answer within {clock.seconds:g} s"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate is not trusted ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(exc, http.client.IncompleteRead):
        expected = f" of {len(exc.partial) + exc.expected}" if exc.expected is not None else ""
        return f"the answer ended early ({len(exc.partial)}{expected} bytes)"
    if isinstance(exc, http.client.LineTooLong):
        return f"the answer's header section is too large ({exc})"
    if isinstance(exc, http.client.BadStatusLine):
        return "the answer is not HTTP (bad status line)"
    if isinstance(exc, http.client.HTTPException):
        return f"the answer is not valid HTTP ({type(exc).__name__}: {exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return f"{type(exc).__name__}: {exc}"


def _error_detail(body: bytes) -> str:
    """The message of an error answer: its `error` when it is JSON like the protocol's, else its text."""
    text = body.decode("utf-8", "replace")
    with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):
        text = str(json.loads(text)["error"])
    return one_line(text, 200)


def _parse(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ClientError(f"{what} nests too deeply to be metadata") from None
    except ValueError as exc:  # a JSON or UTF-8 error, or an integer of thousands of digits
        raise ClientError(f"{what} is not JSON ({exc})") from None


def read_metadata(path: Path) -> Any:
    """The metadata in a file, read no further than the answer of a server would be."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_ANSWER_BYTES + 1)
    except OSError as exc:
        raise ClientError(f"cannot read the metadata file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_ANSWER_BYTES:
        raise ClientError(f"the metadata file {path} is larger than {MAX_ANSWER_BYTES >> 20} MiB")
    return _parse(data, f"the metadata file {path}")


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
        if keyword.iskeyword(base) or base in taken:
            base += "_"
        if base[:1].isdigit() or base.startswith("__") or not base:
            base = "t_" + base
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


def _name(value: Any, what: str, *, empty: bool = False) -> str:
    """A name from outside, checked: a string of at most MAX_NAME characters that is valid Unicode (it goes into
    the module only as a literal the generator writes)."""
    if not isinstance(value, str) or not (value or empty):
        raise ClientError(f"{what} must be a non-empty string, got {type(value).__name__} {value!r:.60}")
    if len(value) > MAX_NAME:
        raise ClientError(f"{what} is longer than {MAX_NAME} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ClientError(f"{what} {value!r} is not valid Unicode (a lone surrogate)") from None
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ClientError(f"{what}: shape must be a list of integers >= -1, got {type(value).__name__}")
    if len(value) > MAX_DIMENSIONS:
        raise ClientError(f"{what}: shape has {len(value)} dimensions, more than {MAX_DIMENSIONS} (numpy's limit)")
    for d in value:
        if type(d) is not int or d < -1:
            raise ClientError(f"{what}: shape must be a list of integers >= -1, got {value!r:.100}")
        if d > MAX_DIMENSION:
            raise ClientError(f"{what}: a dimension is beyond int64 ({MAX_DIMENSION})")
    return tuple(value)


def _tensors(doc: Mapping[str, Any], key: str, datatypes: Mapping[str, Datatype],
             reserved: frozenset[str]) -> tuple[TensorInfo, ...]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise ClientError(f"the metadata's {key!r} must be a list of tensors")
    if len(items) > MAX_TENSORS:
        raise ClientError(f"the metadata lists {len(items)} {key}, more than {MAX_TENSORS}")
    rows: list[tuple[str, Datatype, tuple[int, ...]]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ClientError(f"{key}[{i}] must be an object with name, datatype and shape")
        name = _name(item.get("name"), f"{key}[{i}].name")
        what = f"{key[:-1]} {name!r}"
        datatype = _name(item.get("datatype"), f"{what}: datatype")
        if datatype not in datatypes:
            raise ClientError(f"{what}: unknown datatype {datatype!r} (known: {', '.join(datatypes)})")
        if not _PLAIN_NAME.fullmatch(datatype):  # it is written into docstrings as it is
            raise ClientError(f"the datatype table's name {datatype!r} is not a plain name")
        shape = _shape(item.get("shape"), what)
        if name in seen:
            raise ClientError(f"{what} is listed twice")
        seen.add(name)
        rows.append((name, datatypes[datatype], shape))
    names = python_names([r[0] for r in rows], reserved)
    return tuple(
        TensorInfo(name, python, dt.name, shape, annotation(dt, as_input=key == "inputs"))
        for (name, dt, shape), python in zip(rows, names, strict=True)
    )


def model_info(doc: Any, datatypes: Sequence[Datatype], *, model: str | None = None, version: str = "",
               reserved: Iterable[str] = ()) -> ModelInfo:
    """The model of a metadata document (REST JSON). `model`, when given, must be the document's name; no tensor
    gets a Python name in `reserved` (`render_client` passes the names the module's own code uses)."""
    if not isinstance(doc, dict):
        raise ClientError(f"the metadata must be a JSON object, got {type(doc).__name__}")
    name = _name(doc.get("name"), "the metadata's 'name'")
    if model is not None and model != name:
        raise ClientError(f"the metadata describes model {name!r}, not {model!r}")
    table = {d.name: d for d in datatypes}
    platform = doc.get("platform", "")
    taken = frozenset(reserved)
    return ModelInfo(
        name=name,
        version=_name(version, "--version", empty=True),
        platform=_name(platform, "the metadata's 'platform'", empty=True) if isinstance(platform, str) else "",
        inputs=_tensors(doc, "inputs", table, taken),
        outputs=_tensors(doc, "outputs", table, taken),
    )


def header() -> str:
    """The module's first lines, the same for every model: its encoding, then oipgen's own words (no name from
    the metadata, no timestamp, no server address: the same metadata gives the same bytes)."""
    return (
        f"{ENCODING_LINE}\n"
        f"# @generated by oipgen {__version__} from a model's metadata. DO NOT EDIT.\n"
        "# Regenerate with `oipgen client`; hand edits are overwritten.\n"
        "# ruff: noqa\n"
        "# isort: skip_file"
    )


def own_names(text: str) -> frozenset[str]:
    """The names a module's own code uses where a tensor's Python name could stand for them: what it binds at its
    top level (imports, tables, functions, classes), the builtins it reads, and every name in its `infer` methods
    (their options included)."""
    tree = ast.parse(text)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    for inner in ast.walk(tree):
        if isinstance(inner, ast.Name) and hasattr(builtins, inner.id):
            names.add(inner.id)
        elif isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner.name == "infer":
            names.update(n.arg for n in ast.walk(inner.args) if isinstance(n, ast.arg))
            names.update(n.id for n in ast.walk(inner) if isinstance(n, ast.Name))
    return frozenset(names)


def render_client(doc: Any, datatypes: Sequence[Datatype], *, package: str, model: str | None = None,
                  version: str = "", templates: Path | None = None) -> tuple[ModelInfo, str]:
    """The model of a metadata document and its module's text. The module is rendered twice: once without
    tensors, for the names its own code uses (no tensor may take one), then for real; the result must compile."""
    from .render import Renderer

    if not package or not all(is_safe_identifier(part) for part in package.split(".")):
        raise ClientError(f"--package {package!r} is not an importable package name")
    renderer = Renderer(templates, {"oipgen_version": __version__})
    renderer.env.filters["doc"] = lambda value: repr(value).replace('"', '\\"')

    def render(info: ModelInfo, *, ml_dtypes: bool) -> str:
        base = camel_case(info.name)
        text = renderer.render(
            TEMPLATE,
            header=header(),
            model=info,
            package=package,
            client_class=f"{base}Client",
            async_class=f"Async{base}Client",
            outputs_class=f"{base}Outputs",
            ml_dtypes=ml_dtypes,
        )
        if not text.startswith(header() + "\n"):
            raise ClientError(f"the template {TEMPLATE} must start with {{{{ header }}}}")
        try:
            compile(text.encode("utf-8"), "<module>", "exec", dont_inherit=True)  # as the file will be read
        except (SyntaxError, ValueError) as exc:
            raise ClientError(f"the rendered module is not valid Python ({exc}); check --templates") from None
        return text

    bare = model_info({**doc, "inputs": [], "outputs": []} if isinstance(doc, dict) else doc, datatypes,
                      model=model, version=version)
    info = model_info(doc, datatypes, model=model, version=version,
                      reserved=own_names(render(bare, ml_dtypes=True)))
    uses_ml_dtypes = any("ml_dtypes." in t.annotation for t in (*info.inputs, *info.outputs))
    return info, render(info, ml_dtypes=uses_ml_dtypes)
