"""``ftkit check-model`` prompts (issue 40 item 6): a prompt that encodes to no token is exit 2
naming it (a built-in one is skipped with a warning), a model with Llama-3 RoPE scaling gets one
prompt past the original context (so a dropped scaling factor is caught), a prompt longer than
Mistral's sliding window is exit 2 saying so (not a divergence), and ``--debug`` after the
subcommand is a usage error that says where global options go."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ftkit.cli import main
from ftkit.model.parity_prompts import LONG_PAST, ORIGINAL_CONTEXT
from tests.model.hf_models import make_model


def _normalize_away(model: Path, pattern: str) -> None:
    """Give the model's tokenizer a normalizer that deletes ``pattern`` (a regex) from the text."""
    from tokenizers import Regex, Tokenizer, normalizers

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.normalizer = normalizers.Replace(Regex(pattern), "")
    tok.save(str(model / "tokenizer.json"))


def test_a_prompt_of_no_token_is_exit_2_and_a_built_in_one_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model("llama", tmp_path)  # (transformers rebuilds Qwen2's tokenizer, normalizer and all)
    _normalize_away(model, r"[\s\d+=]")  # " " and "3 + 4 =" encode to nothing
    capsys.readouterr()
    assert main(["check-model", str(model), "--prompt", " "]) == 2
    err = capsys.readouterr().err
    assert "Error: --prompt ' ' encodes to no token with this model's tokenizer" in err and "Traceback" not in err
    assert main(["check-model", str(model), "-f", "json"]) == 0
    captured = capsys.readouterr()
    assert "Warning: built-in prompt '3 + 4 =' encodes to no token with this tokenizer: skipped" in captured.err
    assert [p["prompt"] for p in json.loads(captured.out)["prompts"]] == [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, there was a little",
    ]


def test_a_prompt_longer_than_mistral_s_sliding_window_is_exit_2_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model("mistral", tmp_path, sliding_window=8)
    capsys.readouterr()
    assert main(["check-model", str(model), "--prompt", "Once upon a time, there was a little model."]) == 2
    err = capsys.readouterr().err
    assert "longer than the model's sliding window of 8" in err and "not a divergence" in err, err
    assert "Traceback" not in err


def test_a_dropped_rope_scaling_factor_is_caught_by_the_long_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    n = ORIGINAL_CONTEXT + LONG_PAST
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL_CONTEXT}  # fmt: skip
    model = make_model("llama", tmp_path, max_position_embeddings=2 * ORIGINAL_CONTEXT, rope_scaling=scaling)
    assert main(["check-model", str(model), "-f", "json"]) == 0
    prompts = json.loads(capsys.readouterr().out)["prompts"]
    assert len(prompts) == 5 and prompts[-1]["tokens"] == n and prompts[-1]["within"]
    assert prompts[-1]["prompt"] == f"long prompt ({n} tokens, past the original context of {ORIGINAL_CONTEXT})"

    import ftkit.model.hf_build as hf_build

    real = hf_build.build_hf_gpt
    monkeypatch.setattr(  # the bug: the scaling factor dropped when the model is built
        hf_build,
        "build_hf_gpt",
        lambda arch, *a, **k: real(dataclasses.replace(arch, rope_scaling_factor=None), *a, **k),
    )
    assert main(["check-model", str(model), "-f", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    failing = [p["prompt"] for p in doc["prompts"] if not p["within"]]
    assert failing[-1].startswith("long prompt"), failing
    assert any(f["code"] == "CM001" and "long prompt" in f["message"] for f in doc["findings"])


def test_a_global_option_after_the_subcommand_is_a_usage_error_with_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-model", str(tmp_path), "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: No such option: --debug") and "Traceback" not in err
    assert "--debug is a global option: put it before the subcommand, e.g. 'ftkit --debug check-model ...'" in err
