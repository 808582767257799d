"""bench/'s layout (issue 38): no import circle between its modules, none over ~400 lines, and bench/README.md
says what each one reports."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
MOST_LINES = 400


def _imports(path: Path) -> set[str]:
    """The bench modules ``path`` imports (relative imports and ``bench.<module>``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("bench."):
            found.add((node.module or "").split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "bench":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in BENCH.glob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_circle_between_bench_modules() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_bench_module_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in BENCH.glob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > MOST_LINES}


def test_the_readme_names_every_module() -> None:
    readme = (BENCH / "README.md").read_text()
    missing = [p.name for p in BENCH.glob("*.py") if p.name != "__init__.py" and f"`{p.name}`" not in readme]
    assert not missing, f"bench/README.md does not say what these report: {missing}"
