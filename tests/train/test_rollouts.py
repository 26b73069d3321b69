"""Rollout batches: advantages, masks, witness ids and the atomic recording."""

import pytest
import torch

from ftkit.tasks.addition import PROMPT_LEN, AdditionTask
from ftkit.train.rl import rollouts


def test_group_advantages_normalise_each_group():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0])
    a = rollouts.group_advantages(r, 4)
    assert a.dtype == torch.float32
    assert a[:4].tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert a[4:8].tolist() == [0.0, 0.0, 0.0, 0.0]  # no signal in an all-equal group
    assert a[8:].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert a[11].item() == pytest.approx(3**0.5, rel=1e-5)
    with pytest.raises(ValueError):
        rollouts.group_advantages(r, 5)


def test_build_batch_layout():
    task = AdditionTask(response_len=4)
    prompts = task.prompts(0, 2, 3).repeat_interleave(2, dim=0)
    responses = torch.arange(24).reshape(6, 4)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.2, 0.4])
    logprobs = -torch.arange(1, 25, dtype=torch.float32).reshape(6, 4)
    b = rollouts.build_batch(prompts, responses, logprobs, rewards, group_size=2, rollout=2)
    assert set(b) == set(rollouts.BATCH_KEYS)
    assert b["tokens"].shape == (6, PROMPT_LEN + 4)
    assert torch.equal(b["tokens"][:, PROMPT_LEN:], responses)
    # position t is learned iff token t+1 is a response token
    assert b["loss_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0]
    assert b["witness_ids"].tolist() == [12, 13, 14, 15, 16, 17]
    assert b["advantages"][2:4].tolist() == [0.0, 0.0]
    # the engine's log-prob of response token j sits where that token is predicted (mask 1)
    assert b["logprobs"][1].tolist() == [0, 0, 0, 0, -5, -6, -7, -8, 0]
    assert torch.equal(b["logprobs"] != 0, b["loss_mask"] != 0)
    with pytest.raises(ValueError, match="same number"):
        rollouts.build_batch(prompts, responses[:5], logprobs[:5], rewards, 2, 0)
    with pytest.raises(ValueError, match="same number"):
        rollouts.build_batch(prompts, responses, logprobs[:, :3], rewards, 2, 0)


def test_record_roundtrip(tmp_path):
    task = AdditionTask(response_len=3)
    prompts = task.prompts(0, 0, 4)
    b = rollouts.build_batch(prompts, torch.ones(4, 3, dtype=torch.int64), -torch.ones(4, 3), torch.arange(4.0), 2, 0)
    path = rollouts.record(tmp_path, 7, b, meta={"task": "addition"})
    assert path == tmp_path / "rollouts" / "rollout_000007.safetensors"
    loaded = rollouts.load(path)
    for k in rollouts.BATCH_KEYS:
        assert torch.equal(loaded[k], b[k]) and loaded[k].dtype == b[k].dtype
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    assert meta["schema"] == rollouts.ROLLOUT_SCHEMA and meta["rollout"] == "7" and meta["task"] == "addition"
    assert not [p for p in path.parent.iterdir() if p != path]  # no temp files left
