"""``ftkit train --model DIR`` on a small random-init Hugging Face Llama (issue 21): the model's
own vocabulary (300 tokens, padded to 384), the addition task through its tokenizer, and the
invariants of a preset run: 1 cell and 2 cells train bitwise the same (``compare-dumps
--exact``), the event log analyzes clean, and ``run.json`` records the model's path and digest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.model.hf_models import make_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    "--rollouts", "2", "--samples-per-rollout", "8", "--micro-shards", "2", "--group-size", "4",
    "--reward", "deterministic_random", "--dump-rollouts", "all", "--seed", "3",
)  # fmt: skip


def ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def test_hf_llama_trains_the_same_bits_on_one_and_two_cells(tmp_path):
    from ftkit.model.source import content_digest

    model = make_model("llama", tmp_path, eos=True)
    runs = {}
    for cells in (1, 2):
        out = tmp_path / f"cells{cells}"
        res = ftkit("train", "--model", str(model), "--out", str(out), "--cells", str(cells), *CONFIG)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        runs[cells] = out
        analyzed = ftkit("analyze-events", str(out / "events"))
        assert analyzed.returncode == 0, analyzed.stdout[-3000:]
    recorded = json.loads((runs[1] / "run.json").read_text())
    config = recorded.get("config", recorded)
    assert config["model"] == str(model) and config["model_digest"] == content_digest(model)
    compare = ftkit("compare-dumps", "--exact", str(runs[1]), str(runs[2]))
    assert compare.returncode == 0, compare.stdout[-3000:] + compare.stderr[-3000:]


def test_hf_model_with_an_unusable_tokenizer_is_exit_2(tmp_path):
    model = make_model("llama", tmp_path)  # its tokenizer has no eos_token
    res = ftkit("train", "--model", str(model), "--out", str(tmp_path / "run"), "--cells", "1", *CONFIG)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "eos_token" in res.stderr


def test_lr_zero_then_export_reproduces_the_source_bitwise(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = make_model("llama", tmp_path, eos=True)
    run, out = tmp_path / "run", tmp_path / "exported"
    res = ftkit("train", "--model", str(model), "--out", str(run), "--cells", "1", "--lr", "0", *CONFIG)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = ftkit("export", str(run), "--hf", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    source = load_file(str(model / "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    exported: dict[str, torch.Tensor] = {}
    for shard in out.glob("model-*.safetensors"):
        exported.update(load_file(str(shard)))
    assert set(exported) == set(source) - {"lm_head.weight"}  # tied: the embedding is the output layer
    for name, tensor in exported.items():
        assert tensor.dtype == source[name].dtype and torch.equal(tensor, source[name]), name
        assert torch.equal(loaded[name], source[name]), name
    again = ftkit("export", str(run), "--hf", str(out))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
