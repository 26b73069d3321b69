"""``ftkit dump PATH``: inspect what a dump, a run directory or safetensors files hold.

Lists prefixes, phases, rollouts and writers (dumps) or files, and every tensor with shape,
dtype, sharding and statistics (min, max, mean, std over finite values, NaN/Inf counts).
``--filter REGEX`` keeps tensors whose id matches (ids as in compare-dumps). Exit 0, or 2 for
unreadable or malformed input (including data that does not match its index fingerprint).

``ftkit dump --from-checkpoint CKPT --rollout N --out DIR [--tp T] [--pp P]`` writes a dump
offline instead: rollout N's recorded batch replayed through the model of the checkpoint taken
just before it (``ftkit.train.recovery.checkpoint_replay``), in the standard layout under DIR. Exit 0,
or 2 for a missing or unverifiable checkpoint, a rollout not recorded, a checkpoint that is not
the one just before N, or an --out that is not new.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

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
            Path | None,
            typer.Argument(
                metavar="PATH",
                help="Run directory, dump directory (any level), directory of .safetensors files, or one file "
                "(not with --from-checkpoint).",
                show_default=False,
            ),
        ] = None,
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
        from_checkpoint: Annotated[
            Path | None,
            typer.Option(
                "--from-checkpoint",
                metavar="CKPT",
                help="Write a dump offline: replay --rollout N's recorded batch (forward and backward) through "
                "the model of this checkpoint, the one taken just before N (RUN/checkpoints/step_NNNNNN).",
            ),
        ] = None,
        rollout: Annotated[
            int | None,
            typer.Option("--rollout", metavar="N", min=0, help="With --from-checkpoint: the rollout to replay."),
        ] = None,
        out_dir: Annotated[
            Path | None,
            typer.Option(
                "--out",
                metavar="DIR",
                help="With --from-checkpoint: a new directory for the dump (DIR/dumps/actor/fwd_bwd/rollout_N/).",
            ),
        ] = None,
        tp: Annotated[
            int | None,
            typer.Option(
                "--tp",
                metavar="T",
                min=1,
                max=8,
                help="With --from-checkpoint: tensor-parallel ranks of the replay (default: the run's).",
            ),  # fmt: skip
        ] = None,
        pp: Annotated[
            int | None,
            typer.Option(
                "--pp",
                metavar="P",
                min=1,
                max=8,
                help="With --from-checkpoint: pipeline stages of the replay (default: the run's).",
            ),  # fmt: skip
        ] = None,
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
        """Inspect a dump: prefixes, phases, rollouts, writers, tensors and their statistics; or
        write one from a checkpoint (--from-checkpoint CKPT --rollout N --out DIR)."""
        from ftkit.dumps.inspect import inspect_path

        if from_checkpoint is not None or path is None:
            _from_checkpoint(path, from_checkpoint, rollout, out_dir, tp, pp, Output(Format(fmt.value)))
        offline = {"--rollout": rollout, "--out": out_dir, "--tp": tp, "--pp": pp}
        if any(v is not None for v in offline.values()):
            given = [k for k, v in offline.items() if v is not None]
            verb = "applies" if len(given) == 1 else "apply"
            raise UsageError(
                f"{', '.join(given)} {verb} only with --from-checkpoint",
                "drop it to inspect PATH" if len(given) == 1 else "drop them to inspect PATH",
            )

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


def _from_checkpoint(
    path: Path | None, ckpt: Path | None, rollout: int | None, out_dir: Path | None,
    tp: int | None, pp: int | None, out: Output,
) -> NoReturn:  # fmt: skip
    """``--from-checkpoint``: check, replay, report; always exits (``typer.Exit(0)``) or raises."""
    if ckpt is None:
        raise UsageError("missing PATH", "pass a run or dump directory to inspect, or --from-checkpoint CKPT")
    if path is not None:
        raise UsageError(f"PATH ({path}) and --from-checkpoint exclude each other", "pass one of them")
    if rollout is None or out_dir is None:
        raise UsageError("--from-checkpoint needs --rollout N and --out DIR", "e.g. --rollout 2 --out replay/")
    from ftkit.extras import require

    require("train", "dump --from-checkpoint")
    from ftkit.train.recovery.checkpoint_replay import plan_replay, replay

    plan = plan_replay(ckpt, rollout, out_dir, tp, pp)
    out.info(
        f"replaying rollout {rollout} (steps {plan.steps[0]}-{plan.steps[-1]}) from {ckpt} "
        f"with tp {plan.config['tp']} x pp {plan.config['pp']} -> {out_dir}"
    )
    doc = replay(plan)
    if out.format is Format.json:
        out.json({"command": "dump", **doc})
    else:
        out.data(f"{doc['dumps']}: {len(doc['files'])} file(s)")
        live = ckpt.resolve().parent.parent / "dumps" / "actor" / "fwd_bwd" / f"rollout_{rollout:06d}"
        out.info(f"compare with the live dump: ftkit compare-dumps --exact {doc['dumps']} {live}")
    raise typer.Exit(0)


def _human(out: Output, inv: Inventory, pattern: str | None) -> None:
    from rich.table import Table

    from ftkit.report.escaping import literal

    c = out.out
    c.print(
        f"[bold]{literal(str(inv.path))}[/bold]  [dim]({inv.kind}"
        + (f", filter {literal(pattern)}" if pattern else "")
        + ")[/dim]"
    )
    if inv.writers:
        c.print(f"prefixes: {literal(', '.join(inv.prefixes))}")
        table = Table(title="Dump writers", title_justify="left")
        for col in ("prefix", "phase", "rollout", "writer", "cell", "tensors", "bytes"):
            table.add_column(col, justify="right" if col in ("rollout", "cell", "tensors", "bytes") else "left")
        for w in inv.writers:
            table.add_row(
                literal(w["prefix"]),
                literal(w["phase"]),
                f"{w['rollout']:06d}",
                literal(w["writer"]),
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
            table.add_row(literal(f["path"]), str(f["tensors"]), str(f["bytes"]))
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
            literal(t["id"]),
            literal(t["origin"]),
            literal(t["dtype"]),
            "x".join(map(str, t["shape"])) or "()",
            literal(_sharding(t["sharding"])),
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
