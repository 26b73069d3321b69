"""Renderings of a ``VerifyResult`` (``ftkit verify-checkpoint``) for the shared output path
(``ftkit.report.emit``): the JSON document, the GitHub step summary, and the human report
(per-file table, rules, findings, verdict). Machine formats are plain text, never through Rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ftkit.checkpoint.results import VerifyResult
from ftkit.findings import sort_findings
from ftkit.report import github
from ftkit.report.emit import Report
from ftkit.report.escaping import literal

MAX_FINDINGS = 100
_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def json_document(result: VerifyResult, outcome: str) -> dict[str, Any]:
    """``{verdict, stats, checkpoints, files, rules, findings}`` (``schema_version`` added by Output.json)."""
    return {
        "verdict": outcome,
        "stats": result.stats,
        "checkpoints": result.checkpoints,
        "files": [vars(r) for r in result.rows],
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "findings": [f.model_dump(mode="json") for f in result.findings],
    }


def verdict_line(result: VerifyResult, outcome: str) -> str:
    s = result.stats
    errors = sum(1 for f in result.findings if f.severity.value == "error")
    warnings = sum(1 for f in result.findings if f.severity.value == "warning")
    what = "VERIFIED" if outcome == "pass" else "FAILED"
    return (
        f"{what}: {s['checkpoints']} checkpoint(s), {s['files']} file(s), {_size(s['bytes'])}; "
        f"{errors} error(s), {warnings} warning(s)" + ("; event log cross-checked" if s["events"] else "")
    )


def report(result: VerifyResult, outcome: str) -> Report:
    """The ``Report`` of ``ftkit verify-checkpoint`` for ``emit`` (the shared output path)."""
    return Report(
        command="verify-checkpoint",
        verdict=outcome,
        findings=sort_findings(result.findings),
        rules=result.rules,
        summary=verdict_line(result, outcome),
        document=lambda: json_document(result, outcome),
        human=lambda console: render_human(console, result, outcome),
        step_summary=lambda: step_summary(result, outcome),
        seconds=result.stats.get("seconds"),
        rule_seconds=result.rule_seconds,
    )


def step_summary(result: VerifyResult, outcome: str) -> str:
    parts = [
        f"## ftkit verify-checkpoint: {outcome.upper()}",
        "",
        verdict_line(result, outcome),
        "",
        github.markdown_table(
            ["checkpoint", "file", "bytes", "tensors", "status"],
            [(r.checkpoint, r.file, r.size, r.tensors, r.status) for r in result.rows],
        ),
    ]
    if result.findings:
        rows = [(f.code, f.severity.value, f.message) for f in result.findings[:50]]
        parts += ["", "### Findings", "", github.markdown_table(["code", "severity", "message"], rows)]
    return "\n".join(parts)


def render_human(console: Console, result: VerifyResult, outcome: str) -> None:
    s = result.stats
    console.print(f"[bold]verify-checkpoint[/bold] {literal(s['path'])} [dim]({literal(s['kind'])})[/dim]")
    files = Table(title="Files", title_justify="left")
    for col, just in (("checkpoint", "left"), ("file", "left"), ("bytes", "right"), ("tensors", "right"),
                      ("status", "left")):  # fmt: skip
        files.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in result.rows:
        style = "green" if r.status == "ok" else "bold red"
        files.add_row(
            literal(r.checkpoint),
            literal(r.file),
            _size(r.size),
            str(r.tensors),
            f"[{style}]{literal(r.status)}[/{style}]",
        )
    console.print(files)
    if result.findings:
        table = Table(title="Findings", title_justify="left")
        for col in ("severity", "code", "rule", "message"):
            table.add_column(col, overflow="fold")
        for f in result.findings[:MAX_FINDINGS]:
            sev = f.severity.value
            table.add_row(f"[{_STYLE[sev]}]{sev}[/{_STYLE[sev]}]", literal(f.code), literal(f.rule), literal(f.message))
        console.print(table)
        if len(result.findings) > MAX_FINDINGS:
            console.print(f"... {len(result.findings) - MAX_FINDINGS} more (use --format json for all)")
    style = "bold green" if outcome == "pass" else "bold red"
    console.print(f"[{style}]{literal(verdict_line(result, outcome))}[/{style}]")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover
