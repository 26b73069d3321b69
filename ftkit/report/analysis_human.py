"""Human (Rich) rendering of an ``AnalysisResult``: run summary, rule table, findings by
severity, recovery table, one-line verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.analysis_text import RECOVERY_COLUMNS, plural, recovery_cell, verdict_line
from ftkit.report.escaping import literal

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_FINDINGS = 100


def render_human(console: Console, result: AnalysisResult, outcome: str) -> None:
    """Print the whole human report of ``result`` on ``console`` (stdout's console)."""
    s = result.stats
    runs = ", ".join(s["runs"]) or "?"
    layout = (
        f"{plural(s['cells'], 'cell')} x tp{s['tp']} x pp{s['pp']}, {plural(s['engines'], 'engine')}"
        if s["cells"]
        else "layout unknown"
    )
    duration = f"{s['duration_s']:.1f}s" if s["duration_s"] is not None else "-"
    console.print(
        f"[bold]Run[/bold] {literal(runs)}: {literal(layout)}; status {literal(s['status'] or 'unknown')}; "
        f"{s['steps_committed']} committed steps of {s['steps_closed']} attempts; "
        f"{plural(s['faults'], 'fault')}, {plural(s['heals'], 'heal')}, "
        f"{plural(s.get('engine_restarts', 0), 'engine restart')}; "
        f"{plural(s['events'], 'event')} in {plural(s['files'], 'file')}; "
        f"{duration} logged"
    )
    placed = s.get("placement")
    if placed:
        where = [f"cell {c} on {', '.join(sorted(set(ns)))}" for c, ns in placed["cells"].items()]
        where += [f"engine {e} on {n}" for e, n in placed["engines"].items()]
        console.print(
            f"[bold]Placement[/bold] ({placed['nodes']} nodes, last incarnations): {literal('; '.join(where))}"
        )

    rules = Table(title="Rules", title_justify="left")
    for col, just in (
        ("code", "left"),
        ("rule", "left"),
        ("severity", "left"),
        ("checked", "right"),
        ("findings", "right"),
    ):
        rules.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in result.rules:
        if r.status == "not run":
            shown = "[dim]not run[/dim]"
        else:
            style = _STYLE[r.severity.value] if r.findings else "green"
            shown = f"[{style}]{r.findings}[/{style}]"
        checked = "[yellow]not covered[/yellow]" if r.status == "not covered" else str(r.checked)
        rules.add_row(r.code, r.rule, r.severity.value, checked, shown)
    console.print(rules)

    if result.findings:
        table = Table(title="Findings", title_justify="left", show_lines=False)
        for col in ("severity", "code", "message", "where"):
            table.add_column(col, overflow="fold")
        for f in result.findings[:MAX_FINDINGS]:
            sev = f.severity.value
            message = literal(f.message) + (f"\n[dim]fix: {literal(f.fix)}[/dim]" if f.fix else "")
            table.add_row(f"[{_STYLE[sev]}]{sev}[/{_STYLE[sev]}]", literal(f.code), message, literal(f.where() or ""))
        console.print(table)
        if len(result.findings) > MAX_FINDINGS:
            console.print(f"... {len(result.findings) - MAX_FINDINGS} more (use --format json for all)")

    if result.recovery:
        rec = Table(title="Recovery (seconds after each fault)", title_justify="left")
        for col in RECOVERY_COLUMNS:
            rec.add_column(col, justify="left" if col in ("kind", "recovered_by") else "right")
        for row in result.recovery:
            cells = [literal(recovery_cell(row.get(c))) for c in RECOVERY_COLUMNS]
            lost = row.get("samples_lost")
            if lost:
                cells[RECOVERY_COLUMNS.index("samples_lost")] = f"[bold red]{literal(lost)}[/bold red]"
            rec.add_row(*cells)
        console.print(rec)

    style = "bold green" if outcome == "pass" else "bold red"
    console.print(f"[{style}]{literal(verdict_line(result, outcome))}[/{style}]")
