"""Plain-text pieces shared by every rendering of an ``AnalysisResult``: the verdict line and
the recovery table's columns and cells (``analysis_formats`` and ``analysis_human`` both use them)."""

from __future__ import annotations

from typing import Any

from ftkit.analysis.engine import AnalysisResult

RECOVERY_COLUMNS = (
    "index",
    "kind",
    "cell",
    "engine",
    "step",
    "detect_s",
    "reconfigure_s",
    "next_commit_s",
    "heal_s",
    "heal_bytes",
    "steps_discarded",
    "samples_lost",
    "recovered_by",
)


def recovery_cell(value: Any) -> str:
    """A recovery-table cell: ``-`` for None, 3 decimals for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def verdict_line(result: AnalysisResult, outcome: str) -> str:
    """``PASS: 0 finding(s) (...) in N events from M file(s)``, plus ``; not covered (evidence not
    promised): ...`` for rules the producer's profile leaves out and ``; K rule(s) not run (checked
    nothing)`` when some selected rules found no evidence to check."""
    counts = {s: sum(1 for f in result.findings if f.severity.value == s) for s in ("error", "warning", "info")}
    total = sum(r.findings for r in result.rules)
    not_run = [r.code for r in result.rules if r.status == "not run"]
    uncovered = [r.code for r in result.rules if r.status == "not covered"]
    return (
        f"{outcome.upper()}: {total} finding(s) ({counts['error']} error, {counts['warning']} warning listed) "
        f"in {plural(result.stats['events'], 'event')} from {result.stats['files']} file(s)"
        + (f"; not covered (evidence not promised): {', '.join(uncovered)}" if uncovered else "")
        + (f"; {len(not_run)} rule(s) not run (checked nothing): {', '.join(not_run)}" if not_run else "")
    )


def plural(n: object, word: str) -> str:
    """``1 engine``, ``2 engines``, ``None engines`` -> ``? engines`` (counts from a log may be absent)."""
    if n is None:
        return f"? {word}s"
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
