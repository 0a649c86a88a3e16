"""The package's layering, read from its source: no import cycle between modules or between
serve_app's packages (every import counted: module level, in functions, under TYPE_CHECKING),
the engine, runner, grammar, serving, prompts and api layers free of Ray and FastAPI, and the
server free of the repository's training code (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("serve_app", "deployments")
INNER_LAYERS = ("engine", "runner", "grammar", "serving", "prompts", "api")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``path`` imports, relative imports resolved; ``from a import b``
    names both ``a`` and ``a.b`` (``b`` may be a module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def import_graph(group: int | None) -> dict[str, set[str]]:
    """Edges between project modules, or between their first ``group`` name parts."""
    modules = project_modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def key(name: str) -> str:
        return ".".join(name.split(".")[:group]) if group else name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        for imported in imported_names(name, path):
            target = owner(imported)
            if target is not None and key(target) != key(name):
                graph.setdefault(key(name), set()).add(key(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("group", [None, 2], ids=["modules", "packages"])
def test_no_import_cycle(group):
    assert cycles(import_graph(group)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_inner_layers_import_neither_ray_nor_fastapi():
    for name, path in project_modules().items():
        if name.split(".")[1:2] in [[layer] for layer in INNER_LAYERS]:
            frameworks = {imported.split(".")[0] for imported in imported_names(name, path)}
            assert not frameworks & {"ray", "fastapi", "starlette"}, name


def is_training(name: str) -> bool:
    return name == "training" or name.startswith("training.")


def test_the_server_imports_no_training_code():
    """training/ imports serve_app (the prompts it trains on, the adapter record's name),
    never the reverse: the server's import graph holds no trainer, miner or peft."""
    for name, path in project_modules().items():
        training = sorted(filter(is_training, imported_names(name, path)))
        assert not training, f"{name} imports {training}"
        assert not name.startswith("serve_app.training"), name


# What a Serve config's import_path, a replica and the HTTP app load.
ENTRY_POINTS = (
    "serve_app.app",
    "serve_app.http.app",
    "serve_app.engine.startup",
    "serve_app.prepare",
    *sorted(name for name in project_modules() if name.split(".")[0] == "deployments"),
)


def test_serving_entry_points_load_no_training_module():
    """Imported for real, in a fresh interpreter on this checkout: no ``training`` module
    in ``sys.modules`` after the serving entry points (a lazy or dynamic import included)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(ENTRY_POINTS)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'root': sys.modules['serve_app'].__file__, 'training': "
        "sorted(m for m in sys.modules if m == 'training' or m.startswith('training.'))}))\n"
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(loaded["root"]).is_relative_to(ROOT)
    assert loaded["training"] == []
