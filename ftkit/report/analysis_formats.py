"""The ``Report`` of an ``AnalysisResult`` (analyze-events, and the forensics part of train):
the JSON document, the verdict line and the Markdown step summary. Plain text, never Rich."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.analysis_text import RECOVERY_COLUMNS, recovery_cell, verdict_line
from ftkit.report.emit import Report
from ftkit.report.escaping import md_text
from ftkit.report.github import markdown_table

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

SUITE = "ftkit.analyze-events"


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


def report(result: AnalysisResult, outcome: str) -> Report:
    """The ``Report`` of ``ftkit analyze-events`` for ``emit`` (Rich is imported only for the human format)."""

    def human(console: Console) -> None:
        from ftkit.report.analysis_human import render_human

        render_human(console, result, outcome)

    return Report(
        command="analyze-events",
        verdict=outcome,
        findings=result.findings,
        rules=result.rules,
        summary=verdict_line(result, outcome),
        document=lambda: json_document(result, outcome),
        human=human,
        step_summary=lambda: step_summary(result, outcome),
        seconds=result.seconds,
        rule_seconds=result.rule_seconds,
    )


def step_summary(result: AnalysisResult, outcome: str) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: verdict, rules, findings (50), recovery table."""
    parts = [
        f"## ftkit analyze-events: {outcome.upper()}",
        "",
        md_text(verdict_line(result, outcome)),
        "",
        markdown_table(
            ["code", "rule", "severity", "checked", "findings", "status"],
            [(r.code, r.rule, r.severity.value, r.checked, r.findings, r.status) for r in result.rules],
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
                list(RECOVERY_COLUMNS),
                [[recovery_cell(row.get(c)) for c in RECOVERY_COLUMNS] for row in result.recovery],
            ),
        ]
    return "\n".join(parts)
