"""``ftkit check-model``: parity of ftkit's megatron-core model with transformers for every family,
and a planted conversion bug caught with the first differing layer named."""

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


def test_planted_qk_swap_is_caught_at_its_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model("llama", tmp_path)
    real = CheckpointFiles.read_into

    def buggy(self, name, dim, start, stop, out):  # type: ignore[no-untyped-def]
        """Layer 1's k_proj rows where q_proj's first rows belong."""
        if name == "model.layers.1.self_attn.q_proj.weight" and start == 0:
            real(self, name.replace("q_proj", "k_proj"), dim, 0, 32, out[:32])
            return real(self, name, dim, 32, stop, out[32:])
        return real(self, name, dim, start, stop, out)

    monkeypatch.setattr(CheckpointFiles, "read_into", buggy)
    code = main(["check-model", str(model), "--prompt", "The capital of France is", "-f", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "fail"
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
