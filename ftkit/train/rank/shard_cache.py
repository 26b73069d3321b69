"""Micro-shard gradients of a discarded step attempt, kept for the step's retry.

A micro-shard's gradient row depends only on the model state, the batch and the
micro-shard's seed (docs/training.md), never on which cell computed it or in which attempt;
nothing is stepped before a commit. So when an attempt is discarded because a *peer* failed
(a dead cell, a collective error), the rows a surviving rank already computed are exactly
the rows its retry would compute again: the retry copies them back instead of running their
forward and backward passes, and computes only the micro-shards that were the lost cell's.
Kill -> the survivors' next commit is then the lost cell's share of the compute, not the
whole step's.

Contract (one per rank, driven by ``RankWorker``):

* ``computed(step, shards, rows, losses, stats=None)`` after the local compute, before the
  cross-cell reduction (which reads ``rows`` but does not write them): the rows, per-micro-shard
  losses and (GRPO) per-micro-shard metric rows (``StepMetrics.shards``) of this attempt; only
  for rows that are exact per-micro-shard gradients (the exact reduction with bookkeeping) and
  nothing injected into them;
* ``discarded(step) -> bool``: the attempt is discarded; ``True`` when its rows are kept
  (rows of ``step``, all finite: a non-finite row is recomputed; the caller must then stop
  reusing the rows buffer: it now belongs to the cache);
* ``take(step) -> {micro-shard: (row, loss, stats row or None)}``: at the start of an attempt,
  what can be reused for ``step`` (empty for any other step); the cache is empty afterwards;
* ``clear()`` at a commit (or anything else that changes the model state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


class ShardCache:
    """See the module docstring."""

    def __init__(self) -> None:
        self._computed: tuple[int, list[int], Any, list[float], list[Any]] | None = None
        self._kept: tuple[int, list[int], Any, list[float], list[Any]] | None = None

    def computed(self, step: int, shards: list[int], rows: Tensor, losses: Tensor, stats: Tensor | None = None) -> None:
        extra = [None if stats is None else stats[m].clone() for m in shards]
        self._computed = (int(step), list(shards), rows, [float(losses[m]) for m in shards], extra)

    def discarded(self, step: int) -> bool:
        import torch

        done, self._computed = self._computed, None
        ok = done is not None and done[0] == step and bool(torch.isfinite(done[2]).all())
        self._kept = done if ok else None
        return self._kept is not None

    def take(self, step: int) -> dict[int, tuple[Any, float, Any]]:
        kept, self._kept, self._computed = self._kept, None, None
        if kept is None or kept[0] != step:
            return {}
        _, shards, rows, losses, extra = kept
        return {m: (rows[i], losses[i], extra[i]) for i, m in enumerate(shards)}

    def clear(self) -> None:
        self._computed = self._kept = None
