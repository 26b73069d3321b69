"""Human (Rich) rendering of an ``AnalysisResult``: run summary, rule table, findings by
severity, recovery table, one-line verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.analysis_text import RECOVERY_COLUMNS, plural, recovery_cell, verdict_line
from ftkit.report.escaping import literal

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_FINDINGS = 100
Column = tuple[str, int, bool]  # (header, priority: 0 is kept first, text: left-aligned and wrapped)
RULE_COLUMNS: list[Column] = [
    ("code", 0, True),
    ("rule", 1, True),
    ("severity", 4, True),
    ("checked", 3, False),
    ("findings", 2, False),
]
RECOVERY_PRIORITY = (
    "index",
    "kind",
    "recovered_by",
    "samples_lost",
    "cell",
    "step",
    "detect_s",
    "next_commit_s",
    "heal_s",
    "steps_discarded",
    "reconfigure_s",
    "engine",
    "heal_bytes",
)


def _retrained(s: dict[str, Any]) -> str:
    """`` (N trained again after a restart)`` when a resumed session trained committed steps again."""
    again = sum(r["retrained"] for r in s.get("restarts") or [])
    return f" ({again} trained again after a restart)" if again else ""


def _restarts(s: dict[str, Any]) -> str:
    """``1 restart (from the checkpoint of step 11), `` for a resumed run; nothing otherwise."""
    restarts = s.get("restarts") or []
    if not restarts:
        return ""
    froms = ", ".join("the start" if r["checkpoint_step"] < 0 else f"step {r['checkpoint_step']}" for r in restarts)
    return f"{plural(len(restarts), 'restart')} (resumed from {froms}), "


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
        f"{s['steps_committed']} committed steps of {s['steps_closed']} attempts{_retrained(s)}; "
        f"{plural(s['faults'], 'fault')}, {plural(s['heals'], 'heal')}, {_restarts(s)}"
        f"{plural(s.get('engine_restarts', 0), 'engine restart')}; "
        f"{plural(s['events'], 'event')} in {plural(s['files'], 'file')}; "
        f"{duration} logged"
    )
    peaks = s.get("peak_rss_bytes")
    if peaks:
        shown = ", ".join(f"{role} {peak / 2**20:,.0f} MiB" for role, peak in peaks.items())
        console.print(f"[bold]Peak memory[/bold] (resident, the largest process of each role): {literal(shown)}")
    placed = s.get("placement")
    if placed:
        where = [f"cell {c} on {', '.join(sorted(set(ns)))}" for c, ns in placed["cells"].items()]
        where += [f"engine {e} on {n}" for e, n in placed["engines"].items()]
        console.print(
            f"[bold]Placement[/bold] ({placed['nodes']} nodes, last incarnations): {literal('; '.join(where))}"
        )

    rows = []
    for r in result.rules:
        if r.status == "not run":
            shown = "[dim]not run[/dim]"
        else:
            style = _STYLE[r.severity.value] if r.findings else "green"
            shown = f"[{style}]{r.findings}[/{style}]"
        checked = "[yellow]not covered[/yellow]" if r.status == "not covered" else str(r.checked)
        rows.append([r.code, r.rule, r.severity.value, checked, shown])
    console.print(_fitted("Rules", RULE_COLUMNS, rows, console.width))

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
        rows = []
        for row in result.recovery:
            cells = [literal(recovery_cell(row.get(c))) for c in RECOVERY_COLUMNS]
            lost = row.get("samples_lost")
            if lost:
                cells[RECOVERY_COLUMNS.index("samples_lost")] = f"[bold red]{literal(lost)}[/bold red]"
            rows.append(cells)
        columns = [(c, RECOVERY_PRIORITY.index(c), c in ("kind", "recovered_by")) for c in RECOVERY_COLUMNS]
        console.print(_fitted("Recovery (seconds after each fault)", columns, rows, console.width))

    if s.get("step_phases"):
        console.print(phases_table(s["step_phases"]))

    style = "bold green" if outcome == "pass" else "bold red"
    console.print(f"[{style}]{literal(verdict_line(result, outcome))}[/{style}]")


def phases_table(summary: dict[str, Any]) -> Table:
    """Where the steps' time went (``ftkit.analysis.step_phases``): per phase its median and max
    seconds per step and its share of all steps' wall time, largest first, like Megatron's timers."""
    wall = summary["wall"]
    table = Table(
        title=f"Where a step's time goes ({plural(summary['steps'], 'step')}; wall median {wall['median']:.4f}s, "
        f"max {wall['max']:.4f}s)",
        title_justify="left",
    )
    for col, justify in (("phase", "left"), ("median s", "right"), ("max s", "right"), ("share", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]  # rich's JustifyMethod literal
    rest = summary["unattributed"]
    rows = [*summary["phases"].items(), ("(unattributed)", {**rest, "share": rest["total"] / (wall["total"] or 1.0)})]
    for name, row in rows:
        table.add_row(literal(name), f"{row['median']:.4f}", f"{row['max']:.4f}", f"{100 * row['share']:.1f}%")
    return table


def _fitted(title: str, columns: list[Column], rows: list[list[str]], width: int) -> Table:
    """A table of the columns that fit ``width``, taken by priority (the two first always):
    a narrow terminal loses the least important columns whole, said in the caption, instead of
    every column shrinking to ``x…``; text columns wrap rather than cut."""
    from rich.text import Text

    def need(i: int) -> int:
        cells = [Text.from_markup(row[i]).cell_len for row in rows]
        return max([len(columns[i][0]), *cells]) + 3  # padding and border

    kept: list[int] = []
    used = 1
    for i in sorted(range(len(columns)), key=lambda i: columns[i][1]):
        if len(kept) < 2 or used + need(i) <= width:
            kept.append(i)
            used += need(i)
    kept.sort()
    left = [columns[i][0] for i in range(len(columns)) if i not in kept]
    caption = f"not shown at this width: {', '.join(left)} (--format json has them)" if left else None
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for i in kept:
        header, _, text = columns[i]
        table.add_column(header, justify="left" if text else "right", overflow="fold", min_width=min(len(header), 8))
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table
