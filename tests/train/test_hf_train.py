"""``ftkit train --model DIR`` on a small random-init Hugging Face Llama (issue 21): the model's
own vocabulary (300 tokens, padded to 1024 rows), the addition task through its tokenizer, and the
invariants of a preset run: 1 cell and 2 cells train bitwise the same (``compare-dumps
--exact``), the event log analyzes clean, and ``run.json`` records the model's path and digest.
The same runs' checkpoint exports as its verified state (a tampered one is refused); the other
families run the 1-cell / 2-cell invariant with ``FTKIT_MODEL_MATRIX=1`` or in the full suite (about 2 minutes each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite import FULL

from tests.model.hf_models import FAMILIES, make_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    "--rollouts", "2", "--samples-per-rollout", "8", "--micro-shards", "2", "--group-size", "4",
    "--reward", "deterministic_random", "--dump-rollouts", "all", "--seed", "3",
)  # fmt: skip


def ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def train_cells(family: str, root: Path) -> tuple[Path, dict[int, Path]]:
    """A random-init ``family`` model and its runs on 1 and 2 cells (each analyzed clean)."""
    model = make_model(family, root, eos=True)
    runs = {}
    for cells in (1, 2):
        out = root / f"{family}-cells{cells}"
        res = ftkit("train", "--model", str(model), "--out", str(out), "--cells", str(cells), *CONFIG)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        runs[cells] = out
        analyzed = ftkit("analyze-events", str(out / "events"))
        assert analyzed.returncode == 0, analyzed.stdout[-3000:]
    return model, runs


def assert_same_bits(runs: dict[int, Path]) -> None:
    compare = ftkit("compare-dumps", "--exact", str(runs[1]), str(runs[2]))
    assert compare.returncode == 0, compare.stdout[-3000:] + compare.stderr[-3000:]


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory):
    """The Llama model and its 1- and 2-cell runs (each publishes a checkpoint per rollout)."""
    return train_cells("llama", tmp_path_factory.mktemp("llama"))


def test_hf_llama_trains_the_same_bits_on_one_and_two_cells(llama_runs):
    from ftkit.model.source import content_digest

    model, runs = llama_runs
    recorded = json.loads((runs[1] / "run.json").read_text())
    config = recorded.get("config", recorded)
    assert config["model"] == str(model) and config["model_digest"] == content_digest(model)
    assert_same_bits(runs)


@pytest.mark.skipif(not (FULL or os.environ.get("FTKIT_MODEL_MATRIX")), reason="FTKIT_MODEL_MATRIX=1 runs every family")
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])  # qwen2 QKV bias, qwen3 QK-norm, mistral
def test_every_family_trains_the_same_bits_on_one_and_two_cells(family, tmp_path):
    assert_same_bits(train_cells(family, tmp_path)[1])


def test_export_of_a_checkpoint_is_its_verified_state(llama_runs, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ftkit.model.families import load_arch
    from ftkit.model.hf_export import hf_tensors

    model, runs = llama_runs
    checkpoint = runs[1] / "checkpoints" / "step_000001"  # not the final state: training went on
    out = tmp_path / "exported"
    res = ftkit("export", str(checkpoint), "--hf", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    state = load_file(str(checkpoint / "model.safetensors"))
    expected = hf_tensors([state], load_arch(model))
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert set(expected) <= set(loaded)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
    final = load_file(str(runs[1] / "final" / "tp0-pp0.safetensors"))
    assert not torch.equal(final["model.decoder.final_layernorm.weight"], state["decoder.final_layernorm.weight"])
    latest = ftkit("export", str(runs[1] / "checkpoints" / "latest"), "--hf", str(tmp_path / "latest"))
    assert latest.returncode == 0, latest.stderr[-3000:]
    missing = ftkit("export", str(runs[1] / "checkpoints" / "step_000099"), "--hf", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "no such checkpoint directory" in missing.stderr

    tampered = tmp_path / "tampered"
    shutil.copytree(runs[1], tampered, symlinks=True)
    payload = tampered / "checkpoints" / "step_000001" / "model.safetensors"
    data = bytearray(payload.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor's last element
    payload.write_bytes(bytes(data))
    refused = tmp_path / "refused"
    res = ftkit("export", str(payload.parent), "--hf", str(refused))
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "does not verify" in res.stderr and "Traceback" not in res.stderr
    assert not refused.exists()


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
