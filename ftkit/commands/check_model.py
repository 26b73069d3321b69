"""``ftkit check-model PATH``: logit parity of ftkit's megatron-core model against transformers.

Thin layer over ``ftkit.model.parity.check_model``: parse options, run both models on CPU,
render (human / json / github, ``--junit-xml``). Exit 0 when every prompt is within the
tolerance and both sides predict the same next token, 1 otherwise (findings CM001-CM003), 2 for
a path that is not a supported model (the config field ftkit cannot represent is named).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ftkit.commands.options import FormatOpt, JunitOpt
from ftkit.errors import UsageError
from ftkit.findings import FailOn, verdict
from ftkit.model.parity import TOLERANCES
from ftkit.report.sink import Format, Output

HELP = """Check that ftkit's megatron-core model of a Hugging Face checkpoint computes what transformers computes.

PATH is a Hugging Face model directory (config.json, *.safetensors, tokenizer) of the Llama,
Qwen2, Qwen3 or Mistral family, or a .gguf file (converted once, dequantized, into a cache
directory; docs/models.md). Both models run on CPU in --precision (fp32: float32; bf16: the
bf16 weights a bf16 run computes with, against transformers loaded in bfloat16) on each prompt
(built-in ones, plus one past the original context of 8192 tokens for a model with Llama-3 RoPE
scaling; or every --prompt; one that encodes to no token, or is longer than the model or its
sliding window, is exit 2 naming it): max abs / max rel logit difference, argmax agreement,
per-token log-prob difference and the next token each side predicts. A prompt fails above
atol + rtol * max|logit|, or when the predicted next tokens differ by more than a tie within
that limit; the first layer whose output is outside the same limit (of its own magnitude) is
then named (both forwards dumped and compared as compare-dumps does). The default tolerance is
the precision's (bf16 has 8 significant bits; docs/models.md). Rules CM001-CM003.
"""


class CheckPrecision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


def _defaults(i: int) -> str:
    """The default atol (``i`` 0) or rtol (1) of each precision, for the help."""
    return ", ".join(f"{t[i]:g} in {p}" for p, t in TOLERANCES.items())


def register(app: typer.Typer) -> None:
    def check_model(
        path: Annotated[
            Path,
            typer.Argument(metavar="PATH", help="A Hugging Face model directory or a .gguf file.", show_default=False),
        ],
        prompt: Annotated[
            list[str] | None,
            typer.Option(
                "--prompt",
                metavar="TEXT",
                help="A prompt to check (repeatable) [default: built-in prompts].",
                show_default=False,
            ),
        ] = None,
        precision: Annotated[
            CheckPrecision,
            typer.Option("--precision", help="fp32: both models in float32; bf16: both in bfloat16."),
        ] = CheckPrecision.fp32,
        atol: Annotated[
            float | None,
            typer.Option("--atol", help=f"Absolute logit tolerance [default: {_defaults(0)}].", show_default=False),
        ] = None,
        rtol: Annotated[
            float | None,
            typer.Option(
                "--rtol",
                help=f"Tolerance relative to the largest reference logit [default: {_defaults(1)}].",
                show_default=False,
            ),
        ] = None,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
    ) -> None:
        from ftkit.model.parity import check_model as run_check

        default_atol, default_rtol = TOLERANCES[precision.value]
        atol = default_atol if atol is None else atol
        rtol = default_rtol if rtol is None else rtol
        for name, value in (("--atol", atol), ("--rtol", rtol)):
            if not value >= 0:
                raise UsageError(f"{name} must be a non-negative number, not {value}", f"e.g. {name} 1e-4")
        prompts = list(prompt) if prompt else None
        if any(not p for p in prompts or ()):
            raise UsageError("--prompt must not be empty", "give some text, e.g. --prompt 'The capital of France is'")
        if not path.exists():
            raise UsageError(f"{path} does not exist", "give a Hugging Face model directory or a .gguf file")
        out = Output(fmt)
        with out.progress("Checking", total=None):
            result = run_check(path, prompts, atol, rtol, precision.value)
        for warning in result.warnings:
            out.warn(warning)
        from ftkit.commands.check_model_report import report
        from ftkit.report.emit import emit

        raise typer.Exit(emit(out, report(result, verdict(result.findings, FailOn.error)), junit_xml=junit_xml))

    check_model.__doc__ = HELP
    app.command("check-model")(check_model)
