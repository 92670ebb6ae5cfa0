"""The runtime server's layout holds: its modules import each other without a circle, each wing imports only the
wings below it, the core and the error vocabulary import no transport library, and no module grows past about 600
lines. Read from the generated package (runtime and rendered modules together), by parsing every import, those in
functions and under TYPE_CHECKING included."""

from __future__ import annotations

import ast
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import GENERATED, ROOT

SERVER = GENERATED / "oip" / "server"
PACKAGE = "oip.server"

# Each wing's level: a module imports modules of its own wing or of lower levels only (rest and grpc, side by side,
# not each other). The package's own `__init__` is the facade over all of them and is left out.
LEVELS = {
    "process": 5,
    "rest": 4, "grpc": 4,
    "core": 3,
    "model": 2,
    "observe": 1,
    "errors": 0, "types": 0, "settings": 0,
}
TRANSPORTS = frozenset({"grpc", "fastapi", "starlette", "uvicorn", "httptools", "h11"})
TRANSPORT_FREE = ("errors", "types", "settings", "model", "core", "observe")  # wings that import no transport library
MAX_LINES = 600


def modules(root: Path) -> dict[str, Path]:
    """The server package's modules under `root`, by dotted name (`oip.server.core.pipeline`)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([PACKAGE, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """What module `name` imports, by dotted name (a server module where it is one), with the line: every import
    statement of the file, wherever it is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                yield (submodule if submodule in known else source), node.lineno


def wing(name: str) -> str:
    """The wing of a server module: its first part below the package (`core`, `model`, `errors`...)."""
    return name.removeprefix(PACKAGE + ".").split(".")[0]


def graph(root: Path) -> dict[str, dict[str, int]]:
    """The import graph among the server's modules: module -> {imported module: line}."""
    found = modules(root)
    known = set(found)
    edges: dict[str, dict[str, int]] = {name: {} for name in found}
    for name, path in found.items():
        for target, line in imports(name, path, known):
            if target in known and target != name:
                edges[name].setdefault(target, line)
    return edges


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import graph's circles: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def upward(edges: dict[str, dict[str, int]]) -> list[str]:
    """Imports that go up the levels, or sideways into another wing of the same level."""
    wrong = []
    for source, targets in sorted(edges.items()):
        if source == PACKAGE:
            continue
        for target, line in sorted(targets.items()):
            if target == PACKAGE:
                wrong.append(f"{source}:{line} imports the package's facade")
                continue
            here, there = wing(source), wing(target)
            if here != there and LEVELS[there] >= LEVELS[here]:
                wrong.append(f"{source}:{line} ({here}) imports {target} ({there})")
    return wrong


def transport_imports(root: Path) -> list[str]:
    found = modules(root)
    return [
        f"{name}:{line} imports {target}"
        for name, path in found.items() if wing(name) in TRANSPORT_FREE
        for target, line in imports(name, path, set(found)) if target.split(".")[0] in TRANSPORTS
    ]


def long_modules(root: Path) -> list[str]:
    return [f"{path.relative_to(root)}: {n} lines" for path in sorted(root.rglob("*.py"))
            if (n := path.read_text(encoding="utf-8").count("\n")) > MAX_LINES]


def test_every_module_has_a_wing() -> None:
    assert {wing(name) for name in modules(SERVER) if name != PACKAGE} == set(LEVELS)


def test_the_server_imports_have_no_circle() -> None:
    assert circles(graph(SERVER)) == []


def test_each_wing_imports_only_the_wings_below_it() -> None:
    assert upward(graph(SERVER)) == []


def test_the_core_and_the_errors_import_no_transport_library() -> None:
    assert transport_imports(SERVER) == []


def test_the_transports_take_what_they_need_explicitly() -> None:
    """No transport reaches into the data plane for a part of it by name (`getattr(dataplane, "metrics")`): the
    composition root hands each what it needs. (An operation looked up by the endpoint's name is the dispatch.)"""
    reached = [
        f"{path.relative_to(SERVER)}:{node.lineno}"
        for path in sorted(SERVER.rglob("*.py")) if path.relative_to(SERVER).parts[0] in ("rest", "grpc")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
        and isinstance(node.args[0], ast.Name) and "dataplane" in node.args[0].id
        and isinstance(node.args[1], ast.Constant)
    ]
    assert reached == []


def test_settings_are_frozen() -> None:
    """What the server works out from its settings lives where it is worked out: the settings stay as given."""
    from oip.server import DataPlane, ModelRepository, Settings

    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.extensions = ["parameters"]  # type: ignore[misc]
    served = DataPlane(ModelRepository(), settings)
    assert settings == Settings() and "parameters" in served.enabled


def test_no_module_of_the_server_is_over_600_lines() -> None:
    assert long_modules(SERVER) == []
    assert long_modules(ROOT / "oipgen" / "runtime" / "server") == []


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    root = tmp_path / "server"
    shutil.copytree(SERVER, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted() -> None:\n    {line}\n", encoding="utf-8")


def test_a_planted_circle_is_found(copy: Path) -> None:
    """The checks can fail: a supervisor that calls back into the command line (the circle the layout removed) is
    a circle and an import sideways, found in a function body too."""
    _plant(copy / "process" / "supervisor.py", "from .main import run_worker  # noqa")
    assert circles(graph(copy)) == [["oip.server.process.main", "oip.server.process.supervisor"]]
    _plant(copy / "core" / "pipeline.py", "from ..rest import app  # noqa")
    assert any("oip.server.core.pipeline" in line and "oip.server.rest.app" in line for line in upward(graph(copy)))


def test_a_planted_transport_import_and_a_long_module_are_found(copy: Path) -> None:
    _plant(copy / "errors.py", "import grpc  # noqa")
    assert [line.split(":")[0] for line in transport_imports(copy)] == ["oip.server.errors"]
    (copy / "core" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert long_modules(copy) == [f"core/long.py: {MAX_LINES + 1} lines"]
