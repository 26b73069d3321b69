"""The GRPO objective as pure torch functions (no model, no ftkit.train import).

Layout (as the rollout batch of ``ftkit.train.rl.rollouts``): ``[n, s]`` tensors where position
``t`` scores token ``t+1`` (``ftkit.engines.policy.next_token_logprobs``), a float or bool ``mask`` that is 1 where a
response token is learned, ``advantages`` ``[n]`` per sample. Samples ``[g*G, (g+1)*G)`` are
the ``G`` responses to prompt ``g``.

* **Log-probs** (``ftkit.engines.policy.token_logprobs``): ``log_softmax`` of the float32
  logits over the vocabulary, gathered at the target ids. One formulation, so the trainer and
  an engine that run it on the same logits with the same shapes get the same bits (the trainer
  recomputes the behaviour log-probs of the rollout's tokens; ``logprob_stats`` compares the two).
* **Advantages** (``group_advantages``): ``(r - mean) / (std + 1e-6)`` per group (population
  std, float64, a group of equal rewards has zero advantages), or ``r - mean`` with
  ``scale=False`` (Dr. GRPO). Computed once from the whole rollout and recorded with it.
* **Per-token loss** (``token_loss``): with ``ratio = exp(logp - old_logp)`` against the
  behaviour policy's log-probs, ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``
  (PPO's pessimistic clipped surrogate; ``clip_high > clip_low`` is DAPO's "clip higher"), plus
  ``kl_coef * k3`` where ``k3 = exp(ref - logp) - (ref - logp) - 1`` (Schulman's unbiased,
  non-negative estimator of KL(policy || reference) from the sampled tokens; 0 when equal).
  Masked positions contribute exactly 0 and no gradient (their log-probs are replaced by 0
  before any arithmetic, so a padding position's garbage, even NaN or -inf, never leaks).
* **Aggregation** (``aggregate``), with a normaliser fixed by the *whole step's* batch
  (``loss_norm``), never by a micro-shard's own content:
  ``token`` (default): ``sum_{i,t} loss_it m_it / T`` with ``T`` the step's learned tokens;
  ``sequence``: ``sum_i (sum_t loss_it m_it / len_i) / N`` with ``N`` the step's samples and
  ``len_i`` sample ``i``'s own learned tokens (a property of the sample, not of its shard).

**Why token-level is the default.** Every learned token weighs the same, whatever the length
of the response it is in: with a per-sequence mean a token of a 1000-token response weighs a
hundredth of one in a 10-token response, so long wrong answers are penalised too little and
long right ones rewarded too little (the length bias DAPO and Dr. GRPO point out). It is also
the normalisation of ftkit's REINFORCE loss (``loss.pg_loss``), so GRPO at ratio 1 without KL
has exactly REINFORCE's gradient. ``sequence`` is the original GRPO paper's choice.

**Membership invariance.** Both aggregations are a sum over samples of terms that depend only
on the sample and on the step-wide normaliser, so a micro-shard's loss is a function of its
own samples and the step: a micro-shard has the same loss and gradient bits whichever cell
computes it and whatever else that cell holds, and the micro-shard terms add up to the step's
loss. (Normalising by a micro-shard's own token count would weigh samples by who shares their
shard.) Micro-shard gradients are summed exactly by ``reducer.ExactReducer``; ``sum_losses``
adds micro-shard loss values exactly (``math.fsum``), in any order.

Heavy imports (torch) stay inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

from ftkit.errors import ConfigError

Aggregation = Literal["token", "sequence"]
AGGREGATIONS: tuple[Aggregation, ...] = ("token", "sequence")
_EPS = 1e-6


@dataclass(frozen=True)
class GrpoConfig:
    """The objective's settings; defaults: PPO's symmetric 0.2 clip, no KL, token-level."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    aggregation: Aggregation = "token"

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise ConfigError(f"clip_low must be in [0, 1), not {self.clip_low}", hint="the PPO default is 0.2")
        if not 0.0 <= self.clip_high < math.inf:
            raise ConfigError(f"clip_high must be finite and >= 0, not {self.clip_high}", hint="PPO 0.2, DAPO 0.28")
        if not 0.0 <= self.kl_coef < math.inf:
            raise ConfigError(f"kl_coef must be finite and >= 0, not {self.kl_coef}", hint="0 disables the KL term")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"unknown aggregation {self.aggregation!r}", hint=f"one of: {', '.join(AGGREGATIONS)}")


def group_advantages(rewards: Tensor, group_size: int, scale: bool = True) -> Tensor:
    """float32 ``[n]``: per group of ``group_size`` consecutive samples, ``r - mean`` divided by
    ``std + 1e-6`` (population std) when ``scale``; float64 inside; zero for an equal group."""
    import torch

    n = rewards.shape[0]
    if group_size < 2 or n % group_size:
        raise ConfigError(
            f"{n} rewards cannot be cut into groups of {group_size}", hint="GRPO needs groups of 2 or more"
        )
    r = rewards.to(torch.float64).reshape(n // group_size, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        std = r.std(dim=1, unbiased=False, keepdim=True)
        centred = torch.where(std > 0, centred / (std + _EPS), torch.zeros_like(r))
    return centred.reshape(n).to(torch.float32)


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """The k3 estimate ``exp(d) - d - 1`` with ``d = ref - logp``, per token (>= 0; 0 iff equal)."""
    d = ref_logprobs - logprobs
    return d.exp() - d - 1.0


@dataclass(frozen=True)
class TokenTerms:
    """Per-token pieces of the objective (all ``[n, s]``, 0 on masked positions)."""

    loss: Any
    ratio: Any
    clipped: Any
    kl: Any


def token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GrpoConfig,
    ref_logprobs: Tensor | None = None,
) -> TokenTerms:
    """The per-token GRPO loss and its parts; ``ref_logprobs`` is needed when ``cfg.kl_coef > 0``."""
    import torch

    keep = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(keep, logprobs, zero)  # masked positions: 0 value, 0 gradient, no NaN
    ratio = (logprobs - torch.where(keep, old_logprobs.detach(), zero)).exp()
    adv = advantages.to(logprobs.dtype)[:, None]
    bounded = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    surrogate = torch.minimum(ratio * adv, bounded * adv)
    loss = -surrogate
    kl = torch.zeros_like(loss)
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's log-probs")
        kl = k3(logprobs, torch.where(keep, ref_logprobs.detach(), zero))
        loss = loss + cfg.kl_coef * kl
    clipped = keep & (bounded * adv < ratio * adv)
    return TokenTerms(
        torch.where(keep, loss, zero), torch.where(keep, ratio, zero), clipped, torch.where(keep, kl, zero)
    )


def loss_norm(step_mask: Tensor, aggregation: Aggregation = "token") -> float:
    """The normaliser of a step, from the mask of its *whole* batch: learned tokens (``token``)
    or samples (``sequence``), at least 1 (an empty step has loss 0)."""
    if aggregation == "token":
        return max(1.0, float(step_mask.double().sum()))
    return float(max(1, step_mask.shape[0]))


def aggregate(token_losses: Tensor, mask: Tensor, norm: float, aggregation: Aggregation = "token") -> Tensor:
    """Scalar loss of a micro-shard (``token_losses`` 0 where masked) under the step's ``norm``."""
    if aggregation == "token":
        return token_losses.sum() / norm
    lengths = mask.to(token_losses.dtype).sum(dim=1).clamp(min=1.0)
    return (token_losses.sum(dim=1) / lengths).sum() / norm


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    norm: float,
    cfg: GrpoConfig | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Any, TokenTerms]:
    """A micro-shard's scalar GRPO loss (``norm`` from ``loss_norm`` of its step) and its terms."""
    cfg = cfg or GrpoConfig()
    terms = token_loss(logprobs, old_logprobs, advantages, mask, cfg, ref_logprobs)
    return aggregate(terms.loss, mask, norm, cfg.aggregation), terms


def sum_losses(shard_losses: Iterable[float]) -> float:
    """The step's loss from its micro-shards' loss values: exactly rounded, so any order of the
    micro-shards gives the same float."""
    return math.fsum(float(x) for x in shard_losses)
