"""``compare-dumps --rules FILE``: regex -> predicate over a pair's metrics, fail closed.

The file is TOML with an array of ``[[rule]]`` tables, tried in file order; the first rule
whose ``match`` regex is found (``re.search``) in a tensor's id decides::

    [[rule]]
    name = "weights stay bitwise identical"     # optional, shown in findings
    match = '\\.param$'
    require = "bitwise_equal"

    [[rule]]
    match = '\\.output(_grad)?(\\.\\d+)?$'
    require = "max_rel <= 1e-3 and dissimilarity < 1e-6 and nonfinite_mismatch == 0"

``require`` is an expression over the metric names of ``ftkit.dumps.metrics.Metrics``
(``RULE_VARIABLES``): numbers, ``true``/``false``, comparisons (chains allowed), ``and``,
``or``, ``not``, unary minus and parentheses. Nothing else is accepted and nothing is
``eval``-ed. A tensor that no rule matches fails (fail closed).
"""

from __future__ import annotations

import ast
import operator
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftkit.errors import ConfigError, InputError
from ftkit.tensors.untrusted import open_regular, short_repr

MAX_FILE = 1 << 20  # bytes of a rules file
MAX_TEXT = 10_000  # characters of one regex or require expression
MAX_DEPTH = 50  # nesting levels of a require expression

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the tomllib backport
    import tomli as tomllib

RULE_VARIABLES = (
    "numel",
    "bitwise_equal",
    "bits_differ",
    "tol_fail",
    "max_abs",
    "max_rel",
    "mean_abs",
    "dissimilarity",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
    "nonfinite_mismatch",
)
_CMP = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_CONST = {"true": True, "false": False, "inf": float("inf")}


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    require: str
    tree: ast.Expression

    def passes(self, metrics: dict[str, Any]) -> bool:
        return bool(_eval(self.tree.body, metrics))


@dataclass(frozen=True)
class RuleSet:
    path: Path
    rules: tuple[Rule, ...]

    def rule_for(self, item_id: str) -> Rule | None:
        """The first rule whose regex matches ``item_id``; ``None`` when no rule covers it."""
        return next((r for r in self.rules if r.pattern.search(item_id)), None)


def rule_set(rules: list[tuple[str, str]], source: str) -> RuleSet:
    """A ``RuleSet`` of ``(match, require)`` pairs made in code (``source`` names them in
    findings), checked exactly as a file's rules are (``ConfigError`` for a malformed one)."""
    where = Path(source)
    return RuleSet(where, tuple(_rule(where, i, {"match": m, "require": r}) for i, (m, r) in enumerate(rules, 1)))


def load_rules(path: str | Path) -> RuleSet:
    """Parse and check a rules file; ``ConfigError`` (exit 2) for anything malformed, however
    large or deeply nested (bounded: ``MAX_FILE`` bytes, ``MAX_TEXT`` characters per regex or
    expression, ``MAX_DEPTH`` levels of expression nesting)."""
    p = Path(path)
    try:
        with open_regular(p) as fh:
            raw = fh.read(MAX_FILE + 1)
    except OSError as exc:
        raise InputError(f"cannot read rules file {p}: {exc.strerror or exc}", "check the --rules path") from exc
    if len(raw) > MAX_FILE:
        raise ConfigError(f"rules file {p} is larger than {MAX_FILE >> 10} KiB", "a rules file holds a few rules")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
        what = "nested too deeply" if isinstance(exc, (RecursionError, MemoryError)) else str(exc)
        raise ConfigError(f"rules file {p} is not valid TOML: {what}", "see docs/dumps.md for the format") from None
    raw = doc.get("rule")
    extra = set(doc) - {"rule"}
    if not isinstance(raw, list) or not raw or extra:
        raise ConfigError(
            f"rules file {p} must hold only a non-empty [[rule]] array"
            + (f" (unknown keys: {sorted(extra)})" if extra else ""),
            "see docs/dumps.md for the format",
        )
    return RuleSet(p, tuple(_rule(p, i, r) for i, r in enumerate(raw, 1)))


def _rule(p: Path, i: int, r: Any) -> Rule:
    where = f"rules file {p}, rule {i}"
    if not isinstance(r, dict) or set(r) - {"name", "match", "require"} or not {"match", "require"} <= set(r):
        raise ConfigError(
            f"{where}: needs 'match' and 'require' (and optionally 'name'), nothing else",
            "see docs/dumps.md for the format",
        )
    match, require = r["match"], r["require"]
    if not isinstance(match, str) or not isinstance(require, str) or max(len(match), len(require)) > MAX_TEXT:
        raise ConfigError(
            f"{where}: 'match' and 'require' must be strings of at most {MAX_TEXT} characters",
            "see docs/dumps.md for the format",
        )
    try:
        pattern = re.compile(match)
    except (re.error, OverflowError, RecursionError, MemoryError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid regex {short_repr(match)}: {exc}", "fix the 'match' pattern") from None
    try:
        tree = ast.parse(require, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        why = getattr(exc, "msg", None) or type(exc).__name__
        raise ConfigError(f"{where}: cannot parse require {short_repr(require)}: {why}", "see docs/dumps.md") from None
    _check(tree.body, where, 0)
    return Rule(str(r.get("name") or f"rule {i}"), pattern, require, tree)


def _check(node: ast.AST, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: require is nested more than {MAX_DEPTH} levels deep", "simplify the expression")
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, where, depth + 1)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        _check(node.operand, where, depth + 1)
    elif isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
        for v in [node.left, *node.comparators]:
            _check(v, where, depth + 1)
    elif isinstance(node, ast.Name):
        if node.id not in RULE_VARIABLES and node.id not in _CONST:
            raise ConfigError(
                f"{where}: unknown name {node.id!r}", f"use one of: {', '.join(RULE_VARIABLES)}, true, false, inf"
            )
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        pass
    else:
        raise ConfigError(
            f"{where}: unsupported expression {short_repr(ast.unparse(node))}",
            "use metric names, numbers, comparisons, and/or/not",
        )


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        return _CONST[node.id] if node.id in _CONST else env[node.id]
    assert isinstance(node, ast.Constant)  # checked at load time
    return node.value
