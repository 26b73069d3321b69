"""Option types shared by the reporting commands (``Annotated`` aliases for Typer).

``report_path`` is the callback of every option naming a report file (``--junit-xml``,
``--html``): it runs while the command line is parsed, so a path whose directory does not
exist (or is not writable) is exit 2 before any work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.findings import FailOn
from ftkit.report.sink import Format


def report_path(value: Path | None) -> Path | None:
    """Typer callback: check a report path up front (``ftkit.report.emit.check_report_paths``)."""
    from ftkit.report.emit import check_report_paths

    check_report_paths(value)
    return value


FormatOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="Output format: human (Rich tables), json (strict JSON, carries schema_version) "
        "or github (escaped workflow annotations, at most 10, and a step summary).",
        case_sensitive=False,
    ),
]
JunitOpt = Annotated[
    Path | None,
    typer.Option(
        "--junit-xml",
        metavar="PATH",
        help="Also write a JUnit XML report to PATH (its directory must exist).",
        dir_okay=False,
        callback=report_path,
    ),
]
FailOnOpt = Annotated[
    FailOn,
    typer.Option("--fail-on", help="Exit 1 when a finding at or above this severity exists.", case_sensitive=False),
]
