"""Option types shared by the reporting commands (``Annotated`` aliases for Typer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.analysis.findings import FailOn
from ftkit.report.sink import Format

FormatOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="Output format: human (Rich tables), json (machine "
        "readable, carries schema_version) or github (workflow annotations).",
        case_sensitive=False,
    ),
]
JunitOpt = Annotated[
    Path | None,
    typer.Option("--junit-xml", metavar="PATH", help="Also write a JUnit XML report to PATH.", dir_okay=False),
]
FailOnOpt = Annotated[
    FailOn,
    typer.Option("--fail-on", help="Exit 1 when a finding at or above this severity exists.", case_sensitive=False),
]
