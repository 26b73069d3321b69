"""Human (Rich) report of ``ftkit compare-dumps``: summary, first divergence, worst N, findings."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ftkit.dumps.compare import CompareResult, PairResult
from ftkit.report.compare_rank import metrics, ordered_findings, worst
from ftkit.report.escaping import literal

MAX_FINDINGS = 40
_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def render_human(console: Console, result: CompareResult, verdict: str, top: int) -> None:
    s = result.stats
    console.print(
        f"[bold]compare-dumps[/bold] {literal(str(result.a))} [dim]vs[/dim] {literal(str(result.b))}"
        f"  [dim]({result.kind}, {literal(result.options.describe())})[/dim]"
    )
    if result.config_diff:  # said first: the tensor findings below follow from it
        console.print("[bold red]The runs differ in what shapes their data (CD012):[/bold red]")
        for k, (va, vb) in result.config_diff.items():
            console.print(f"  {literal(k)}: {literal(repr(va))} in A, {literal(repr(vb))} in B")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column(justify="right")
    for label, key in (
        ("tensors compared", "tensors"),
        ("bitwise equal", "equal"),
        ("within tolerance", "close"),
        ("differ", "differ"),
        ("shape mismatch", "shape"),
        ("dtype mismatch", "dtype"),
        ("missing in A", "missing_in_a"),
        ("missing in B", "missing_in_b"),
        ("bad shards", "invalid"),
        ("no rule", "uncovered"),
        ("rollouts missing", "missing_rollouts"),
        ("files missing", "missing_files"),
    ):
        if s.get(key) or key in ("tensors", "equal", "differ"):
            summary.add_row(label, str(s.get(key, 0)))
    summary.add_row("data read", _size(s.get("bytes", 0)))
    console.print(summary)
    first = result.first_divergence
    if first is not None:
        console.print()
        console.print("[bold red]First divergence[/bold red] (capture order)")
        console.print(f"  [bold]{literal(first.id)}[/bold]  [dim]{literal(first.kind)}[/dim]")
        console.print(f"  {literal(first.message)}")
        origins = f"A: {', '.join(first.origins[0]) or '-'}   B: {', '.join(first.origins[1]) or '-'}"
        console.print(f"  [dim]{literal(origins)}[/dim]")
    bad = worst(result, top)
    if bad:
        console.print()
        table = Table(title=f"Worst {len(bad)} (by dissimilarity)", title_justify="left")
        for col in ("tensor", "status", "max_abs", "max_rel", "dissimilarity", "location (A / B)"):
            table.add_column(col, justify="right" if col.startswith(("max", "diss")) else "left", overflow="fold")
        for p in bad:
            table.add_row(
                literal(p.id),
                _status(p),
                f"{metrics(p).max_abs:.3g}",
                f"{metrics(p).max_rel:.3g}",
                f"{metrics(p).dissimilarity:.3g}",
                literal(_location(p)),
            )
        console.print(table)
    findings = [f for f in ordered_findings(result) if f.code != "CD001"]  # CD001s are the table above
    if findings:
        console.print()
        console.print("[bold]Findings[/bold]")
        for f in findings[:MAX_FINDINGS]:
            style = _STYLE[f.severity.value]
            console.print(f"  [{style}]{literal(f.code)}[/{style}] [dim]{literal(f.rule)}[/dim]  {literal(f.message)}")
        if len(findings) > MAX_FINDINGS:
            console.print(f"  [dim]... {len(findings) - MAX_FINDINGS} more (--format json lists them all)[/dim]")
    console.print()
    errors = sum(1 for f in result.findings if f.severity.value == "error")
    if verdict == "pass":
        console.print(
            f"[bold green]PASS[/bold green]  {s['tensors']} tensors compared, no differences"
            + (f" ({s['close']} within tolerance)" if s.get("close") else "")
        )
    else:
        console.print(f"[bold red]FAIL[/bold red]  {errors} error finding(s)")


def _status(p: PairResult) -> str:
    return f"[red]{literal(p.status)}[/red]" if p.failed else f"[green]{literal(p.status)}[/green]"


def _location(p: PairResult) -> str:
    m = p.metrics
    if m is None or m.argmax is None:
        return "-"
    return f"{m.argmax}: {m.a_at:.6g} / {m.b_at:.6g}"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover
