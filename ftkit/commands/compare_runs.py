"""``ftkit compare-runs A B``: two runs compared step by step from their event logs.

Thin layer over ``ftkit.runs.compare.compare_runs``: parse options, compare with a progress bar
on stderr (human mode), render on stdout (human / json / github), optionally write JUnit XML
(one test case per CR code) and an HTML page. Exit 0 when every common step is equal, 1 on a
divergence (or a finding ``--require-same-length`` makes an error), 2 for unusable input (a
damaged or cut log: the integrity errors of ``analyze-events``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.commands.options import FormatOpt, JunitOpt, report_path
from ftkit.errors import UsageError
from ftkit.report.sink import Format, Output

HELP = """Compare two runs step by step from their event logs; name the first divergence.

A and B are what analyze-events reads: a run directory, an events/ directory or one merged
log ('-': standard input, for one of them). For every step both runs committed (matched by
run-global step: cells, incarnations, retries, heals, resumes and the cell count may differ)
it compares the state fingerprint per rank and tensor, the witness ledger (the samples the
step trained), the metrics, the weights sent to the engines per version and the canary
log-probs. Exit 0 when every common step is equal, 1 naming the first divergent step, what
diverged first and the first tensor, 2 when a log is damaged or cut (it is never compared as
if whole). The configs' result-determining differences (seed, lr, model, data, precision,
layout) are listed first. Timing metrics (*_s, *_seconds, *_per_s, attempts) are never
compared.
"""


def register(app: typer.Typer) -> None:
    def compare_runs(
        a: Annotated[
            Path,
            typer.Argument(metavar="A", help="Run directory, events/ directory or merged log.", show_default=False),
        ],
        b: Annotated[
            Path,
            typer.Argument(
                metavar="B", help="The run to compare with (B is the reference for --rtol).", show_default=False
            ),
        ],
        rtol: Annotated[
            float | None,
            typer.Option(
                "--rtol",
                help="Compare metrics and canary log-probs within |a-b| <= atol + rtol*|b| "
                "[default: exact, to the bit]. Fingerprints always compare exactly.",
                show_default=False,
            ),
        ] = None,
        atol: Annotated[
            float | None,
            typer.Option(
                "--atol",
                help="Absolute tolerance of metrics and canary log-probs [default: exact].",
                show_default=False,
            ),
        ] = None,
        ignore_metric: Annotated[
            list[str] | None,
            typer.Option("--ignore-metric", metavar="NAME", help="Do not compare this metric (repeatable)."),
        ] = None,
        require_same_length: Annotated[
            bool,
            typer.Option(
                "--require-same-length",
                help="A run that committed steps the other did not is an error (default: a warning; the common "
                "steps are compared).",
            ),
        ] = False,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
        html: Annotated[
            Path | None,
            typer.Option(
                "--html",
                metavar="FILE",
                dir_okay=False,
                callback=report_path,
                help="Also write a self-contained HTML report: a per-step strip of equal and differing steps "
                "with the first divergence marked, the evidence compared, config differences, findings.",
            ),
        ] = None,
    ) -> None:
        from dataclasses import replace
        from time import perf_counter

        from ftkit.runs.compare import RunsOptions
        from ftkit.runs.compare import compare_runs as run_compare
        from ftkit.runs.diff import Tolerance

        for name, value in (("--rtol", rtol), ("--atol", atol)):
            if value is not None and not value >= 0:
                raise UsageError(f"{name} must be a non-negative number, not {value}", f"e.g. {name} 1e-6")
        if html is not None:
            from ftkit.report.html_page import check_target

            check_target(html)
        options = RunsOptions(
            tolerance=Tolerance(rtol, atol),
            ignore_metrics=frozenset(ignore_metric or ()),
            require_same_length=require_same_length,
        )
        out = Output(fmt)
        t0 = perf_counter()  # the JUnit suite's time
        with out.progress("Comparing runs", total=None) as task:
            result = run_compare(
                [a], [b], options, progress=lambda done, total: task.update(completed=done, total=total)
            )
        for note in result.notes:
            out.warn(note)
        from ftkit.report.emit import emit
        from ftkit.report.runs_formats import report

        shown = replace(report(result), seconds=perf_counter() - t0)
        raise typer.Exit(emit(out, shown, junit_xml=junit_xml, html=html))

    compare_runs.__doc__ = HELP
    app.command("compare-runs")(compare_runs)
