"""The policy's log-probs and the attention mask of left-padded rows: one formulation for the
engines and the trainer.

The policy of ``ftkit train`` is the model's distribution restricted to the task's response
tokens (``RlTask.response_tokens``): engines sample from it, so its log-prob of a token is
``token_logprobs`` (``log_softmax`` of the float32 logits) applied to the logits *of those
tokens*, at the token's position among them. The megatron engine (``ftkit.engines.megatron``)
and the trainer (``ftkit.train.rank.compute``) both go through here on the same float32 logits,
so where the logits are bitwise equal (the same model at TP=1, row-independent kernels) the
log-probs are too, and any difference is evidence (``logprob_check``, rule FT114).

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


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """float32 ``[..., s]``: ``log_softmax(float32(logits))`` gathered at ``targets`` ``[..., s]``."""
    return _gathered(logits.float().log_softmax(dim=-1), targets)


def _gathered(logp: Tensor, targets: Tensor) -> Tensor:
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _next_token(logp: Tensor, tokens: Tensor) -> Tensor:
    """``logp`` (``[n, s, V]`` log-probs) at the next tokens: position ``t`` at ``tokens[t+1]``, the last 0."""
    import torch

    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    out = _gathered(logp, targets)
    return torch.cat([out[:, :-1], torch.zeros_like(out[:, -1:])], dim=1)


def next_token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """float32 ``[n, s]``: position ``t`` holds ``log p(tokens[t+1] | tokens[<=t])`` from
    ``logits[:, t]``; the last position (no next token) is 0."""
    return _next_token(logits.float().log_softmax(dim=-1), tokens)


def allowed_index(allowed: Sequence[int], vocab_size: int) -> Tensor:
    """int64 ``[vocab_size]``: the position of each token in ``allowed``; 0 for other tokens
    (they are never learned: their positions are masked)."""
    import torch

    index = torch.zeros(vocab_size, dtype=torch.int64)
    index[torch.tensor(list(allowed), dtype=torch.int64)] = torch.arange(len(allowed), dtype=torch.int64)
    return index


def sampled_logprobs(logits: Tensor, allowed: Tensor, picks: Tensor) -> Tensor:
    """float32 ``[k]``: an engine's log-prob of the tokens it picked (``picks``: positions in
    ``allowed``, ``[k]``) from the logits ``[k, V]`` it sampled them from."""
    return token_logprobs(logits[:, allowed], picks)


def policy_logprobs(logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor) -> Tensor:
    """float32 ``[b, s]``: position ``t`` holds the policy's log-prob of ``tokens[:, t+1]``
    from ``logits[:, t]`` (``[b, s, V]``); the last position is 0."""
    return next_token_logprobs(logits[..., allowed.to(logits.device)], index.to(tokens.device)[tokens])


def policy_logprobs_entropy(
    logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor, at: Tensor
) -> tuple[Tensor, Tensor]:
    """``policy_logprobs`` (the same operations, so the same bits) and, without gradient, the
    policy's entropy ``-sum p log p`` (float32 ``[k]``) at the ``k`` positions where the bool
    ``at`` ``[b, s]`` is true, from the same log-softmax (no second pass over the vocabulary)."""
    import torch

    logp = logits[..., allowed.to(logits.device)].float().log_softmax(dim=-1)
    with torch.no_grad():
        kept = logp.detach()[at.to(logp.device)]
        entropy = kept.exp().mul_(kept).sum(dim=-1).neg_()
    return _next_token(logp, index.to(tokens.device)[tokens]), entropy


def padding_mask(pads: Tensor, seq_len: int) -> Tensor:
    """``[n, 1, S, S]`` bool, ``True`` = masked, for rows with ``pads[i]`` left pads (module docstring)."""
    import torch

    at = torch.arange(seq_len)
    future = at[None, :] > at[:, None]  # [q, k]: k after q
    pad_key = at[None, None, :] < pads[:, None, None]  # [n, 1 (q), k]
    itself = at[:, None] == at[None, :]
    return (future[None] | (pad_key & ~itself[None]))[:, None]
