"""``ftkit export RUN --hf OUT``: a run's final state as a Hugging Face model directory.

Thin layer over ``ftkit.train.recovery.export.export_run``; prints the directory written. Exit 0, or 2
with one line for a bad input (not a run, a preset run, no final state, a changed model, an
existing non-empty OUT).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.report.sink import Output

HELP = """Export a run's final weights as a Hugging Face model directory (docs/models.md).

RUN is the directory of a finished `ftkit train --model PATH` run. OUT gets config.json, sharded
safetensors with model.safetensors.index.json and the tokenizer files of the source model;
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. The tensors are the run's
final weights in the source checkpoint's dtype (after `--lr 0`, bitwise the source's).
"""


def register(app: typer.Typer) -> None:
    def export(
        run: Annotated[
            Path, typer.Argument(help="A finished run directory.", metavar="RUN", file_okay=False, show_default=False)
        ],
        hf: Annotated[
            Path,
            typer.Option(
                "--hf", metavar="OUT", help="The Hugging Face directory to write (new or empty).", show_default=False
            ),
        ],
    ) -> None:
        from ftkit.extras import require

        require("train", "ftkit export")
        from ftkit.train.recovery.export import export_run

        paths = export_run(run, hf)
        Output().info(f"exported {run} -> {hf} ({len(paths)} shard(s))")

    export.__doc__ = HELP
    app.command("export")(export)
