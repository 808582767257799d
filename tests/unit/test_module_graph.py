"""The code's shape: its imports form no circle, and no module outgrows one concern.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import`` wherever it stands
(module level, inside a function, under ``if TYPE_CHECKING``), relative ones resolved, ``from package import name``
counted as an import of the submodule when ``name`` is one. A package's ``__init__`` is an edge only where it is
named (``from inferq import __version__``), not for each submodule below it. A circle, however it is imported, is
two modules that cannot be understood (or split, or moved) one without the other; the test names every circle it
finds. The size check holds each module to about 400 lines (docs/development.md: split by responsibility first).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("functions", "gpu_worker", "emulator", "inferq", "bench")
"""Where the graph is read: every folder of Python code but the tests."""
SIZED = PACKAGES
"""Every package of the repository is held to the size limit."""
MAX_LINES = 400
SIZE_SLACK = 20
""""About 400": a module may pass 400 by a docstring's worth while its split is not worth making."""
PRODUCT = ("inferq", "functions", "gpu_worker", "emulator")
"""The product's code: what is deployed or run by users (the benchmarks and the tests are not held to the next)."""
MAX_FUNCTION_LINES = 80
"""A function a reader can hold at once: one longer than this does several things, and is split by what they are."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def sources(packages: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def imported(name: str, path: Path, modules: set[str]) -> Iterator[str]:
    """The modules of ``modules`` that the source of ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    yield submodule
                elif base in modules:
                    yield base


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = sources(packages)
    names = set(files)
    return {name: set(imported(name, path, names)) - {name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each set of modules tied together by imports, sorted."""
    return sorted(_circle_through(graph, component) for component in tangles(graph))


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Every strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(start: str) -> None:  # iterative: a deep chain of imports must not hit the recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _circle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle from the component's first module back to itself, within the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_the_imports_form_no_circle() -> None:
    graph = import_graph(tuple(p for p in PACKAGES if (ROOT / p).is_dir()))
    found = [f"{' -> '.join(_circle_through(graph, tangle))} (tied together: {', '.join(sorted(tangle))})"
             for tangle in tangles(graph)]
    assert found == [], "import circles:\n" + "\n".join(sorted(found))


def test_the_package_imports_nothing_of_the_repository() -> None:
    """Imports go one way: ``functions/``, ``gpu_worker/``, ``emulator/`` and ``bench/`` build on ``inferq``, the
    package the wheel installs alone, which never reaches back into them (``inferq up`` finds the emulator through
    an entry point the repository registers: inferq/cli/main.py)."""
    graph = import_graph(tuple(p for p in PACKAGES if (ROOT / p).is_dir()))
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.split(".")[0] == "inferq"
                    for target in targets if target.split(".")[0] != "inferq")
    assert upward == [], "the package imports the repository's code:\n" + "\n".join(upward)


def test_the_graph_sees_the_imports_it_must() -> None:
    """Module-level, function-level, relative and ``TYPE_CHECKING`` imports are all edges."""
    graph = import_graph(("functions",))
    assert "functions.gateway.openapi" in graph["functions.gateway.api"]  # from . import openapi
    assert "functions.gateway.api" in graph["functions.gateway.app"]  # from .api import create_app
    assert "functions.gateway.routers.console" in graph["functions.gateway.api"]  # inside a function
    assert "functions.gateway.dependencies" in graph["functions.gateway.routers.jobs"]  # from ..dependencies


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}, [["a", "b", "c", "a"], ["d", "e", "d"]]),
])
def test_circles_are_found_and_named(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert circles(graph) == expected


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("from . import two\n")
    (package / "two.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .one import x\n"
                                    "def f():\n    from pkg import one\n")
    files = {module_name(p, tmp_path): p for p in sorted(package.rglob("*.py"))}
    graph = {n: set(imported(n, p, set(files))) - {n} for n, p in files.items()}
    assert circles(graph) == [["pkg.one", "pkg.two", "pkg.one"]]


@pytest.mark.parametrize("module", sorted(sources(SIZED)))
def test_no_module_outgrows_one_concern(module: str) -> None:
    lines = len(sources(SIZED)[module].read_text().splitlines())
    assert lines <= MAX_LINES + SIZE_SLACK, f"{module}: {lines} lines; split it by responsibility (about {MAX_LINES})"


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Each function or method of ``path`` longer than ``limit`` lines, from its first decorator to its last line
    (a function nested in another counts in its parent too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                found.append(f"{node.name} (line {node.lineno}): {length} lines")
    return found


def test_no_product_function_is_over_80_lines() -> None:
    found = [f"{name}.{long}" for name, path in sources(PRODUCT).items() for long in long_functions(path)]
    assert found == [], f"functions over {MAX_FUNCTION_LINES} lines; split each by what it does:\n" + "\n".join(found)


def test_the_function_length_check_counts_decorators_and_nested_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(76))
    source = tmp_path / "m.py"
    source.write_text(f"@decorator\n@other\ndef outer():\n    def inner():\n        pass\n{body}\n")
    assert long_functions(source) == ["outer (line 3): 81 lines"]  # two decorators, def, inner (2), 76 lines
    assert long_functions(source, limit=81) == []
