"""A rollout's global batch: advantages, the batch tensors, witness ids and the recording.

The batch of rollout ``r`` holds ``N = samples_per_rollout`` samples in prompt-major order:
samples ``[g*G, (g+1)*G)`` are the ``G = group_size`` responses to prompt ``g``. Its tensors
(docs/architecture.md, "Training"):

* ``tokens`` int64 ``[N, S]``: prompt then response, ``S = prompt_len + response_len``;
* ``loss_mask`` float32 ``[N, S]``: 1 at position ``t`` where token ``t+1`` is a learned
  response token (the task's ``response_mask``: every response token of the addition task, a
  prompt dataset's up to and including ``eos``), else 0;
* ``advantages`` float32 ``[N]``: group-normalised rewards;
* ``rewards`` float32 ``[N]``;
* ``witness_ids`` int64 ``[N]``: ``rollout * N + i`` for sample ``i``; unique over the run,
  so a count that leaks into another rollout's step shows up as a foreign id;
* ``logprobs`` float32 ``[N, S]``: the behaviour policy's log-probs as the engine that sampled
  the response reported them, laid out like ``loss_mask`` (position ``t`` scores token
  ``t+1``; 0 where the mask is 0). GRPO's importance ratio is taken against them, and the
  trainer's recomputation is compared with them (``ftkit.train.rl.logprob_check``).

``record`` writes them to ``rollouts/rollout_XXXXXX.safetensors`` atomically. Everything here
is a function of the data only, so two runs of the same seed record the same bytes whatever
their cell count.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

ROLLOUT_SCHEMA = "ftkit.rollout/1"
BATCH_KEYS = ("tokens", "loss_mask", "advantages", "rewards", "witness_ids", "logprobs")
_EPS = 1e-6


def group_advantages(rewards: Tensor, group_size: int) -> Any:
    """float32 ``[N]``: ``(r - mean(group)) / (std(group) + 1e-6)`` per group of ``group_size``
    consecutive samples (population std, computed in float64). A group whose rewards are all
    equal has zero advantages: it carries no learning signal."""
    import torch

    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards cannot be cut into groups of {group_size}")
    r = rewards.to(torch.float64).reshape(n // group_size, group_size)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    adv = torch.where(std > 0, (r - mean) / (std + _EPS), torch.zeros_like(r))
    return adv.reshape(n).to(torch.float32)


def witness_ids(rollout: int, count: int) -> Any:
    """int64 ``[count]``: the witness ids of rollout ``rollout``'s samples, ``rollout*count + i``."""
    import torch

    return torch.arange(rollout * count, (rollout + 1) * count, dtype=torch.int64)


def build_batch(
    prompts: Tensor,
    responses: Tensor,
    logprobs: Tensor,
    rewards: Tensor,
    group_size: int,
    rollout: int,
    response_mask: Tensor | None = None,
) -> dict[str, Any]:
    """The batch tensors of one rollout from per-sample ``prompts [N, P]``, ``responses
    [N, R]`` (int64), the engines' ``logprobs [N, R]`` of those response tokens, ``rewards
    [N]`` and the learned response tokens ``response_mask [N, R]`` (float32; ``None``: all of
    them); see the module docstring."""
    import torch

    n, p = prompts.shape
    r = responses.shape[1]
    if responses.shape[0] != n or rewards.shape[0] != n or tuple(logprobs.shape) != (n, r):
        raise ValueError(
            f"prompts ({n}), responses {tuple(responses.shape)}, log-probs {tuple(logprobs.shape)} and rewards "
            f"({rewards.shape[0]}) must have the same number of samples (and response length)"
        )
    tokens = torch.cat([prompts.to(torch.int64), responses.to(torch.int64)], dim=1).contiguous()
    learned = torch.ones((n, r), dtype=torch.float32) if response_mask is None else response_mask.to(torch.float32)
    loss_mask = torch.zeros((n, p + r), dtype=torch.float32)
    loss_mask[:, p - 1 : p + r - 1] = learned
    behaviour = torch.zeros((n, p + r), dtype=torch.float32)
    behaviour[:, p - 1 : p + r - 1] = torch.where(learned > 0, logprobs.to(torch.float32), 0.0)
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "advantages": group_advantages(rewards, group_size),
        "rewards": rewards.to(torch.float32).contiguous(),
        "witness_ids": witness_ids(rollout, n),
        "logprobs": behaviour,
    }


def rollout_path(run_dir: str | os.PathLike[str], rollout: int) -> Path:
    """``<run_dir>/rollouts/rollout_XXXXXX.safetensors``."""
    return Path(run_dir) / "rollouts" / f"rollout_{rollout:06d}.safetensors"


def record(
    run_dir: str | os.PathLike[str], rollout: int, batch: dict[str, Tensor], meta: dict[str, str] | None = None
) -> Path:
    """Write ``batch`` to ``rollout_path(run_dir, rollout)`` atomically; returns the path.

    The safetensors metadata carries ``schema`` (``ROLLOUT_SCHEMA``), ``rollout`` and ``meta``.
    """
    from ftkit.tensors.st import write_safetensors_atomic

    path = rollout_path(run_dir, rollout)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"schema": ROLLOUT_SCHEMA, "rollout": str(rollout), **(meta or {})}
    write_safetensors_atomic(path, {k: batch[k] for k in BATCH_KEYS}, metadata=metadata)
    return path


def load(path: str | os.PathLike[str], keys: tuple[str, ...] = BATCH_KEYS) -> dict[str, Any]:
    """The batch tensors recorded at ``path`` (no unpickling: safetensors only); ``ValueError``
    when one of ``keys`` is missing."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise ValueError(f"{path}: not a rollout record (missing {', '.join(missing)})")
    return tensors


def check_rerecorded(run_dir: str | os.PathLike[str], reward: str, rollout: int, tensors: dict[str, Any]) -> None:
    """A rollout generated again (resumed, recovered) whose record is still there: its rewards
    must not move (``ftkit.train.rl.rewards.check_rescored``, ``reward`` the run's reward name).
    A record that cannot be read is about to be replaced by this one and proves nothing either way."""
    from safetensors import SafetensorError

    from ftkit.train.rl.rewards import check_rescored

    path = rollout_path(run_dir, rollout)
    if not path.is_file():
        return
    try:
        recorded = load(path, keys=("tokens", "rewards"))
    except (OSError, ValueError, SafetensorError):
        return
    if all(recorded[k].shape == tensors[k].shape for k in ("tokens", "rewards")):
        check_rescored(reward, rollout, recorded, tensors)
