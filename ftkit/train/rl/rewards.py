"""Rewards in training: score each (prompt, response) pair of a rollout.

``get_reward(name)`` is the reward ``--reward`` names as a ``BatchReward``, ``fn(task, prompts,
responses) -> float32 [n]`` over int64 token tensors ``prompts [n, P]`` and ``responses [n, R]``,
depending on the tokens only (never on the process, the engine or the time), so a rollout's
rewards are the same bits wherever they are computed.

* a built-in with a token form (``ftkit.tasks.builtin_rewards``): ``task``, the addition task's
  own verifiable reward (``AdditionTask.reward``: partial credit for correct answer digits), so
  learning is visible (a prompt dataset has none: the config refuses ``task`` with
  ``prompts``); ``deterministic_random``, 0 or 1 from a stable hash of the tokens,
  uncorrelated with correctness (fault tests use it: every sample's reward is fixed by its
  tokens alone).
* anything else ``--reward`` names: a reward with the keyword contract
  (``ftkit.tasks.rewards.load_reward``: the built-in text rewards ``exact_match`` / ``format``,
  ``MODULE:FUNCTION``, or an installed ``ftkit.rewards`` entry point), called once per sample
  (``prompt``, ``response``, ``label``, ``prompt_ids``, ``response_ids``) on the task's text
  (``RlTask.reward_sample``: the addition task's or a prompt dataset's), in the driver's main
  thread. A plug-in that raises or returns a non-finite value, or a call that has not returned
  after ``--reward-timeout`` seconds (stopped by a signal: ``ftkit.tasks.time_limit``), is a
  ``RewardError`` (exit 2) naming it and the sample, and the run ends failed as for any other
  failure (``run_finished`` and ``status.json``);
  ``check_reward`` (at start-up, before Ray) refuses one that does not resolve or that scores
  the same samples differently twice.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ftkit.tasks.builtin_rewards import BUILTINS, BatchReward

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.protocols import RlTask


def _token_form(name: str) -> BatchReward | None:
    """The token form of the built-in ``name``, or ``None`` (not a built-in, or a text one)."""
    return BUILTINS[name].tokens if name in BUILTINS else None


@functools.cache
def _plugin(spec: str, timeout: float | None) -> BatchReward:
    """The keyword-contract reward ``spec`` as a ``BatchReward`` over the task's token tensors,
    each call limited to ``timeout`` seconds."""
    from ftkit.tasks.rewards import load_reward, score

    loaded = load_reward(spec)

    def fn(task: RlTask, prompts: Tensor, responses: Tensor) -> Any:
        import torch

        samples = [task.reward_sample(p, r) for p, r in zip(prompts.cpu(), responses.cpu())]
        return torch.tensor(score(loaded, samples, timeout), dtype=torch.float32)

    return fn


def check_reward(spec: str, task: RlTask, seed: int, timeout: float | None = None) -> None:
    """Resolve ``--reward`` and, for a plug-in, score the task's held-out prompts (a prompt
    dataset's first ones) with their correct answers (its labels) twice, each call limited to
    ``timeout`` seconds (``--reward-timeout``): ``ConfigError`` (exit 2) when it does not
    resolve or is not deterministic (a run's rewards must be the same bits wherever they are
    recomputed), ``RewardError`` (exit 2) when it fails on them or does not return in time."""
    if _token_form(spec) is not None:
        return
    from ftkit.errors import ConfigError
    from ftkit.tasks.rewards import check_determinism, load_reward

    loaded = load_reward(spec)
    prompts = task.heldout_prompts(seed)
    samples = [task.reward_sample(p, r) for p, r in zip(prompts, task.correct_responses(prompts))]
    moved = check_determinism(loaded, samples, timeout=timeout)
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


def get_reward(name: str, timeout: float | None = None) -> BatchReward:
    """The reward ``--reward`` names: a built-in's token form where it has one, else the reward
    ``load_reward`` resolves, scored per sample with each call limited to ``timeout`` seconds
    (``--reward-timeout``; ``None``: no limit). ``ConfigError`` when it does not resolve
    (``check_reward`` reports that before a run starts)."""
    return _token_form(name) or _plugin(name, timeout)
