"""``RolloutTally``: rank 0's running count of a rollout's allocated samples (``rollout_complete``).

Contract: built from the ids of one ``witness_allocated`` and its ``expected`` (an id allocated
``k`` times is owed ``k * expected`` counts); ``add(ids, counts)`` adds one step's global counts
(ids not allocated are ignored: they cannot complete the rollout, and the analyzer, not the tally,
reports them); ``complete()`` says whether every allocated id has been counted as often as owed.
The state is three int64 tensors the size of the allocation and each ``add`` is a sorted search,
so a step's cost is vectorized in the ids it trained, never a Python loop over them.
"""

from __future__ import annotations

from typing import Any


class RolloutTally:
    """Counts owed and counted so far for the ids of one allocation (module docstring)."""

    def __init__(self, ids: Any, expected: int) -> None:
        import torch

        self.ids, times = torch.unique(torch.as_tensor(ids, dtype=torch.int64), return_counts=True)
        self.owed = times * expected
        self.have = torch.zeros_like(self.owed)

    def add(self, ids: Any, counts: Any) -> None:
        """Add ``counts[j]`` to ``ids[j]`` (1-d, same length; tensors or lists)."""
        import torch

        ids = torch.as_tensor(ids, dtype=torch.int64)
        counts = torch.as_tensor(counts, dtype=torch.int64)
        if not self.ids.numel() or not ids.numel():
            return
        pos = torch.searchsorted(self.ids, ids).clamp_(max=self.ids.numel() - 1)
        self.have.index_add_(0, pos, torch.where(self.ids[pos] == ids, counts, 0))  # a miss adds 0

    def complete(self) -> bool:
        """Whether every allocated id was counted at least as often as it is owed."""
        return bool((self.have >= self.owed).all())
