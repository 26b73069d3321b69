"""The one output path of every reporting command: render a ``Report``, set the exit code.

A command builds a ``Report`` (its findings and rule summaries plus the few renderings that
are its own) and calls ``emit`` once::

    check_report_paths(junit_xml, html)          # before the work: exit 2 for a bad path
    result = ...                                  # the work
    report = Report(command="compare-dumps", verdict=verdict(result.findings, fail_on), ...)
    raise typer.Exit(emit(out, report, junit_xml=junit_xml, html=html))

``emit`` writes, in ``out.format``:

- ``human``: ``report.human(console)`` on stdout (a Rich console that escapes control text);
- ``json``: ``report.document()`` as strict JSON with ``schema_version`` and ``verdict``;
- ``github``: one annotation per finding (escaped, capped at ``MAX_ANNOTATIONS`` with a count
  of the rest) and the one-line ``summary`` as the verdict line; ``report.step_summary()`` is
  appended to ``$GITHUB_STEP_SUMMARY`` when that is set;

then the JUnit XML (``report.junit_cases()``, default one case per rule, its time the rule's
``rule_seconds``) and the HTML report (``report.html()``, commands that have one) when their
paths are given, and returns the exit code: 1 when ``exit_fail`` (the findings under
``--fail-on``; ``verdict == "fail"`` when not set), else 0. The verdict shown
(``ftkit.findings.shown_verdict``) stays FAIL for error findings whatever ``--fail-on`` says: it
sets the exit code only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ftkit.errors import UsageError
from ftkit.findings import Finding, RuleSummary
from ftkit.report.github import append_step_summary, workflow_commands
from ftkit.report.junit import Case, rule_cases, write_junit
from ftkit.report.sink import Format, Output

EXIT_PASS, EXIT_FAIL = 0, 1


@dataclass(frozen=True)
class Report:
    """What a reporting command hands to ``emit``.

    ``command`` names the suite (``ftkit.<command>``) and the GitHub title; ``findings`` are
    sorted most severe first; ``summary`` is the plain one-line verdict. The callables are
    only called for the format that needs them.
    """

    command: str
    verdict: str
    findings: Sequence[Finding]
    rules: Sequence[RuleSummary]
    summary: str
    document: Callable[[], dict[str, Any]]
    human: Callable[[Console], None]
    step_summary: Callable[[], str]
    junit_cases: Callable[[], list[Case]] | None = None
    html: Callable[[Path | None], str] | None = None  # the page, its links relative to the directory given
    exit_fail: bool | None = None  # the exit code's verdict under --fail-on (None: ``verdict``)
    seconds: float | None = None  # the work's wall seconds: the JUnit suite's time (None: its cases' sum)
    rule_seconds: Mapping[str, float] | None = None  # by code: each rule's seconds, its JUnit case's time

    @property
    def suite(self) -> str:
        return f"ftkit.{self.command}"


def emit(out: Output, report: Report, *, junit_xml: Path | None = None, html: Path | None = None) -> int:
    """Render ``report`` on stdout in ``out.format``, write the side reports, return the exit code."""
    if out.format is Format.json:
        out.json({"verdict": report.verdict, **report.document()})
    elif out.format is Format.github:
        out.data(
            workflow_commands(report.findings, f"ftkit {report.command}", report.summary, report.verdict == "fail")
        )
        append_step_summary(report.step_summary)
    else:
        report.human(out.out)
    if junit_xml is not None:
        cases = (
            report.junit_cases()
            if report.junit_cases
            else rule_cases(report.suite, report.rules, report.findings, report.rule_seconds)
        )
        write_junit(junit_xml, report.suite, cases, report.seconds)
    if html is not None and report.html is not None:
        from ftkit.report.html_page import page_dir
        from ftkit.report.report_file import write_report_file

        write_report_file(html, report.html(page_dir(html)).encode("utf-8"))
        if out.human:
            from ftkit.report.escaping import literal

            out.info(f"[dim]HTML report: {literal(str(html))}[/dim]")
    return EXIT_FAIL if _failed(report) else EXIT_PASS


def with_fail_on(report: Report, findings: Sequence[Finding], fail_on: Any) -> Report:
    """``report`` with its exit code set by ``fail_on`` (its shown verdict unchanged)."""
    from dataclasses import replace

    from ftkit.findings import verdict

    return replace(report, exit_fail=verdict(findings, fail_on) == "fail")


def _failed(report: Report) -> bool:
    return report.exit_fail if report.exit_fail is not None else report.verdict == "fail"


def check_report_paths(*paths: Path | None) -> None:
    """Raise ``UsageError`` (exit 2) unless each given report path can be written.

    Called before a command's work, so a typo in ``--junit-xml``/``--html`` costs nothing: the
    directory must exist and be writable, and the path must not be a directory.
    """
    for path in paths:
        if path is None:
            continue
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise UsageError(
                f"cannot write {path}: directory {parent} does not exist", "create the directory or choose another path"
            )
        if path.is_dir():
            raise UsageError(f"cannot write {path}: it is a directory", "give a file name")
        if not os.access(parent, os.W_OK):
            raise UsageError(f"cannot write {path}: directory {parent} is not writable", "choose another path")
