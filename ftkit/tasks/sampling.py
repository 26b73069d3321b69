"""Which dataset prompts a rollout uses: a function of the seed and the rollout number only.

A dataset of ``N`` prompts is read in *epochs*: epoch ``e`` is a permutation of ``0 .. N-1``
(ordered by ``blake2b(seed, e, index)``, so it is the same on every machine and Python version),
and rollout ``r`` with ``k`` prompts takes positions ``r*k .. r*k + k - 1`` of the concatenated
epochs. Every prompt is used once per epoch before any is used again (a rollout that straddles
two epochs may hold a prompt from each that is the same prompt); which prompts a rollout
holds never depends on the cells, on a restart or on earlier rollouts having been computed, so a
resumed run draws the same prompts (the addition task's ``prompts(seed, rollout, count)`` has the
same contract).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache


def rollout_indices(num_prompts: int, per_rollout: int, seed: int, rollout: int) -> list[int]:
    """The dataset indices of rollout ``rollout``'s ``per_rollout`` prompts, in order."""
    if num_prompts < 1 or per_rollout < 1 or rollout < 0:
        raise ValueError(
            f"need num_prompts, per_rollout >= 1 and rollout >= 0, got {num_prompts}, {per_rollout}, {rollout}"
        )
    start = rollout * per_rollout
    return [
        epoch_order(num_prompts, seed, pos // num_prompts)[pos % num_prompts]
        for pos in range(start, start + per_rollout)
    ]


@lru_cache(maxsize=4)
def epoch_order(num_prompts: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The permutation of ``0 .. num_prompts-1`` that epoch ``epoch`` reads the dataset in."""
    prefix = f"ftkit-prompts/{seed}/{epoch}/".encode()

    def key(i: int) -> bytes:
        return hashlib.blake2b(prefix + str(i).encode(), digest_size=8).digest()

    return tuple(sorted(range(num_prompts), key=key))
