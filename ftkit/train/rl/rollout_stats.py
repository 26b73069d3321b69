"""What a rollout's batch says before any training: the per-rollout ``metric`` values.

``rollout_metrics(batch, task, group_size, generation_seconds)`` returns, as plain floats (the
driver logs them in the rollout's ``metric`` event, ``step`` null, next to ``reward``, and the
live view shows them):

* ``reward_std`` / ``reward_min`` / ``reward_max``: of the rollout's rewards (population std,
  float64), beside ``reward``, their mean;
* ``zero_advantage_groups``: the share of groups (``group_size`` consecutive samples) whose
  advantages are all 0, so they carry no learning signal (a group of equal rewards); at 1.0 the
  rollout trains nothing (``idle_warning``: the driver warns, rule FT116 reports it);
* ``response_length_mean`` / ``response_length_max``: generated tokens per response, through
  its end (``RlTask.response_ends``: the ``eos``, a stop string; ``response_len`` for a
  fixed-length task); ``truncated_fraction``: the share of responses cut at ``response_len``
  without reaching an end (0 for a fixed-length task: its responses end there by design);
* ``gen_tokens_per_s``: generated tokens (the lengths above, summed) per second of the
  rollout's ``generation`` phase (a speed: compare-runs never compares it).

Everything but the speed is a function of the recorded batch, so two runs of the same seed log
the same values whatever their cell count. Pure torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.protocols import RlTask


def zero_advantage_share(advantages: Tensor, group_size: int) -> float:
    """The share of groups whose advantages are all exactly 0."""
    groups = advantages.reshape(-1, group_size)
    return float((groups == 0).all(dim=1).double().mean()) if groups.shape[0] else 0.0


def rollout_metrics(
    batch: dict[str, Tensor], task: RlTask, group_size: int, generation_seconds: float
) -> dict[str, float]:
    """The metrics beside ``reward`` of a rollout's ``batch`` (``ftkit.train.rl.rollouts``; its
    responses are the last ``task.response_len`` tokens of each row): see the module docstring."""
    import torch

    r = batch["rewards"].to(torch.float64)
    responses = batch["tokens"][:, batch["tokens"].shape[1] - task.response_len :]
    lengths, stopped = task.response_ends(responses)
    cut = ~stopped
    generated = int(lengths.sum())
    some = r.numel() > 0
    return {
        "reward_std": float(r.std(unbiased=False)) if some else 0.0,
        "reward_min": float(r.min()) if some else 0.0,
        "reward_max": float(r.max()) if some else 0.0,
        "zero_advantage_groups": zero_advantage_share(batch["advantages"], group_size),
        "response_length_mean": float(lengths.double().mean()) if some else 0.0,
        "response_length_max": float(lengths.max()) if some else 0.0,
        "truncated_fraction": float(cut.double().mean()) if some else 0.0,
        "gen_tokens_per_s": generated / generation_seconds if generation_seconds > 0 else 0.0,
    }


def idle_warning(rollout: int, values: Mapping[str, float | None], greedy: bool = False) -> str | None:
    """The warning for a rollout in which every group's advantages are 0 (it trains nothing:
    loss and gradient are 0), else None; ``greedy``: the run samples at temperature 0, so every
    sample of a group is the same response (the likely cause, named instead of the reward)."""
    if values.get("zero_advantage_groups") != 1.0:
        return None
    cause = (
        "greedy sampling (--temperature 0) gives every sample of a group the same response: sample at a "
        "temperature above 0"
        if greedy
        else "check the reward plug-in"
    )
    return (
        f"rollout {rollout} learns nothing: every group's advantages are 0 (the rewards within each group "
        f"are all equal, mean {values.get('reward')}), so its loss and gradient are 0; {cause}"
    )
