"""``ftkit check-model``: parity of ftkit's megatron-core model with transformers for every family,
in float32 and in bf16 (a bf16 checkpoint, both sides computing in bfloat16, the bf16 tolerance),
and a planted conversion bug caught with the first differing layer named in both precisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftkit.cli import main
from ftkit.model.hf_import import CheckpointFiles
from tests.model.hf_models import FAMILIES, make_model


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_passes(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(family, tmp_path)
    code = main(["check-model", str(model), "--format", "json", "--junit-xml", str(tmp_path / "j.xml")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["findings"]
    assert doc["verdict"] == "pass" and doc["family"] == family and len(doc["prompts"]) == 4
    for p in doc["prompts"]:
        assert p["within"] and p["argmax_agree"] == 1.0 and p["next_ftkit"] == p["next_reference"]
        assert p["max_abs"] <= p["limit"] and p["logprob_max_diff"] < 1e-4
    assert "ftkit.check-model" in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_parity_passes_within_the_bf16_tolerance(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model(family, tmp_path, dtype="bfloat16")
    code = main(["check-model", str(model), "--precision", "bf16", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["findings"]
    assert doc["precision"] == "bf16" and doc["tolerance"] == {"atol": 1e-2, "rtol": 1e-1}
    for p in doc["prompts"]:
        assert p["within"] and p["next_agrees"] and p["argmax_agree"] >= 0.75
        assert 0 < p["max_abs"] <= p["limit"]  # bf16 on both sides, summed in different orders: not bitwise
    assert main(["check-model", str(model), "--precision", "bf16", "--prompt", "3 + 4 ="]) == 0
    assert "CPU, bfloat16" in capsys.readouterr().out


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", "float32"), ("bf16", "bfloat16")])
def test_planted_qk_swap_is_caught_at_its_layer(
    precision: str, dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # initializer_range 0.1: attention sharp enough that one swapped head moves the logits by 30-60%
    # of the largest (at transformers' 0.02 a random model attends almost uniformly and the swap moves
    # them by ~2%, as much as bf16 rounding does); the clean model is within 1.7% in bf16
    model = make_model("llama", tmp_path, dtype=dtype, initializer_range=0.1)
    assert main(["check-model", str(model), "--precision", precision, "--prompt", "The capital of France is"]) == 0
    capsys.readouterr()
    real = CheckpointFiles.read_into

    def buggy(self, name, dim, start, stop, out):  # type: ignore[no-untyped-def]
        """Layer 1's k_proj rows where q_proj's first rows belong."""
        if name == "model.layers.1.self_attn.q_proj.weight" and start == 0:
            real(self, name.replace("q_proj", "k_proj"), dim, 0, 32, out[:32])
            return real(self, name, dim, 32, stop, out[32:])
        return real(self, name, dim, start, stop, out)

    monkeypatch.setattr(CheckpointFiles, "read_into", buggy)
    prompt = ["--prompt", "The capital of France is"]
    code = main(["check-model", str(model), *prompt, "--precision", precision, "-f", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "fail" and doc["precision"] == precision
    codes = {f["code"] for f in doc["findings"]}
    assert "CM001" in codes and "CM003" in codes
    assert doc["first_divergence"]["layer"] == "layers.1.attention"  # layer 0 and its input norm still agree
    cm003 = next(f for f in doc["findings"] if f["code"] == "CM003")
    assert "layers.1.attention" in cm003["message"]


def test_human_and_github_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model("qwen3", tmp_path)
    assert main(["check-model", str(model), "--prompt", "3 + 4 ="]) == 0
    out = capsys.readouterr().out
    assert "PARITY: 1/1 prompt(s)" in out and "3 + 4 =" in out
    assert main(["check-model", str(model), "--prompt", "3 + 4 =", "-f", "github"]) == 0
    assert "PARITY" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--atol", "-1"], "--atol must be a non-negative number"),
        (["--prompt", ""], "--prompt must not be empty"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["check-model", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_unsupported_config_exit_2_names_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model("llama", tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    assert main(["check-model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "'hidden_act'" in err and "Hint:" in err and "Traceback" not in err


def test_a_next_token_tie_within_the_limit_is_not_a_finding() -> None:
    from ftkit.model.parity import PromptParity

    def parity(margin: float) -> PromptParity:
        return PromptParity("p", 3, 0.01, 0.01, 1.0, 0.0, " a", " b", next_margin=margin, limit=0.05)

    assert parity(0.04).next_agrees and parity(0.05).next_agrees  # bf16 ordered two near-equal logits
    assert not parity(0.06).next_agrees
    assert parity(0.0).to_dict()["next_agrees"] is True
