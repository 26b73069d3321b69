"""Count the parameters of ``ftkit/train`` functions annotated with ``Any`` (bare or inside a
container, e.g. ``dict[str, Any]``), against all annotated-or-not parameters (``self`` and
``cls`` left out). ``python scripts/any_params.py [DIR]`` prints ``any total percent`` and the
worst files; ``tests/train/test_any_budget.py`` holds the share below 8%."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _mentions_any(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return "Any" in node.value
    return any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(node)
    )


def count(root: Path) -> dict[str, tuple[int, int]]:
    """``{file: (parameters annotated with Any, parameters)}`` for every ``.py`` under ``root``."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        any_n = total = 0
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            for p in params:
                if p.arg in ("self", "cls"):
                    continue
                total += 1
                any_n += _mentions_any(p.annotation)
        out[str(path)] = (any_n, total)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "ftkit" / "train"
    counts = count(root)
    any_n = sum(a for a, _ in counts.values())
    total = sum(t for _, t in counts.values())
    print(f"{any_n} {total} {100 * any_n / max(total, 1):.1f}%")
    for name, (a, t) in sorted(counts.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"  {a:4d} / {t:4d}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
