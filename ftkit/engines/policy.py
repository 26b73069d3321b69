"""The policy's log-probs and the attention mask of left-padded rows: one formulation for the
engines and the trainer.

The policy of ``ftkit train`` is the model's distribution restricted to the task's response
tokens (``RlTask.response_tokens``): engines sample from it, so its log-prob of a token is
``token_logprobs`` (``log_softmax`` of the float32 logits) applied to the logits *of those
tokens*, at the token's position among them. The megatron engine (``ftkit.engines.megatron``)
and the trainer (``ftkit.train.rank.compute``) both go through here on the same float32 logits,
so where the logits are bitwise equal (the same model at TP=1, row-independent kernels) the
log-probs are too, and any difference is evidence (``logprob_check``, rule FT114).

**Sampling controls and the log-prob convention** (``--temperature``, ``--top-p``,
``--top-k``; docs/rl.md, "Sampling"). The policy at temperature ``T`` is ``softmax(logits / T)``
over the response tokens: the engines sample from it, the trainer scores it, and both divide the
float32 logits by ``T`` the same way (``scaled``), so the megatron engine's log-probs stay the
trainer's bit for bit. ``T`` 0 is greedy: its log-probs are of the ``T`` 1 distribution (as
vLLM's). Top-k and top-p (``truncate``) narrow only what is *sampled*: the log-probs, the
engine's and the trainer's, are of the temperature-scaled distribution **before** truncation (the
convention of TRL and verl: truncation is part of how samples are drawn, not of the policy that
is optimised; a truncated token's log-prob is the untruncated one, never -inf), so the GRPO
ratio, the KL to the reference and the entropy never see a renormalised distribution whose
support depends on the logits.

``padding_mask`` is the attention mask both give megatron-core for rows whose prompts are
left-padded (what ``ftkit.model.attention.SDPAttention`` reads): a bool ``[n, 1, S, S]`` tensor,
``True`` where query ``q`` must not attend to key ``k``; the causal mask plus: no query attends to
a pad key of its row, except a pad query to itself (a row of the softmax needs one visible key;
a pad's output is never learned or scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def scaled(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``float32(logits) / temperature``; temperature 1 and 0 (greedy) leave them as they are."""
    logits = logits.float()
    return logits if temperature in (0.0, 1.0) else logits / temperature


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 ``[..., s]``: ``log_softmax(scaled(logits))`` gathered at ``targets`` ``[..., s]``."""
    return _gathered(scaled(logits, temperature).log_softmax(dim=-1), targets)


def _gathered(logp: Tensor, targets: Tensor) -> Tensor:
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _next_token(logp: Tensor, tokens: Tensor) -> Tensor:
    """``logp`` (``[n, s, V]`` log-probs, or ``[n, w, V]`` of the positions that predict the last
    ``w`` tokens: ``ftkit.model.output_positions.scored``) at the next tokens, ``[n, s]``:
    position ``t`` at ``tokens[t+1]``; the last position, and those without log-probs, 0."""
    import torch

    from ftkit.model.output_positions import widen

    w = logp.shape[1]
    if w < tokens.shape[1]:
        return widen(_gathered(logp, tokens[:, tokens.shape[1] - w :]), tokens.shape[1])
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    out = _gathered(logp, targets)
    return torch.cat([out[:, :-1], torch.zeros_like(out[:, -1:])], dim=1)


def next_token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 ``[n, s]``: position ``t`` holds ``log p(tokens[t+1] | tokens[<=t])`` from
    ``scaled(logits[:, t])``; the last position (no next token) is 0. ``logits`` may hold the
    positions that predict the last ``w`` tokens only (``[n, w, V]``): the others are 0 then."""
    return _next_token(scaled(logits, temperature).log_softmax(dim=-1), tokens)


def allowed_index(allowed: Sequence[int], vocab_size: int) -> Tensor:
    """int64 ``[vocab_size]``: the position of each token in ``allowed``; 0 for other tokens
    (they are never learned: their positions are masked)."""
    import torch

    index = torch.zeros(vocab_size, dtype=torch.int64)
    index[torch.tensor(list(allowed), dtype=torch.int64)] = torch.arange(len(allowed), dtype=torch.int64)
    return index


def sampled_logprobs(logits: Tensor, allowed: Tensor, picks: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 ``[k]``: an engine's log-prob of the tokens it picked (``picks``: positions in
    ``allowed``, ``[k]``) from the logits ``[k, V]`` it sampled them from (the convention of
    the module docstring)."""
    return token_logprobs(logits[:, allowed], picks, temperature)


def policy_logprobs(logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 ``[b, s]``: position ``t`` holds the policy's log-prob (at ``temperature``) of
    ``tokens[:, t+1]`` from ``logits[:, t]`` (``[b, s, V]``, or ``[b, w, V]`` of the positions that
    predict the last ``w`` tokens: ``next_token_logprobs``); the last position is 0."""
    return next_token_logprobs(logits[..., allowed.to(logits.device)], index.to(tokens.device)[tokens], temperature)


def policy_logprobs_entropy(
    logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor, at: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``policy_logprobs`` (the same operations, so the same bits) and, without gradient, the
    policy's entropy ``-sum p log p`` (float32 ``[k]``) at the ``k`` positions where the bool
    ``at`` ``[b, s]`` is true, from the same log-softmax (no second pass over the vocabulary)."""
    import torch

    logp = scaled(logits[..., allowed.to(logits.device)], temperature).log_softmax(dim=-1)
    with torch.no_grad():
        w = logp.shape[1]  # the positions with logits: every one, or those predicting the last w tokens
        at = at if w == at.shape[1] else at[:, at.shape[1] - 1 - w : at.shape[1] - 1]
        kept = logp.detach()[at.to(logp.device)]
        entropy = kept.exp().mul_(kept).sum(dim=-1).neg_()
    return _next_token(logp, index.to(tokens.device)[tokens]), entropy


def truncate(probs: Tensor, top_p: float = 1.0, top_k: int = 0) -> Tensor:
    """``probs`` (``[k, n]``, each row a distribution) with the tokens top-k and top-p leave out
    set to 0 (not renormalised: the caller samples by the cumulative sum). Top-k keeps every
    token whose probability is at least the ``top_k``-th largest (ties kept; 0: off); top-p keeps
    the most likely tokens, in order (ties by position), while the mass *before* a token is below
    ``top_p`` of what top-k kept (1: off): the smallest head whose mass reaches ``top_p``, never
    empty. vLLM's rules (top-k first, top-p over the renormalised rest)."""
    import torch

    keep = torch.ones_like(probs, dtype=torch.bool)
    if 0 < top_k < probs.shape[-1]:
        keep &= probs >= probs.topk(top_k, dim=-1).values[:, -1:]
    if top_p < 1.0:
        order = torch.sort(torch.where(keep, probs, 0.0), dim=-1, descending=True, stable=True)
        before = order.values.cumsum(dim=-1) - order.values
        inside = before < top_p * order.values.sum(dim=-1, keepdim=True)  # of what top-k kept
        head = torch.zeros_like(keep).scatter_(-1, order.indices, inside)
        keep &= head
    return torch.where(keep, probs, 0.0)


def padding_mask(pads: Tensor, seq_len: int) -> Tensor:
    """``[n, 1, S, S]`` bool, ``True`` = masked, for rows with ``pads[i]`` left pads (module docstring)."""
    import torch

    at = torch.arange(seq_len)
    future = at[None, :] > at[:, None]  # [q, k]: k after q
    pad_key = at[None, None, :] < pads[:, None, None]  # [n, 1 (q), k]
    itself = at[:, None] == at[None, :]
    return (future[None] | (pad_key & ~itself[None]))[:, None]
