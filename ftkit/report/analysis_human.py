"""Human (Rich) rendering of an ``AnalysisResult``: run summary, rule table, findings by
severity, recovery table, one-line verdict."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.analysis_formats import RECOVERY_COLUMNS, _cell, verdict_line

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_FINDINGS = 100


def render_human(console: Console, result: AnalysisResult, outcome: str) -> None:
    """Print the whole human report of ``result`` on ``console`` (stdout's console)."""
    s = result.stats
    runs = ", ".join(s["runs"]) or "?"
    layout = (
        f"{s['cells']} cells x tp{s['tp']} x pp{s['pp']}, {s['engines']} engines" if s["cells"] else "layout unknown"
    )
    duration = f"{s['duration_s']:.1f}s" if s["duration_s"] is not None else "-"
    console.print(
        f"[bold]Run[/bold] {escape(runs)}: {layout}; status {s['status'] or 'unknown'}; "
        f"{s['steps_committed']} committed steps of {s['steps_closed']} attempts; "
        f"{s['faults']} faults, {s['heals']} heals, {s.get('engine_restarts', 0)} engine restarts; "
        f"{s['events']} events in {s['files']} files; "
        f"{duration} logged"
    )
    placed = s.get("placement")
    if placed:
        where = [f"cell {c} on {', '.join(sorted(set(ns)))}" for c, ns in placed["cells"].items()]
        where += [f"engine {e} on {n}" for e, n in placed["engines"].items()]
        console.print(
            f"[bold]Placement[/bold] ({placed['nodes']} nodes, last incarnations): {escape('; '.join(where))}"
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
        style = _STYLE[r.severity.value] if r.findings else "green"
        checked = "[yellow]not covered[/yellow]" if r.not_covered else str(r.checked)
        rules.add_row(r.code, r.rule, r.severity.value, checked, f"[{style}]{r.findings}[/{style}]")
    console.print(rules)

    if result.findings:
        table = Table(title="Findings", title_justify="left", show_lines=False)
        for col in ("severity", "code", "message", "where"):
            table.add_column(col, overflow="fold")
        for f in result.findings[:MAX_FINDINGS]:
            sev = f.severity.value
            message = escape(f.message) + (f"\n[dim]fix: {escape(f.fix)}[/dim]" if f.fix else "")
            table.add_row(f"[{_STYLE[sev]}]{sev}[/{_STYLE[sev]}]", f.code, message, escape(f.where() or ""))
        console.print(table)
        if len(result.findings) > MAX_FINDINGS:
            console.print(f"... {len(result.findings) - MAX_FINDINGS} more (use --format json for all)")

    if result.recovery:
        rec = Table(title="Recovery (seconds after each fault)", title_justify="left")
        for col in RECOVERY_COLUMNS:
            rec.add_column(col, justify="left" if col in ("kind", "recovered_by") else "right")
        for row in result.recovery:
            cells = [_cell(row.get(c)) for c in RECOVERY_COLUMNS]
            lost = row.get("samples_lost")
            if lost:
                cells[RECOVERY_COLUMNS.index("samples_lost")] = f"[bold red]{lost}[/bold red]"
            rec.add_row(*cells)
        console.print(rec)

    style = "bold green" if outcome == "pass" else "bold red"
    console.print(f"[{style}]{escape(verdict_line(result, outcome))}[/{style}]")
