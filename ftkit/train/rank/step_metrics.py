"""GRPO's per-step metrics on a rank, the same bits on every cell: ``StepMetrics``.

What a GRPO step measures beside its loss (``Reduced.metrics``, logged in the driver's step
``metric``; docs/rl.md "Metrics"):

* ``entropy``: the policy's entropy (``ftkit.engines.policy.policy_logprobs_entropy``: of the
  distribution over the task's response tokens the engines sample from) at every learned
  position, mean per learned token;
* ``clip_fraction``: the share of learned tokens whose clipped surrogate is the one taken
  (``grpo.TokenTerms.clipped``: the ratio left ``[1 - clip_low, 1 + clip_high]`` on the side
  the advantage's sign makes binding);
* ``kl``: the k3 estimate of KL(policy || reference), mean per learned token (only with a
  reference model, ``--kl-coef > 0``);
* at a rollout's first step (the trainer still holds the weights the engines sampled with),
  the engine-vs-trainer log-prob difference over every compared token of the rollout
  (``ftkit.train.rl.logprob_stats``, the same comparison as ``logprob_check``):
  ``logprob_diff_mean_abs``, ``logprob_diff_max_abs`` and ``logprob_diff_k3`` (the k3 estimate
  of KL(engine || trainer)).

How they stay membership invariant: each micro-shard's sums are computed by the cell that
computes the micro-shard (entropy under ``no_grad`` from the log-softmax the loss computes
anyway, so nothing of the training changes), into its own row of a ``[M, 3]`` float64 table; each compared
sample's figures go into its own row (its index in the rollout) of a ``[N, 4]`` table. Every row
has one contributor across the cells, so the tables ride in the step's reduction beside the
micro-shard losses (``side``: a sum with zeros is the contributor's bits) and arrive whole on
every rank, where ``metrics`` adds the rows up in order with ``math.fsum`` (exactly rounded).
A micro-shard's row is kept with its gradient for a retry (``ShardCache``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.config import TrainConfig
    from ftkit.train.rl.grpo import TokenTerms
    from ftkit.train.rl.logprob_stats import LogprobComparison

_SHARD_COLUMNS = 3  # entropy sum, clipped tokens, k3 sum
_SAMPLE_COLUMNS = 4  # compared finite tokens, |diff| sum, |diff| max, k3 sum


class StepMetrics:
    """The tables of one step attempt on one rank (see the module docstring).

    ``micro_shards``: the step's M; ``samples``: the rollout's N when this is a rollout's first
    step (the log-prob comparison), else None; ``reference``: whether a KL is measured."""

    @classmethod
    def of(cls, cfg: TrainConfig, rollout_start: bool, reference: bool, device: str) -> StepMetrics | None:
        """The tables of a step of a run of ``cfg`` (None unless ``--loss grpo``); ``rollout_start``:
        the step is its rollout's first (the log-prob comparison's rows)."""
        if cfg.objective.loss != "grpo":
            return None
        return cls(cfg.batch.micro_shards, cfg.batch.samples_per_rollout if rollout_start else None, reference, device)

    def __init__(self, micro_shards: int, samples: int | None, reference: bool, device: str) -> None:
        import torch

        self.reference = reference
        self.shards = torch.zeros(micro_shards, _SHARD_COLUMNS, dtype=torch.float64, device=device)
        self.samples = None if samples is None else torch.zeros(samples, _SAMPLE_COLUMNS, dtype=torch.float64)

    def add_shard(self, m: int, entropy: Tensor, terms: TokenTerms) -> None:
        """Micro-shard ``m``'s sums over its learned tokens (``entropy``: at each of them,
        ``ftkit.engines.policy.policy_logprobs_entropy``; ``terms``: 0 elsewhere)."""
        self.shards[m, 0] = entropy.double().sum()
        self.shards[m, 1] = terms.clipped.double().sum()
        self.shards[m, 2] = terms.kl.detach().double().sum()

    def add_comparison(self, result: LogprobComparison, rows: list[int]) -> None:
        """The compared samples' figures (``result.samples[j]`` is rollout sample ``rows[j]``)."""
        if self.samples is None:
            return
        for row, s in zip(rows, result.samples):
            good = s.tokens - s.nonfinite
            self.samples[row] = self.samples.new_tensor([good, s.mean_abs * good, s.max_abs, s.k3 * good])

    def side(self, losses: Tensor) -> Tensor:
        """The float64 CPU vector that rides in the reduction: ``losses``, then the tables."""
        import torch

        parts = [losses, self.shards.cpu().reshape(-1)]
        if self.samples is not None:
            parts.append(self.samples.reshape(-1))
        return torch.cat(parts)

    def unpack(self, side: Tensor, losses: Tensor, tokens: int) -> dict[str, float]:
        """Take the reduced ``side`` back (``losses`` and the tables, now every cell's); returns
        the step's ``metrics(tokens)``."""
        m = losses.numel()
        losses.copy_(side[:m])
        end = m + self.shards.numel()
        self.shards = side[m:end].reshape(self.shards.shape).clone()
        if self.samples is not None:
            self.samples = side[end:].reshape(self.samples.shape).clone()
        return self.metrics(tokens)

    def metrics(self, tokens: int) -> dict[str, float]:
        """The step's metrics from the reduced tables (``tokens``: the step's learned tokens)."""
        per = max(tokens, 1)
        cols = self.shards.T.tolist()
        out = {"entropy": math.fsum(cols[0]) / per, "clip_fraction": math.fsum(cols[1]) / per}
        if self.reference:
            out["kl"] = math.fsum(cols[2]) / per
        if self.samples is not None and bool(self.samples[:, 0].any()):  # tokens were compared
            good, abs_sum, abs_max, k3_sum = self.samples.T.tolist()
            compared = math.fsum(good)
            out["logprob_diff_mean_abs"] = math.fsum(abs_sum) / compared
            out["logprob_diff_max_abs"] = max(abs_max, default=0.0)
            out["logprob_diff_k3"] = math.fsum(k3_sum) / compared
        return out
