"""The diagnose package keeps one concern per module: no import cycles, no private names imported
across modules, no module over 1,000 lines (issue 24). Read with `ast`, top-level and
function-local imports alike."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ddtree_ops" / "diagnose"
PREFIX = "ddtree_ops.diagnose."


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """module -> [(imported diagnose module, names imported from it)]."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(PKG.glob("*.py")):
        mod = path.stem
        got: list[tuple[str, list[str]]] = []
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith(PREFIX):
                    got.append((node.module[len(PREFIX):], [a.name for a in node.names]))
                elif node.module == "ddtree_ops.diagnose":
                    got += [(a.name, []) for a in node.names]
            elif isinstance(node, ast.Import):
                got += [(a.name[len(PREFIX):], []) for a in node.names if a.name.startswith(PREFIX)]
        out[mod] = got
    return out


def test_no_import_cycles() -> None:
    graph = {m: {dep for dep, _ in deps if dep != m} for m, deps in _imports().items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, " -> ".join([*path, m])
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            visit(dep, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_no_private_names_across_modules() -> None:
    bad = [(m, dep, n) for m, deps in _imports().items() for dep, names in deps for n in names
           if n.startswith("_") and dep != m]
    assert not bad, bad


def test_modules_stay_small() -> None:
    sizes = {p.name: len(p.read_text("utf-8").splitlines()) for p in PKG.glob("*.py")}
    assert max(sizes.values()) <= 1000, sizes
