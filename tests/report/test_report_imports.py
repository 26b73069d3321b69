"""``ftkit/report`` has no import circles (issue 20 item 4): every import between its modules,
at the top or inside a function, points one way."""

from __future__ import annotations

import ast
from pathlib import Path

import ftkit.report

REPORT = Path(ftkit.report.__file__).parent


def _imports(path: Path) -> set[str]:
    """The ``ftkit.report`` modules ``path`` imports anywhere (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {
            n.split(".")[2]
            for n in names
            if n.startswith("ftkit.report.") and (REPORT / f"{n.split('.')[2]}.py").exists()
        }
    return found - {path.stem}


def test_no_import_circles_in_report() -> None:
    graph = {p.stem: _imports(p) for p in REPORT.glob("*.py")}
    assert graph["analysis_formats"] and graph["compare_formats"]  # the graph was read
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
