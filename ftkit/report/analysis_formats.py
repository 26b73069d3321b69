"""The ``Report`` of an ``AnalysisResult`` (analyze-events, and the forensics part of train):
the JSON document, the verdict line and the Markdown step summary. Plain text, never Rich."""

from __future__ import annotations

from typing import Any

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.emit import Report
from ftkit.report.escaping import md_text
from ftkit.report.github import markdown_table

SUITE = "ftkit.analyze-events"
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
    """A recovery-table cell: ``-`` for None, 3 decimals for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def verdict_line(result: AnalysisResult, outcome: str) -> str:
    """``PASS: 0 finding(s) (...) in N events from M file(s)``."""
    counts = {s: sum(1 for f in result.findings if f.severity.value == s) for s in ("error", "warning", "info")}
    total = sum(r.findings for r in result.rules)
    uncovered = [r.code for r in result.rules if r.not_covered]
    return (
        f"{outcome.upper()}: {total} finding(s) ({counts['error']} error, {counts['warning']} warning listed) "
        f"in {result.stats['events']} events from {result.stats['files']} file(s)"
        + (f"; not covered (evidence not promised): {', '.join(uncovered)}" if uncovered else "")
    )


def report(result: AnalysisResult, outcome: str) -> Report:
    """The ``Report`` of ``ftkit analyze-events`` for ``emit``."""
    from ftkit.report.analysis_human import render_human

    return Report(
        command="analyze-events",
        verdict=outcome,
        findings=result.findings,
        rules=result.rules,
        summary=verdict_line(result, outcome),
        document=lambda: json_document(result, outcome),
        human=lambda console: render_human(console, result, outcome),
        step_summary=lambda: step_summary(result, outcome),
    )


def step_summary(result: AnalysisResult, outcome: str) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: verdict, rules, findings (50), recovery table."""
    parts = [
        f"## ftkit analyze-events: {outcome.upper()}",
        "",
        md_text(verdict_line(result, outcome)),
        "",
        markdown_table(
            ["code", "rule", "severity", "checked", "findings"],
            [
                (r.code, r.rule, r.severity.value, "not covered" if r.not_covered else r.checked, r.findings)
                for r in result.rules
            ],
        ),
    ]
    if result.findings:
        parts += [
            "",
            "### Findings",
            "",
            markdown_table(
                ["code", "severity", "message", "where", "how to fix"],
                [(f.code, f.severity.value, f.message, f.where() or "-", f.fix) for f in result.findings[:50]],
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
