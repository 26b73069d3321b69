"""Reward functions: score each (prompt, response) pair of a rollout.

Every reward function has the signature ``fn(task, prompts, responses) -> float32 [n]`` over
int64 token tensors ``prompts [n, P]`` and ``responses [n, R]``, and depends on the tokens
only (never on the process, the engine or the time), so a rollout's rewards are the same
bits wherever they are computed.

* ``task``: the task's own verifiable reward (``AdditionTask.reward``: partial credit for
  correct answer digits), so learning is visible.
* ``deterministic_random``: 0 or 1 from a stable hash (blake2b over the little-endian int64
  bytes of prompt then response), uncorrelated with correctness. Fault tests use it: every
  sample's reward is fixed by its tokens alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.rl.task import AdditionTask

RewardFn = Callable[[Any, Any, Any], Any]

_PERSON = b"ftkit-reward"


def random_bit(prompt: Tensor, response: Tensor) -> int:
    """0 or 1: the low bit of blake2b(int64-le(prompt) || int64-le(response))."""
    import numpy as np

    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    for part in (prompt, response):
        h.update(np.ascontiguousarray(np.asarray(part), dtype="<i8").tobytes())
    return h.digest()[0] & 1


def deterministic_random(task: AdditionTask, prompts: Tensor, responses: Tensor) -> Any:
    """float32 ``[n]`` of 0/1: ``random_bit`` of each sample's prompt and response."""
    import torch

    p, r = prompts.cpu().numpy(), responses.cpu().numpy()
    return torch.tensor([random_bit(p[i], r[i]) for i in range(len(p))], dtype=torch.float32)


def task_reward(task: AdditionTask, prompts: Tensor, responses: Tensor) -> Any:
    """float32 ``[n]``: the task's own reward."""
    return task.reward(prompts, responses)


REWARDS: dict[str, RewardFn] = {
    "task": task_reward,
    "deterministic_random": deterministic_random,
}


def get_reward(name: str) -> RewardFn:
    """The reward function called ``name``; ``KeyError`` lists the known names."""
    try:
        return REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; known: {', '.join(REWARDS)}") from None
