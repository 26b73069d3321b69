"""Renderings of ``ftkit check-model``'s ``ParityResult`` for the shared output path
(``ftkit.report.emit``): the JSON document, the GitHub step summary and the human report (one
row per prompt, the first divergence, findings, verdict). Machine formats never go through Rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ftkit.findings import sort_findings
from ftkit.model.hf_build import precision_dtype
from ftkit.model.parity import ParityResult
from ftkit.report import github
from ftkit.report.emit import Report

HEADER = (
    "prompt",
    "tokens",
    "max abs",
    "max rel",
    "limit",
    "argmax agree",
    "log-prob diff",
    "ftkit next",
    "transformers next",
)


def _row(p: Any) -> tuple[str, ...]:
    return (
        p.prompt,
        str(p.tokens),
        f"{p.max_abs:.3g}",
        f"{p.max_rel:.3g}",
        f"{p.limit:.3g}",
        f"{100 * p.argmax_agree:.1f}%",
        f"{p.logprob_max_diff:.3g}",
        repr(p.next_ftkit),
        repr(p.next_reference),
    )


def verdict_line(result: ParityResult, outcome: str) -> str:
    within = sum(p.within and p.next_agrees for p in result.prompts)
    what = "PARITY" if outcome == "pass" else "MISMATCH"
    worst = max((p.max_abs for p in result.prompts), default=0.0)
    line = f"{what}: {within}/{len(result.prompts)} prompt(s) within tolerance, max abs logit difference {worst:.3g}"
    if result.first_divergence:
        line += f"; first divergence: {result.first_divergence['layer']}"
    return line


def document(result: ParityResult) -> dict[str, Any]:
    return {
        "command": "check-model",
        "model": result.model,
        "family": result.family,
        "precision": result.precision,
        "tolerance": {"atol": result.atol, "rtol": result.rtol},
        "prompts": [p.to_dict() for p in result.prompts],
        "first_divergence": result.first_divergence,
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "findings": [f.model_dump(mode="json") for f in result.findings],
    }


def render_human(console: Console, result: ParityResult, outcome: str) -> None:
    console.print(f"[bold]check-model[/bold] {escape(result.model)} [dim]({result.family})[/dim]")
    dtype = precision_dtype(result.precision)
    table = Table(title=f"Logit parity vs transformers (CPU, {dtype})", title_justify="left")
    for col in HEADER:
        table.add_column(col, overflow="fold")
    for p in result.prompts:
        style = "green" if p.within and p.next_agrees else "bold red"
        cells = [escape(c) for c in _row(p)]
        table.add_row(*cells[:-2], f"[{style}]{cells[-2]}[/{style}]", cells[-1])
    console.print(table)
    if result.findings:
        findings = Table(title="Findings", title_justify="left")
        for col in ("severity", "code", "rule", "message"):
            findings.add_column(col, overflow="fold")
        for f in sort_findings(result.findings):
            findings.add_row(f.severity.value, f.code, f.rule, escape(f.message))
        console.print(findings)
    style = "bold green" if outcome == "pass" else "bold red"
    console.print(f"[{style}]{escape(verdict_line(result, outcome))}[/{style}]")


def step_summary(result: ParityResult, outcome: str) -> str:
    parts = [f"## ftkit check-model: {outcome.upper()}", "", github.markdown_table(HEADER, map(_row, result.prompts))]
    return "\n".join([*parts, "", verdict_line(result, outcome)])


def report(result: ParityResult, outcome: str) -> Report:
    """The ``Report`` of ``ftkit check-model`` for ``emit``."""
    return Report(
        command="check-model",
        verdict=outcome,
        findings=sort_findings(result.findings),
        rules=result.rules,
        summary=verdict_line(result, outcome),
        document=lambda: document(result),
        human=lambda console: render_human(console, result, outcome),
        step_summary=lambda: step_summary(result, outcome),
    )
