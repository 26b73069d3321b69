"""Machine renderings of an ``AnalysisResult``: the JSON document, GitHub annotations and the
Markdown step summary. Plain text only, never through Rich."""

from __future__ import annotations

from typing import Any

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.github import annotation_lines, markdown_table

SUITE = "ftkit.analyze-events"
RECOVERY_COLUMNS = (
    "index",
    "kind",
    "cell",
    "step",
    "detect_s",
    "reconfigure_s",
    "heal_s",
    "steps_discarded",
    "samples_lost",
    "recovered_by",
)


def json_document(result: AnalysisResult, outcome: str) -> dict[str, Any]:
    """``{verdict, findings, rules, stats, recovery, notes}`` (``schema_version`` added by Output.json)."""
    return {
        "verdict": outcome,
        "findings": [f.model_dump(mode="json") for f in result.findings],
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "stats": result.stats,
        "recovery": result.recovery,
        "notes": result.notes,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def verdict_line(result: AnalysisResult, outcome: str) -> str:
    counts = {s: sum(1 for f in result.findings if f.severity.value == s) for s in ("error", "warning", "info")}
    total = sum(r.findings for r in result.rules)
    return (
        f"{outcome.upper()}: {total} finding(s) ({counts['error']} error, {counts['warning']} warning listed) "
        f"in {result.stats['events']} events from {result.stats['files']} file(s)"
    )


def github_text(result: AnalysisResult, outcome: str) -> str:
    """One workflow command per finding, then a ``::notice`` verdict line."""
    lines = [annotation_lines(result.findings)] if result.findings else []
    level = "error" if outcome == "fail" else "notice"
    lines.append(f"::{level} title=ftkit analyze-events::{verdict_line(result, outcome)}")
    return "\n".join(lines)


def step_summary(result: AnalysisResult, outcome: str) -> str:
    parts = [
        f"## ftkit analyze-events: {outcome.upper()}",
        "",
        verdict_line(result, outcome),
        "",
        markdown_table(
            ["code", "rule", "severity", "checked", "findings"],
            [(r.code, r.rule, r.severity.value, r.checked, r.findings) for r in result.rules],
        ),
    ]
    if result.findings:
        parts += [
            "",
            "### Findings",
            "",
            markdown_table(
                ["code", "severity", "message"], [(f.code, f.severity.value, f.message) for f in result.findings[:50]]
            ),
        ]
    if result.recovery:
        parts += [
            "",
            "### Recovery",
            "",
            markdown_table(
                list(RECOVERY_COLUMNS), [[_cell(row.get(c)) for c in RECOVERY_COLUMNS] for row in result.recovery]
            ),
        ]
    return "\n".join(parts)
