"""``ftkit export RUN_OR_CHECKPOINT --hf OUT``: a run's final state, or one of its checkpoints
(verified first), as a Hugging Face model directory.

Thin layer over ``ftkit.train.recovery.export.export``; prints the directory written (stderr),
warnings of the verification on stderr. Exit 0, or 2 with one line for a bad input (not a run
or checkpoint, a preset run, no final state, a checkpoint that does not verify, a changed model,
an existing non-empty OUT), nothing written to OUT.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ftkit.report.sink import Output

HELP = """Export a run's final weights, or a checkpoint's, as a Hugging Face model directory (docs/models.md).

RUN_OR_CHECKPOINT is the directory of a finished `ftkit train --model PATH` run (its final
weights) or one of its checkpoints, RUN/checkpoints/step_NNNNNN (that checkpoint's weights). A
checkpoint is verified first, as `ftkit verify-checkpoint RUN` verifies it (files, sha256,
fingerprints, retention record, the event log's committed fingerprint): one that does not verify
is exit 2, nothing written. OUT gets config.json, sharded safetensors with
model.safetensors.index.json and the tokenizer files of the source model;
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. The tensors are written in
--dtype: auto is the run's own precision (bf16 from a bf16 run: its float32 master weights cast
once, round to nearest even, exactly the bf16 weights it trained with; fp32 from an fp32 run),
fp32 or bf16 force one. After `--lr 0` in the source's precision, bitwise the source's.
"""


class ExportDtype(str, Enum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"


def register(app: typer.Typer) -> None:
    def export(
        run_or_checkpoint: Annotated[
            Path,
            typer.Argument(
                help="A finished run directory, or a checkpoint directory of a run.",
                metavar="RUN_OR_CHECKPOINT",
                file_okay=False,
                show_default=False,
            ),
        ],
        hf: Annotated[
            Path,
            typer.Option(
                "--hf", metavar="OUT", help="The Hugging Face directory to write (new or empty).", show_default=False
            ),
        ],
        dtype: Annotated[
            ExportDtype,
            typer.Option(
                "--dtype",
                help="The dtype written: auto (the run's precision), fp32, or bf16 (float32 cast once, "
                "round to nearest even).",
            ),
        ] = ExportDtype.auto,
    ) -> None:
        from ftkit.extras import require

        require("train", "ftkit export")
        from ftkit.train.recovery.export import export

        out = Output()
        paths = export(run_or_checkpoint, hf, on_warning=out.warn, dtype=dtype.value)
        out.info(f"exported {run_or_checkpoint} -> {hf} ({len(paths)} shard(s))")

    export.__doc__ = HELP
    app.command("export")(export)
