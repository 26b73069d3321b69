"""``ftkit dump PATH``: inspect what a dump, a run directory or safetensors files hold.

Lists prefixes, phases, rollouts and writers (dumps) or files, and every tensor with shape,
dtype, sharding and statistics (min, max, mean, std over finite values, NaN/Inf counts).
``--filter REGEX`` keeps tensors whose id matches (ids as in compare-dumps). Exit 0, or 2 for
unreadable or malformed input (including data that does not match its index fingerprint).
(Writing a dump offline from a checkpoint comes with checkpoints.)
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ftkit.errors import UsageError
from ftkit.report.sink import Format, Output

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.dumps.inspect import Inventory


class DumpFormat(str, Enum):
    human = "human"
    json = "json"


def register(app: typer.Typer) -> None:
    @app.command("dump")
    def dump(
        path: Annotated[
            Path,
            typer.Argument(
                metavar="PATH",
                help="Run directory, dump directory (any level), directory of .safetensors files, or one file.",
                show_default=False,
            ),
        ],
        filter_: Annotated[
            str | None,
            typer.Option(
                "--filter",
                "-k",
                metavar="REGEX",
                help="Only tensors whose id matches REGEX (re.search), e.g. 'layers\\.0\\..*output$'.",
            ),
        ] = None,
        stats: Annotated[
            bool,
            typer.Option(
                "--stats/--no-stats",
                help="Read the data for statistics and verify fingerprints (--no-stats lists headers only).",
            ),
        ] = True,
        follow_symlinks: Annotated[
            bool,
            typer.Option(
                "--follow-symlinks",
                help="Read symlinked files whose target lies outside the tree given (refused by default).",
            ),
        ] = False,
        fmt: Annotated[
            DumpFormat,
            typer.Option(
                "--format",
                "-f",
                help="Output format: human (Rich tables) or json (machine readable, carries schema_version).",
                case_sensitive=False,
            ),
        ] = DumpFormat.human,
    ) -> None:
        """Inspect a dump: prefixes, phases, rollouts, writers, tensors and their statistics."""
        from ftkit.dumps.inspect import inspect_path

        if filter_ is not None:
            try:
                re.compile(filter_)
            except re.error as exc:
                raise UsageError(
                    f"--filter {filter_!r} is not a valid regex: {exc}",
                    "quote the pattern for the shell, e.g. --filter 'layers\\.0\\.'",
                ) from None
        out = Output(Format(fmt.value))
        with out.progress("Reading dump", total=None) as task:
            inv = inspect_path(
                path,
                filter_,
                stats,
                follow_symlinks,
                progress=lambda done, total: task.update(completed=done, total=total),
            )
        for skipped in inv.skipped:
            out.warn(f"{skipped} is not a regular file (FIFO, socket or device); skipped")
        for rel in inv.orphans:
            out.warn(f"{rel} has no index (an interrupted write?); not listed")
        if out.format is Format.json:
            out.json({"command": "dump", **inv.to_dict()})
        else:
            _human(out, inv, filter_)
        raise typer.Exit(0)


def _human(out: Output, inv: Inventory, pattern: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    c = out.out
    c.print(
        f"[bold]{escape(str(inv.path))}[/bold]  [dim]({inv.kind}"
        + (f", filter {escape(pattern)}" if pattern else "")
        + ")[/dim]"
    )
    if inv.writers:
        c.print(f"prefixes: {', '.join(inv.prefixes)}")
        table = Table(title="Dump writers", title_justify="left")
        for col in ("prefix", "phase", "rollout", "writer", "cell", "tensors", "bytes"):
            table.add_column(col, justify="right" if col in ("rollout", "cell", "tensors", "bytes") else "left")
        for w in inv.writers:
            table.add_row(
                w["prefix"],
                w["phase"],
                f"{w['rollout']:06d}",
                w["writer"],
                str(w["cell"]),
                str(w["tensors"]),
                str(w["bytes"]),
            )
        c.print(table)
    if inv.files:
        table = Table(title="Files", title_justify="left")
        for col in ("file", "tensors", "bytes"):
            table.add_column(col, justify="left" if col == "file" else "right")
        for f in inv.files:
            table.add_row(escape(f["path"]), str(f["tensors"]), str(f["bytes"]))
        c.print(table)
    table = Table(title=f"Tensors ({len(inv.tensors)})", title_justify="left")
    cols = ["tensor", "from", "dtype", "shape", "sharding"]
    if any("stats" in t for t in inv.tensors):
        cols += ["min", "max", "mean", "std", "nan", "inf"]
    for col in cols:
        table.add_column(
            col, overflow="fold", justify="right" if col in ("min", "max", "mean", "std", "nan", "inf") else "left"
        )
    for t in inv.tensors:
        row = [
            escape(t["id"]),
            escape(t["origin"]),
            t["dtype"],
            "x".join(map(str, t["shape"])) or "()",
            _sharding(t["sharding"]),
        ]
        if "stats" in t:
            s = t["stats"]
            row += [_num(s["min"]), _num(s["max"]), _num(s["mean"]), _num(s["std"]), _count(s["nan"]), _count(s["inf"])]
        table.add_row(*row)
    c.print(table)


def _sharding(s: dict[str, Any] | None) -> str:
    if not s or s["kind"] == "replicated" or s["tp_size"] == 1:
        return "-"
    return f"split d{s['dim']} {s['tp_rank']}/{s['tp_size']}" + (f" x{s['stride']}" if s["stride"] != 1 else "")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _count(n: int) -> str:
    return f"[red]{n}[/red]" if n else "0"
