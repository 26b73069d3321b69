"""The policy's log-probs, one formulation for the engines and the trainer.

The policy of ``ftkit train`` is the model's distribution restricted to the task's response
tokens (``AdditionTask.response_tokens``): engines sample from it, so its log-prob of a token
is ``ftkit.train.rl.grpo.token_logprobs`` (``log_softmax`` of the float32 logits) applied to
the logits *of those tokens*, at the token's position among them. The engines and the trainer
both go through here on the same float32 logits, so where the logits are bitwise equal (the
megatron engine and a TP=1 trainer: the same model, row-independent kernels) the log-probs
are too, and any difference is evidence (``logprob_check``, rule FT114).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ftkit.train.rl.grpo import next_token_logprobs, token_logprobs

if TYPE_CHECKING:
    from torch import Tensor


def allowed_index(allowed: Sequence[int], vocab_size: int) -> Any:
    """int64 ``[vocab_size]``: the position of each token in ``allowed``; 0 for other tokens
    (they are never learned: their positions are masked)."""
    import torch

    index = torch.zeros(vocab_size, dtype=torch.int64)
    index[torch.tensor(list(allowed), dtype=torch.int64)] = torch.arange(len(allowed), dtype=torch.int64)
    return index


def sampled_logprobs(logits: Tensor, allowed: Tensor, picks: Tensor) -> Any:
    """float32 ``[k]``: an engine's log-prob of the tokens it picked (``picks``: positions in
    ``allowed``, ``[k]``) from the logits ``[k, V]`` it sampled them from."""
    return token_logprobs(logits[:, allowed], picks)


def policy_logprobs(logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor) -> Any:
    """float32 ``[b, s]``: position ``t`` holds the policy's log-prob of ``tokens[:, t+1]``
    from ``logits[:, t]`` (``[b, s, V]``); the last position is 0."""
    return next_token_logprobs(logits[..., allowed.to(logits.device)], index.to(tokens.device)[tokens])
