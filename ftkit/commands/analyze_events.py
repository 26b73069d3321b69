"""``ftkit analyze-events PATH...`` (alias ``ftkit analyze``): replay an event log, apply the rules.

Thin layer over ``ftkit.analysis.engine.analyze_paths``: parse options, analyse with a progress
bar on stderr (human mode), render on stdout (human / json / github), optionally write JUnit
XML (one test case per rule). Exit 0 clean, 1 findings at or above ``--fail-on``, 2 unreadable
input or unknown rule codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.commands.options import FailOnOpt, FormatOpt, JunitOpt
from ftkit.findings import FailOn, shown_verdict
from ftkit.report.sink import Format, Output

HELP = """Replay a run's event log and apply the forensic rules (FT101-FT116).

PATH is an events/ directory (every *.jsonl and *.jsonl.gz below it), a run directory,
one or more log files, or '-' for standard input. The lines may come in any order and
split any way (one merged file as a log shipper or `cat` makes it, several files, gzipped):
they are sorted back into one stream per process, with the same verdict as the per-process
files. Prints a run summary, the rules with checked / finding counts, the findings (most
severe first), a recovery table per injected fault and a verdict.

Per-process files of 16 MiB or more are decoded and checked by worker processes, one per
core but the one that replays them; set FTKIT_ANALYZE_WORKERS=N to choose (0: one process,
e.g. on a machine whose cores other jobs hold). The result is the same either way.
"""


def register(app: typer.Typer) -> None:
    def analyze_events(
        paths: Annotated[
            list[Path],
            typer.Argument(
                help="Event log files or directories ('-': standard input).", metavar="PATH", show_default=False
            ),
        ],
        rule: Annotated[
            list[str] | None,
            typer.Option(
                "--rule",
                metavar="CODE",
                help="Run only this rule (repeatable); the log-integrity rules FT106, FT111 and FT112 always run. "
                "Rules that all check nothing in the log: exit 2.",
            ),
        ] = None,
        skip_rule: Annotated[
            list[str] | None,
            typer.Option(
                "--skip-rule", metavar="CODE", help="Do not run this rule (repeatable; not FT106, FT111, FT112)."
            ),
        ] = None,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
        fail_on: FailOnOpt = FailOn.error,
        html: Annotated[
            Path | None,
            typer.Option(
                "--html",
                metavar="FILE",
                dir_okay=False,
                help="Also write a self-contained HTML report: timeline of cells, faults and heals, "
                "metrics by step, recovery, rules and findings.",
            ),
        ] = None,
    ) -> None:
        from ftkit.analysis.engine import analyze_paths
        from ftkit.analysis.registry import select_rules

        select_rules(rule, skip_rule)  # unknown codes: exit 2 before reading anything
        if html is not None:
            from ftkit.report.timeline_html import check_target

            check_target(html)  # exit 2 before reading anything
        out = Output(fmt)
        with out.progress("Analyzing events", total=None) as task:
            result = analyze_paths(
                paths,
                select=rule,
                skip=skip_rule,
                progress=lambda done, total: task.update(completed=done, total=total),
                timed=junit_xml is not None,  # each rule's seconds: the JUnit cases' time
            )
        for note in result.notes:
            out.warn(note)
        from ftkit.report.analysis_formats import report
        from ftkit.report.emit import emit, with_fail_on

        _check_selection(result, rule, skip_rule)
        outcome = shown_verdict(result.findings, fail_on)  # --fail-on sets the exit code, not the verdict
        if html is not None:
            from ftkit.report.timeline_html import write_report

            write_report(html, paths, result, outcome)
            out.info(f"HTML report: {html}")
        shown = with_fail_on(report(result, outcome), result.findings, fail_on)
        raise typer.Exit(emit(out, shown, junit_xml=junit_xml))

    analyze_events.__doc__ = HELP
    app.command("analyze-events")(analyze_events)
    app.command("analyze", help="Alias of analyze-events.", hidden=False)(analyze_events)


def _check_selection(result: object, rule: list[str] | None, skip_rule: list[str] | None) -> None:
    """Exit 2 when ``--rule`` asked for rules that all checked nothing in this log (a selection
    that checks nothing is never a pass), unless the integrity rules that always run found the
    log damaged (then those findings are the answer)."""
    from ftkit.analysis.engine import AnalysisResult
    from ftkit.analysis.registry import INTEGRITY
    from ftkit.errors import UsageError

    assert isinstance(result, AnalysisResult)
    if not rule:
        return
    asked = {c.strip().upper() for c in rule} - {c.strip().upper() for c in skip_rule or []}
    if any(r.checked for r in result.rules if r.code in asked):
        return
    if any(f.code in INTEGRITY and f.severity.value == "error" for f in result.findings):
        return
    raise UsageError(
        f"the selected rule(s) {', '.join(sorted(asked))} checked nothing in this log",
        "select rules whose evidence the log holds (see the rule table of a full run), or run them all",
    )
