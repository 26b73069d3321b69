"""The policy's log-probs, one formulation for the engines and the trainer.

The policy of ``ftkit train`` is the model's distribution restricted to the task's response
tokens (``AdditionTask.response_tokens``): engines sample from it, so its log-prob of a token
is ``log_softmax`` of the float32 logits *over those tokens*, at the token. Both sides call
``response_logprobs`` on the same float32 logits, so where the logits are bitwise equal (the
megatron engine and a TP=1 trainer: same model, row-independent kernels) the log-probs are
too, and any difference is evidence (``ftkit.train.rl.logprob_check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def response_logprobs(logits: Tensor, allowed: Tensor) -> Any:
    """float32 ``[..., A]``: ``log_softmax`` of ``float32(logits[..., allowed])``."""
    return logits[..., allowed].float().log_softmax(dim=-1)


def allowed_index(allowed: Sequence[int], vocab_size: int) -> Any:
    """int64 ``[vocab_size]``: the position of each token in ``allowed``; 0 for other tokens
    (they are never learned: their positions are masked)."""
    import torch

    index = torch.zeros(vocab_size, dtype=torch.int64)
    index[torch.tensor(list(allowed), dtype=torch.int64)] = torch.arange(len(allowed), dtype=torch.int64)
    return index


def next_token_logprobs(logits: Tensor, tokens: Tensor, allowed: Tensor, index: Tensor) -> Any:
    """float32 ``[b, s]``: position ``t`` holds the policy's log-prob of ``tokens[:, t+1]``
    from ``logits[:, t]`` (``[b, s, V]``); the last position, with no next token, holds the
    log-prob of the first allowed token (masked: never learned)."""
    import torch

    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    picks = index.to(tokens.device)[targets]
    return response_logprobs(logits, allowed.to(logits.device)).gather(-1, picks.unsqueeze(-1)).squeeze(-1)
