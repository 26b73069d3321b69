"""The package's shape holds (DESIGN.md section 5), counting lazy and type-checking imports
as imports: no import circle anywhere in ``ftkit``, the lower layers (``model``, ``tasks``,
``engines``, ``evidence``) never import ``ftkit.train``, and no module is over 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ftkit"
MAX_LINES = 450


def _imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in it (a function body included),
    with ``from m import n`` also as ``m.n`` (``n`` may be a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as the list of its modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t]
            if t not in state and (found := visit(t, [*path, t])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def test_circle_finder_finds_a_lazy_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_ftkit() -> None:
    mods = _modules()
    graph = {m: {t for t in _imports(p) if t in mods and t != m} for m, p in mods.items()}
    circle = _circle(graph)
    assert circle is None, f"import circle: {' -> '.join(circle or [])}"


@pytest.mark.parametrize("layer", ["model", "tasks", "engines", "evidence"])
def test_lower_layers_do_not_import_train(layer: str) -> None:
    for name, path in _modules().items():
        if name.startswith(f"ftkit.{layer}"):
            assert not [t for t in _imports(path) if t.startswith("ftkit.train")], name


def test_no_module_over_450_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by what they hold): {long}"
