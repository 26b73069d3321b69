"""The ``Report`` of ``ftkit compare-runs``: JSON document, human rendering, verdict line, step
summary, JUnit cases (one per code) and, through ``runs_html``, the HTML page.

JSON (``schema_version`` and ``verdict`` added by ``emit``)::

    {"command": "compare-runs", "a": [...], "b": [...], "mode": "exact (bitwise)",
     "first_divergence": null | {"step", "rollout", "what", "tensor", "message", "also",
                                 "differing_steps", "common_steps_from", ["version"]},
     "config_diff": [{"field", "a", "b", "kind"}...],   # kind: result | length | neutral
     "steps": {"a", "b", "common", "differ", "only_a", "only_b"},
     "kinds": {kind: {"compared", "differ", "a_only", "b_only"}},
     "strip": [{"from", "to", "status", "count"}...],   # status: equal | differs | only_a | only_b
     "divergent_steps": [{"step", "rollout", "what"}...], "runs": [{...}, {...}],
     "findings": [...], "rules": [...], "notes": [...]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.report.emit import Report
from ftkit.report.escaping import literal, md_text
from ftkit.report.github import markdown_table
from ftkit.report.runs_text import cause_line, first_line
from ftkit.runs.compare import RunsResult

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from rich.console import Console


def document(result: RunsResult) -> dict[str, Any]:
    return {
        "command": "compare-runs",
        "a": result.a,
        "b": result.b,
        "mode": result.options.tolerance.describe(),
        "first_divergence": result.first_divergence,
        "config_diff": result.config,
        "steps": result.steps,
        "kinds": result.kinds,
        "strip": result.strip,
        "divergent_steps": result.divergent,
        "runs": result.sides,
        "findings": [f.model_dump(mode="json") for f in result.findings],
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "notes": result.notes,
    }


def summary_line(result: RunsResult, verdict: str) -> str:
    cause = cause_line(result)
    return f"{verdict}: " + (f"{cause}; " if cause else "") + first_line(result)


def report(result: RunsResult) -> Report:
    verdict = result.verdict

    def human(console: Console) -> None:
        render_human(console, result, verdict)

    def html(base: Path | None) -> str:
        from ftkit.report.runs_html import render_html

        return render_html(result, verdict, base)

    return Report(
        command="compare-runs",
        verdict=verdict,
        findings=result.findings,
        rules=result.rules,
        summary=summary_line(result, verdict),
        document=lambda: document(result),
        human=human,
        step_summary=lambda: step_summary(result, verdict),
        html=html,
        rule_seconds=result.rule_seconds,
    )


def render_human(console: Console, result: RunsResult, verdict: str) -> None:
    from rich.table import Table

    cause = cause_line(result)
    if cause:  # the cause before anything else
        console.print(f"[bold yellow]{literal(cause)}[/bold yellow]")
    s = result.steps
    console.print(
        f"[bold]compare-runs[/bold] {literal(' '.join(result.a))} vs {literal(' '.join(result.b))} "
        f"({result.options.tolerance.describe()}): A {s['a']} step(s), B {s['b']} step(s), {s['common']} in common"
    )
    table = Table("evidence", "compared", "differ", "only in A", "only in B")
    for kind, k in result.kinds.items():
        table.add_row(kind, str(k["compared"]), str(k["differ"]), str(k["a_only"]), str(k["b_only"]))
    console.print(table)
    if result.config:
        cfg = Table("config field", "A", "B", "kind")
        for r in result.config[:20]:
            cfg.add_row(literal(r["field"]), literal(repr(r["a"])), literal(repr(r["b"])), r["kind"])
        console.print(cfg)
    for f in result.findings:
        colour = {"error": "red", "warning": "yellow"}.get(f.severity.value, "dim")
        console.print(f"[{colour}]{f.code} {f.rule}[/{colour}]: {literal(f.message)}")
    for note in result.notes:
        console.print(f"[dim]note: {literal(note)}[/dim]")
    mark = "[bold green]PASS[/bold green]" if verdict == "pass" else "[bold red]FAIL[/bold red]"
    console.print(f"{mark} {literal(first_line(result))}")


def step_summary(result: RunsResult, verdict: str) -> str:
    md = [f"### ftkit compare-runs: {verdict}", ""]
    cause = cause_line(result)
    if cause:
        md += [f"**{md_text(cause)}**", ""]
    md += [md_text(first_line(result)), ""]
    md.append(
        markdown_table(
            ["evidence", "compared", "differ", "only in A", "only in B"],
            [(k, v["compared"], v["differ"], v["a_only"], v["b_only"]) for k, v in result.kinds.items()],
        )
    )
    return "\n".join(md)
