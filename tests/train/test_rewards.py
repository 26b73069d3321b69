"""Reward functions: deterministic, token-only, selectable by name."""

import subprocess
import sys

import pytest
import torch

from ftkit.errors import ConfigError
from ftkit.tasks.addition import AdditionTask
from ftkit.tasks.builtin_rewards import BUILTINS, random_bit
from ftkit.tasks.builtin_rewards import deterministic_random_tokens as deterministic_random
from ftkit.train.rl.rewards import get_reward


def _batch(n=256, seed=0):
    task = AdditionTask(response_len=6)
    g = torch.Generator().manual_seed(seed)
    prompts = task.prompts(seed=seed, rollout=0, count=n)
    responses = torch.randint(0, 15, (n, 6), generator=g)
    return task, prompts, responses


def test_deterministic_random_is_a_balanced_stable_hash():
    task, prompts, responses = _batch()
    r = deterministic_random(task, prompts, responses)
    assert r.dtype == torch.float32 and r.shape == (256,)
    assert set(r.tolist()) == {0.0, 1.0}
    assert 0.35 < r.mean().item() < 0.65  # a hash, not a constant
    assert torch.equal(r, deterministic_random(task, prompts.clone(), responses.clone()))
    # the response matters, not only the prompt
    flipped = responses.clone()
    flipped[:, -1] = (flipped[:, -1] + 1) % 15
    assert not torch.equal(r, deterministic_random(task, prompts, flipped))


def test_random_bit_matches_a_fresh_interpreter():
    code = (
        "from ftkit.tasks.builtin_rewards import random_bit; "
        "print(''.join(str(random_bit([1, 5, 3, i % 10, 4], [i, 2, 7])) for i in range(64)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "7"}
    ).stdout.strip()
    assert out == "".join(str(random_bit([1, 5, 3, i % 10, 4], [i, 2, 7])) for i in range(64))


def test_get_reward_by_name():
    task, prompts, responses = _batch(8)
    assert torch.equal(get_reward("task")(task, prompts, responses), task.reward(prompts, responses))
    assert get_reward("deterministic_random") is deterministic_random
    assert {name for name, b in BUILTINS.items() if b.tokens is not None} == {"task", "deterministic_random"}
    with pytest.raises(ConfigError, match="unknown reward 'nope'; built-ins: deterministic_random, exact_match"):
        get_reward("nope")  # no built-in: a plug-in name, which resolves to nothing
