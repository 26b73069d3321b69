"""The per-token policy-gradient loss of a micro-shard, normalised by its whole step.

For a sample with tokens ``x``, loss mask ``m`` and advantage ``A`` the loss is
``-A * sum_t m_t * log p(x_{t+1} | x_{<=t})``. A micro-shard's loss is the sum over its
samples divided by ``step_tokens``, the number of learned tokens of the *whole step*
(``loss_mask.sum()`` over every micro-shard). The normaliser depends on the step batch
only, never on which micro-shards a cell holds, so the micro-shard losses (and gradients)
of a step add up to the step's loss (gradient) for any assignment.

``-log p`` is megatron's vocab-parallel cross entropy (``GPTModel(..., labels=...)``), so
the loss is the same function under any TP size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def step_tokens(loss_mask: Tensor) -> float:
    """The normaliser of a step: its learned tokens, at least 1 (an all-masked step has loss 0)."""
    return max(1.0, float(loss_mask.double().sum()))


def targets(tokens: Tensor) -> Any:
    """Labels ``[b, s]``: ``tokens`` shifted left by one; the last position gets token 0
    (it is never learned: ``loss_mask`` is 0 there)."""
    import torch

    out = torch.zeros_like(tokens)
    out[:, :-1] = tokens[:, 1:]
    return out


def pg_loss(token_nll: Tensor, loss_mask: Tensor, advantages: Tensor, norm: float) -> Any:
    """Scalar ``sum(A * nll * mask) / norm`` over a micro-shard (``token_nll`` ``[b, s]``)."""
    weighted = token_nll.float() * loss_mask.to(token_nll.device) * advantages.to(token_nll.device)[:, None]
    return weighted.sum() / norm
