"""``ftkit check-model PATH``: logit parity of ftkit's megatron-core model against transformers.

Thin layer over ``ftkit.model.parity.check_model``: parse options, run both models on CPU,
render (human / json / github, ``--junit-xml``). Exit 0 when every prompt is within the
tolerance and both sides predict the same next token, 1 otherwise (findings CM001-CM003), 2 for
a path that is not a supported model (the config field ftkit cannot represent is named).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ftkit.commands.options import FormatOpt, JunitOpt
from ftkit.errors import UsageError
from ftkit.findings import FailOn, verdict
from ftkit.report.sink import Format, Output

DEFAULT_ATOL, DEFAULT_RTOL = 1e-4, 1e-4

HELP = """Check that ftkit's megatron-core model of a Hugging Face checkpoint computes what transformers computes.

PATH is a Hugging Face model directory (config.json, *.safetensors, tokenizer) of the Llama,
Qwen2, Qwen3 or Mistral family, or a .gguf file (converted once, dequantized, into a cache
directory; docs/models.md). Both models run in float32 on CPU on each prompt (built-in ones, plus
one past the original context of 8192 tokens for a model with Llama-3 RoPE scaling; or every
--prompt; one that encodes to no token, or is longer than the model or its sliding window, is
exit 2 naming it): max abs / max rel logit difference, argmax agreement, per-token log-prob
difference and the next token each side predicts. A prompt fails above atol + rtol * max|logit|
or when the predicted next tokens differ; the first layer whose output differs is then named
(both forwards dumped and compared as compare-dumps does). Rules CM001-CM003 (docs/models.md).
"""


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
        atol: Annotated[float, typer.Option("--atol", help="Absolute logit tolerance.")] = DEFAULT_ATOL,
        rtol: Annotated[
            float, typer.Option("--rtol", help="Tolerance relative to the largest reference logit.")
        ] = DEFAULT_RTOL,
        fmt: FormatOpt = Format.human,
        junit_xml: JunitOpt = None,
    ) -> None:
        from ftkit.model.parity import check_model as run_check

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
            result = run_check(path, prompts, atol, rtol)
        for warning in result.warnings:
            out.warn(warning)
        from ftkit.commands.check_model_report import report
        from ftkit.report.emit import emit

        raise typer.Exit(emit(out, report(result, verdict(result.findings, FailOn.error)), junit_xml=junit_xml))

    check_model.__doc__ = HELP
    app.command("check-model")(check_model)
