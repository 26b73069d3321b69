"""The training core's shape holds: no import circle inside ``ftkit.train`` (lazy and
type-checking imports included), nothing in ``ftkit.model`` imports ``ftkit.train``, every
sub-package says what it holds, and fewer than 8% of the parameters of ``train/`` functions
are annotated with ``Any`` (``scripts/any_params.py``)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "ftkit" / "train"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def test_no_import_circle_in_train() -> None:
    mods = _modules(TRAIN)
    graph = {m: {t for t in _imports(p) if t in mods and t != m} for m, p in mods.items()}
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in sorted(graph[m]):
            assert seen.get(t) != 1, f"import circle: {' -> '.join([*path[path.index(t) :], t])}"
            if t not in seen:
                visit(t, [*path, t])
        seen[m] = 2

    for m in sorted(mods):
        if m not in seen:
            visit(m, [m])


def test_model_does_not_import_train() -> None:
    for name, path in _modules(ROOT / "ftkit" / "model").items():
        assert not [t for t in _imports(path) if t.startswith("ftkit.train")], name


def test_every_sub_package_says_what_it_holds() -> None:
    for init in TRAIN.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 120, f"{init.relative_to(ROOT)} needs a one-paragraph docstring"
    assert not [p.name for p in TRAIN.glob("*.py") if p.name != "__init__.py"]  # every module in a sub-package


def test_any_annotated_parameters_stay_below_8_percent() -> None:
    spec = importlib.util.spec_from_file_location("any_params", ROOT / "scripts" / "any_params.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["any_params"] = module
    spec.loader.exec_module(module)
    counts = module.count(TRAIN)
    any_n, total = sum(a for a, _ in counts.values()), sum(t for _, t in counts.values())
    assert total > 500 and any_n / total < 0.08, f"{any_n} of {total} parameters are annotated with Any"
