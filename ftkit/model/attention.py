"""A CPU-capable core attention for megatron-core layer specs.

megatron-core's local ``DotProductAttention`` forks the CUDA RNG tracker for its dropout
and allocates through the global memory buffer, neither of which works on a CPU-only
process. ``SDPAttention`` has the same constructor and ``forward`` signature and computes
causal attention with ``torch.nn.functional.scaled_dot_product_attention``; an
``attention_mask`` (megatron's convention: bool, broadcastable to ``[b, 1, s, s]``, ``True`` where a
query must not attend to a key) replaces the causal mask and must include it (callers pass one
for left-padded prompts: ``ftkit.train.rl.masks``). Fewer queries than keys (a key-value cache's
decoding step: megatron's static inference context hands the cached keys over) are the last
queries of the sequence: without a mask, each attends to every key up to its own position. Attention
dropout is not supported (every ftkit preset has it off), so the module consumes no random
numbers and its output depends on its inputs only.

This module imports torch and megatron at import time (it subclasses ``MegatronModule``); only
``ftkit.model.gpt.layer_spec`` imports it, lazily.

Layout (megatron's): query/key/value ``[s, b, heads_per_partition, head_dim]``; the result
is ``[s, b, heads_per_partition * head_dim]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Causal core attention through ``scaled_dot_product_attention`` (drop-in for the local spec)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError("SDPAttention does not support attention dropout (set attention_dropout=0)")
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPAttention supports causal attention only, not {attn_mask_type}")
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.groups_per_partition = divide(config.num_query_groups, tp_size)
        self.head_dim = config.kv_channels
        self.softmax_scale = (1.0 / math.sqrt(self.head_dim)) if softmax_scale is None else softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Causal attention, or attention under ``attention_mask`` when given (module docstring)."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention supports neither packed sequences nor attention bias")
        rep = self.heads_per_partition // self.groups_per_partition
        if rep > 1:
            key = key.repeat_interleave(rep, dim=2)
            value = value.repeat_interleave(rep, dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        sq, sk = q.shape[2], k.shape[2]
        if attention_mask is None and sq == sk:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        else:
            if attention_mask is None:  # queries are the last `sq` of `sk` positions (a key-value cache)
                allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
            else:
                allowed = ~attention_mask.to(device=q.device, dtype=torch.bool)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.softmax_scale)
        # [b, n, s, d] -> [s, b, n * d]
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, self.heads_per_partition * self.head_dim)
