"""``ftkit verify-checkpoint PATH``: fail-closed verification of published checkpoints.

Thin layer over ``ftkit.checkpoint.verify.verify_path``: verify with a progress bar on stderr
(human mode), render on stdout (human / json / github), optionally write JUnit XML (one test
case per FT2xx rule). Exit 0 verified, 1 findings at or above ``--fail-on``, 2 when PATH holds
no checkpoint (or ``--events`` finds no event log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.commands.options import FailOnOpt, FormatOpt, JunitOpt
from ftkit.findings import FailOn, shown_verdict
from ftkit.report.sink import Format, Output

HELP = """Verify checkpoints, failing closed (rules FT201-FT218, docs/checkpoints.md).

PATH is a checkpoint directory (step_NNNNNN/), a checkpoints/ directory or a run directory
(all of its checkpoints, plus retention records, `latest` and the journal). Checks the
manifest, every file's size and sha256, safetensors structure, tensor fingerprints, NaN/Inf
(optimizer state included), that no pickle file exists, retention and `latest`, and a
journal left mid-transition. With --events (the default for a run directory) each
checkpoint's state fingerprint must equal the committed state_fingerprint the event log
holds for its step, and its guard interval must be free of non-finite evidence.
"""


def register(app: typer.Typer) -> None:
    def verify_checkpoint(
        path: Annotated[
            Path,
            typer.Argument(help="A checkpoint, checkpoints/ or run directory.", metavar="PATH", show_default=False),
        ],
        events: Annotated[
            bool | None,
            typer.Option(
                "--events/--no-events",
                help="Cross-check against the run's event log [default: on for a run directory].",
                show_default=False,
            ),
        ] = None,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
        fail_on: FailOnOpt = FailOn.error,
    ) -> None:
        from ftkit.checkpoint.verify import verify_path

        out = Output(fmt)
        with out.progress("Verifying", total=None) as task:
            result = verify_path(
                path, events=events, progress=task.advance, on_start=lambda total: task.update(total=total)
            )
        from ftkit.report.emit import emit, with_fail_on
        from ftkit.report.verify_report import report

        shown = report(result, shown_verdict(result.findings, fail_on))
        raise typer.Exit(emit(out, with_fail_on(shown, result.findings, fail_on), junit_xml=junit_xml))

    verify_checkpoint.__doc__ = HELP
    app.command("verify-checkpoint")(verify_checkpoint)
