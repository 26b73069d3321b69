"""A key-value cache for sampling from a megatron-core ``GPTModel``, on CPU and CUDA alike.

Sampling a token at a time by running the model over every token so far recomputes the prefix
for every new token (for a 6-token prompt and 8 sampled tokens, 5.8x the decoder work of a
cache). ``DecodeCache`` keeps each layer's keys and values instead, in megatron-core's own
static inference context (``StaticInferenceContext``: the keys before RoPE, the values, one
``[max_len, batch, groups, head_dim]`` buffer each per layer).

Contract:

* ``DecodeCache(model, batch, max_len)``: a cache for one batch of ``batch`` rows of at most
  ``max_len`` tokens through ``model`` (a TP=1, PP=1 ``GPTModel`` in eval mode; its core
  attention ``ftkit.model.attention.SDPAttention`` or megatron's). megatron-core allocates
  the buffers with ``torch.cuda.current_device()`` whatever the model's device; the model's
  attention modules are given an allocation on the device of their own parameters (an
  instance attribute, idempotent), so the same code runs on CPU.
* ``next_logits(tokens, positions, mask)``: feed the next positions of every row (``[batch,
  t]``: the prompt at the first call, then one token a call) and get the logits at the last
  one, ``[batch, 1, V]``. ``mask`` is megatron's attention mask for the fed queries against
  every key so far (``[batch, 1, t, offset + t]``, ``True`` where a query must not attend), or
  ``None`` (causal). Call under ``torch.no_grad()``.

The logits equal the uncached forward's up to float rounding (the matrix shapes differ: one
query row against the cached keys), not bitwise: callers whose bits must match another
computation's re-score in that computation's shapes (``ftkit.engines.megatron``).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


class DecodeCache:
    """Keys and values of one batch's tokens so far (module contract)."""

    def __init__(self, model: Any, batch: int, max_len: int) -> None:
        from megatron.core.inference.contexts import StaticInferenceContext
        from megatron.core.transformer.attention import Attention

        for module in model.modules():
            if isinstance(module, Attention):
                module._allocate_memory = types.MethodType(_allocate_beside_keys, module)
        self.model = model
        self.context = StaticInferenceContext(batch, max_len)

    def next_logits(self, tokens: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        """Logits ``[batch, 1, V]`` at the last of the fed positions (module contract)."""
        ctx = self.context
        if ctx.sequence_len_offset + tokens.shape[1] > ctx.max_sequence_length:
            have, room = ctx.sequence_len_offset, ctx.max_sequence_length
            raise ValueError(f"{have} + {tokens.shape[1]} tokens exceed the cache's {room}")
        logits = self.model(tokens, positions, mask, inference_context=ctx, runtime_gather_output=True)
        ctx.sequence_len_offset += tokens.shape[1]
        ctx.enable_decode_mode()
        return logits


def _allocate_beside_keys(self: Any, max_len: int, batch: int, dim: int, dtype: Any) -> Tensor:
    """megatron-core's ``Attention._allocate_memory`` on the device the model computes on."""
    import torch

    device = next(self.parameters()).device
    return torch.empty(max_len, batch, self.num_query_groups_per_partition, dim, dtype=dtype, device=device)
