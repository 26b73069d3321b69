"""Reward functions: score each (prompt, response) pair of a rollout.

Every reward function has the signature ``fn(task, prompts, responses) -> float32 [n]`` over
int64 token tensors ``prompts [n, P]`` and ``responses [n, R]``, and depends on the tokens
only (never on the process, the engine or the time), so a rollout's rewards are the same
bits wherever they are computed.

* ``task``: the addition task's own verifiable reward (``AdditionTask.reward``: partial credit
  for correct answer digits), so learning is visible; a prompt dataset has none (the config
  refuses ``task`` with ``prompts``).
* ``deterministic_random``: 0 or 1 from a stable hash (blake2b over the little-endian int64
  bytes of prompt then response), uncorrelated with correctness. Fault tests use it: every
  sample's reward is fixed by its tokens alone.
* anything else ``--reward`` names: a plug-in (``ftkit.tasks.rewards.load_reward``: the built-in
  text rewards ``exact_match`` / ``format``, ``MODULE:FUNCTION``, or an installed
  ``ftkit.rewards`` entry point), called once per sample with the keyword contract
  (``prompt``, ``response``, ``label``, ``prompt_ids``, ``response_ids``) on the task's text
  (``RlTask.reward_sample``: the addition task's or a prompt dataset's). A plug-in that raises
  or returns a non-finite value is a ``RewardError`` (exit 2) naming it and the sample;
  ``check_reward`` (at start-up, before Ray) refuses one that does not resolve or that scores
  the same samples differently twice.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.rl.task import AdditionTask, RlTask

RewardFn = Callable[[Any, Any, Any], Any]

_PERSON = b"ftkit-reward"


def random_bit(prompt: Tensor, response: Tensor) -> int:
    """0 or 1: the low bit of blake2b(int64-le(prompt) || int64-le(response))."""
    import numpy as np

    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    for part in (prompt, response):
        h.update(np.ascontiguousarray(np.asarray(part), dtype="<i8").tobytes())
    return h.digest()[0] & 1


def deterministic_random(task: RlTask, prompts: Tensor, responses: Tensor) -> Any:
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


@functools.cache
def _plugin(spec: str) -> RewardFn:
    """The plug-in ``spec`` as a ``RewardFn`` over the task's token tensors."""
    from ftkit.tasks.rewards import load_reward, score

    loaded = load_reward(spec)

    def fn(task: RlTask, prompts: Tensor, responses: Tensor) -> Any:
        import torch

        samples = [task.reward_sample(p, r) for p, r in zip(prompts.cpu(), responses.cpu())]
        return torch.tensor(score(loaded, samples), dtype=torch.float32)

    return fn


def check_reward(spec: str, task: RlTask, seed: int) -> None:
    """Resolve ``--reward`` and, for a plug-in, score the task's held-out prompts (a prompt
    dataset's first ones) with their correct answers (its labels) twice: ``ConfigError``
    (exit 2) when it does not resolve, fails on them, or is not deterministic (a run's rewards
    must be the same bits wherever they are recomputed)."""
    if spec in REWARDS:
        return
    from ftkit.errors import ConfigError
    from ftkit.tasks.rewards import check_determinism, load_reward

    loaded = load_reward(spec)
    prompts = task.heldout_prompts(seed)
    samples = [task.reward_sample(p, r) for p, r in zip(prompts, task.correct_responses(prompts))]
    moved = check_determinism(loaded, samples)
    if moved:
        m = moved[0]
        raise ConfigError(
            f"reward {spec!r} is not deterministic: sample {m.index} ({samples[m.index].prompt!r} -> "
            f"{samples[m.index].response!r}) scored {m.first!r}, then {m.second!r}",
            hint="a reward must be a pure function of its arguments (no clock, no global random state)",
        )


def check_rescored(spec: str, rollout: int, recorded: dict[str, Any], batch: dict[str, Any]) -> None:
    """A rollout generated again (a resumed or recovered session regenerating one it had
    recorded) must score every sample whose tokens are unchanged with the same float32 bits;
    ``RewardError`` (exit 2) names the reward and the first sample that moved. A reward that is
    deterministic within a process but not across processes (a clock, a process id, state
    kept between sessions) passes ``check_reward`` and is caught here, never hidden."""
    import torch

    from ftkit.tasks.rewards import RewardError

    same = (recorded["tokens"] == batch["tokens"]).all(dim=1)
    old, new = recorded["rewards"].to(torch.float32), batch["rewards"].to(torch.float32)
    moved = same & (old.view(torch.int32) != new.view(torch.int32))
    if bool(moved.any()):
        i = int(moved.nonzero()[0, 0])
        raise RewardError(
            spec,
            i,
            f"is not deterministic: rollout {rollout} was recorded with {float(old[i])!r} and scored "
            f"{float(new[i])!r} when generated again from the same tokens",
        )


def get_reward(name: str) -> RewardFn:
    """The reward ``--reward`` names: one of ``REWARDS``, else a plug-in (``ConfigError`` when
    it does not resolve; ``check_reward`` reports that before a run starts)."""
    return REWARDS[name] if name in REWARDS else _plugin(name)
