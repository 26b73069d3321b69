"""``ftkit compare-dumps A B``: tensor-by-tensor comparison of two runs, dumps or file trees.

Thin layer over ``ftkit.dumps.compare``: parse options, run the comparison with a progress
bar on stderr (human mode), render the report on stdout, optionally write JUnit XML and an
HTML report. Exit 0 when nothing differs (or all within tolerance), 1 on findings at or above
``--fail-on``, 2 for unreadable or malformed input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ftkit.commands.options import FailOnOpt, FormatOpt, JunitOpt, report_path
from ftkit.errors import UsageError
from ftkit.findings import FailOn, shown_verdict
from ftkit.report.sink import Format, Output

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.dumps.compare import CompareOptions

DEFAULT_RTOL, DEFAULT_ATOL = 1e-5, 1e-8


def register(app: typer.Typer) -> None:
    @app.command("compare-dumps")
    def compare_dumps(
        a: Annotated[
            Path,
            typer.Argument(
                metavar="A",
                help="Run directory, dump directory, directory of .safetensors files, or one .safetensors file.",
                show_default=False,
            ),
        ],
        b: Annotated[
            Path,
            typer.Argument(
                metavar="B",
                help="The same kind of thing to compare with (B is the reference for --rtol).",
                show_default=False,
            ),
        ],
        exact: Annotated[
            bool,
            typer.Option(
                "--exact", help="Any differing bit is a finding (NaNs compare by bits, -0.0 differs from 0.0)."
            ),
        ] = False,
        rtol: Annotated[
            float | None,
            typer.Option(
                "--rtol",
                help=f"Relative tolerance: |a-b| <= atol + rtol*|b| [default: {DEFAULT_RTOL:g}].",
                show_default=False,
            ),
        ] = None,
        atol: Annotated[
            float | None,
            typer.Option("--atol", help=f"Absolute tolerance [default: {DEFAULT_ATOL:g}].", show_default=False),
        ] = None,
        rules: Annotated[
            Path | None,
            typer.Option(
                "--rules",
                metavar="FILE",
                dir_okay=False,
                help="TOML rules: regex over tensor ids -> predicate "
                "over the metrics; tensors no rule covers fail "
                "(see docs/dumps.md).",
            ),
        ] = None,
        top: Annotated[int, typer.Option("--top", min=0, help="How many of the most different tensors to list.")] = 10,
        html: Annotated[
            Path | None,
            typer.Option(
                "--html",
                metavar="FILE",
                dir_okay=False,
                callback=report_path,
                help="Also write a self-contained HTML report: divergence heatmap (layers x rollout/step/micro-shard), "
                "run.json differences, worst tensors, findings (its directory must exist).",
            ),
        ] = None,
        follow_symlinks: Annotated[
            bool,
            typer.Option(
                "--follow-symlinks",
                help="Read symlinked files whose target lies outside the tree given (refused by default).",
            ),
        ] = False,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
        fail_on: FailOnOpt = FailOn.error,
    ) -> None:
        """Compare two runs tensor by tensor and report where they first diverge.

        Dumps pair by (prefix, phase, rollout, step, micro-shard, name) with TP shards
        reassembled, so a TP=2 run compares with a TP=1 run; other safetensors files pair by
        relative path and tensor name. Missing rollouts, files or tensors are findings.
        Default mode: tolerance (rtol 1e-5, atol 1e-8); --exact for bitwise; --rules FILE.
        Two runs whose run.json differ in what shapes the data are reported as a config diff
        first (CD012). Special files are skipped with a warning; symlinks that leave a tree are
        refused unless --follow-symlinks.
        """
        from dataclasses import replace
        from time import perf_counter

        from ftkit.dumps.compare import compare_paths

        options = _options(exact, rtol, atol, rules)
        if html is not None:
            from ftkit.report.html_page import check_target

            check_target(html)  # exit 2 before the comparison
        out = Output(fmt)
        t0 = perf_counter()  # the JUnit suite's time
        with out.progress("Comparing", total=None) as task:
            result = compare_paths(
                a,
                b,
                options,
                progress=task.advance,
                on_start=lambda total: task.update(total=total),
                follow_symlinks=follow_symlinks,
            )
        for path in result.skipped:
            out.warn(f"{path} is not a regular file (FIFO, socket or device); skipped")
        from ftkit.report.compare_formats import report
        from ftkit.report.emit import emit, with_fail_on

        shown = replace(report(result, shown_verdict(result.findings, fail_on), top), seconds=perf_counter() - t0)
        raise typer.Exit(emit(out, with_fail_on(shown, result.findings, fail_on), junit_xml=junit_xml, html=html))


def _options(exact: bool, rtol: float | None, atol: float | None, rules: Path | None) -> CompareOptions:
    from ftkit.dumps.compare import CompareOptions

    tol_given = rtol is not None or atol is not None
    if exact and (tol_given or rules is not None):
        raise UsageError(
            "--exact cannot be combined with --rtol/--atol or --rules",
            "--exact compares bits; drop the tolerances, or drop --exact",
        )
    if rules is not None and tol_given:
        raise UsageError(
            "--rules cannot be combined with --rtol/--atol",
            "put the tolerances into the rules' predicates (max_rel, max_abs, ...)",
        )
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if value is not None and not value >= 0:
            raise UsageError(f"{name} must be a non-negative number, not {value}", f"e.g. {name} 1e-5")
    if rules is not None:
        from ftkit.dumps.rules import load_rules

        return CompareOptions(mode="rules", rules=load_rules(rules))
    return CompareOptions(
        mode="exact" if exact else "tolerance",
        rtol=DEFAULT_RTOL if rtol is None else rtol,
        atol=DEFAULT_ATOL if atol is None else atol,
    )
