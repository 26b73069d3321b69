"""Sample witnesses in the model: exact per-sample counts carried by the gradient (invariant I2).

``ftkit train`` attaches one to every rank (``ftkit.train.rank.witness`` re-exports it); another
trainer may too, for counts read from the reduced gradient itself rather than from the sample
ids the rank trained (``ftkit.evidence.EvidenceRun.witness_counts``: pass the ``read`` result
as ``counted``).

A ``WitnessTable`` is a ``[capacity, 2]`` float32 parameter that sits *beside* the model
(never registered inside it: it is in no ``model.parameters()``, so it is never in the
optimizer, the exported weights, the final state or a dump). ``apply(x, rows)`` runs the
embedding output ``x`` (``[s, b, h]``, megatron layout) through ``WitnessFn``, with the
table rows of the micro-batch's witness ids (``rows(ids)``):

* forward returns ``x`` unchanged, bitwise (a view of the same values): the model's
  activations do not depend on whether a witness is attached;
* backward passes the gradient of ``x`` through unchanged and writes into the table's
  gradient, for each sample ``j`` of the micro-batch with row ``r_j``: ``+1`` into
  ``[r_j, 0]`` (the count) and the L2 norm of ``dL/dx[:, j, :]`` into ``[r_j, 1]`` (the
  contribution: non-zero only if the sample's loss reached the model).

Rows: sample ids need only be unique within one rollout (one ``allocate``): a data set's
indices may be allocated again every epoch, as ``EvidenceRun`` users do, or numbered run-globally
(``rollout * samples_per_rollout + i``), as ``ftkit train`` does; a table of
``capacity = samples_per_rollout`` rows maps id to ``id % capacity``, which is one row per
sample of a rollout when a rollout's ids are consecutive. ``rows`` refuses two distinct
ids of one step that land on the same row (that would merge their counts).

The table's gradient is reduced across cells exactly like every other gradient (counts are
small integers, so the fixed-point sum is exact); ``read`` then gives the global count and
contribution per id, before the optimizer step. The worker points the table's gradient at
a fresh zeroed row with the model's gradients before every micro-shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _witness_fn() -> Any:
    import torch

    class WitnessFn(torch.autograd.Function):
        """Identity on ``x``; backward counts samples into the table's gradient."""

        @staticmethod
        def forward(ctx: Any, x: Any, table: Any, rows: Any) -> Any:
            ctx.save_for_backward(rows)
            ctx.table_shape = table.shape
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (rows,) = ctx.saved_tensors
            g = torch.zeros(ctx.table_shape, dtype=torch.float32, device=grad.device)
            ones = torch.ones(rows.shape[0], dtype=torch.float32, device=grad.device)
            norms = grad.detach().float().pow(2).sum(dim=(0, 2)).sqrt()
            g[:, 0].index_add_(0, rows, ones)
            g[:, 1].index_add_(0, rows, norms)
            return grad, g, None

    return WitnessFn


class WitnessTable:
    """The witness parameter of one rank (created where the model has its embedding)."""

    def __init__(self, capacity: int, device: str = "cpu") -> None:
        import torch

        if capacity < 1:
            raise ValueError("a witness table needs at least one row")
        self.capacity = capacity
        self.param = torch.nn.Parameter(torch.zeros(capacity, 2, dtype=torch.float32, device=device))
        self._fn = _witness_fn()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Table rows of ``ids`` (``id % capacity``); raises if two distinct ids collide."""
        import torch

        ids = ids.to(torch.int64)
        rows = torch.remainder(ids, self.capacity)
        uniq_ids = torch.unique(ids)
        if torch.unique(torch.remainder(uniq_ids, self.capacity)).numel() != uniq_ids.numel():
            raise ValueError(
                f"witness ids collide modulo the table capacity {self.capacity}: "
                "a rollout's ids must be distinct modulo samples_per_rollout"
            )
        return rows.to(self.param.device)

    def apply(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``x`` (``[s, b, h]``) unchanged; its backward counts the ``b`` samples at table
        ``rows`` (from ``rows(ids)``, checked once per step rather than per micro-shard)."""
        if x.shape[1] != rows.shape[0]:
            raise ValueError(f"{rows.shape[0]} witness rows for a micro-batch of {x.shape[1]} samples")
        out: torch.Tensor = self._fn.apply(x, self.param, rows)
        return out

    def read(self, grad: torch.Tensor, ids: Sequence[int]) -> tuple[list[int], list[int], list[float]]:
        """``(ids, counts, contributions)`` from a reduced ``[capacity, 2]`` gradient for the
        distinct ``ids`` (sorted) whose count is non-zero. A count is an integer by
        construction; a non-integer value raises (it would mean a corrupted reduction)."""
        import torch

        uniq = sorted(set(int(i) for i in ids))
        rows = torch.tensor([i % self.capacity for i in uniq], dtype=torch.int64)
        vals = grad.detach().cpu().to(torch.float64)[rows]
        out_ids, counts, contribs = [], [], []
        for i, (c, v) in zip(uniq, vals.tolist()):
            if c != int(c):
                raise ValueError(f"witness count {c} of id {i} is not an integer")
            if c:
                out_ids.append(i)
                counts.append(int(c))
                contribs.append(float(v))
        return out_ids, counts, contribs
