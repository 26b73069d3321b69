"""A Hugging Face model built at TP=2 gathers back to exactly its TP=1 import.

The cell's canonical state (``ftkit.train.rank.canonical_state.gather``: the weights sent to the
engines, heal, checkpoints' canonical form) reads megatron's TP attributes to know which weights
are split and how. ftkit builds HF models with megatron's initialisation off, which also left
those attributes unset (``hf_build.mark_tp_shards`` sets them): every weight then looked
replicated, rank 0's shard went out as the whole tensor and an engine refused it. Two real
processes (``torchrun``, gloo), a GQA Llama with untied embeddings and a gated MLP (stride 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.model.hf_models import make_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
from megatron.core import parallel_state as ps

ps.initialize_model_parallel(2, 1, create_gloo_process_groups=False)
from ftkit.model.gpt import build_gpt
from ftkit.model.spec import resolve_model
from ftkit.train.rank.pipeline import export_cell

model_dir = sys.argv[1]
model = build_gpt(resolve_model(model_dir), 0, "cpu")
state = export_cell(model)
if dist.get_rank() == 0:
    from ftkit.model.families import load_arch
    from ftkit.model.hf_import import CheckpointFiles, rank_tensors

    arch = load_arch(Path(model_dir))
    with CheckpointFiles(Path(model_dir)) as files:
        want = dict(rank_tensors(files, arch, list(state), 0, 1))
    assert sorted(state) == sorted(want), (sorted(state), sorted(want))
    bad = [k for k in state if state[k].shape != want[k].shape or not torch.equal(state[k], want[k])]
    assert not bad, [(k, tuple(state[k].shape), tuple(want[k].shape)) for k in bad]
    print("GATHERED-EQUAL", len(state))
dist.destroy_process_group()
"""


def test_tp2_cell_state_gathers_to_the_tp1_import(tmp_path: Path) -> None:
    model = make_model("llama", tmp_path, vocab_size=512, tie_word_embeddings=False)
    script = tmp_path / "gather.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), str(model)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert res.returncode == 0 and "GATHERED-EQUAL" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
