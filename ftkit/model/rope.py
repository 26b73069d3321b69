"""RoPE on CPU: megatron-core's ``RotaryEmbedding`` moves its frequencies to CUDA on the first
forward, whatever the device. ``cpu_rotary(model)`` re-classes a built ``GPTModel``'s rotary
embedding as ``CPURotaryEmbedding``, whose ``get_emb`` keeps the frequencies on the device they
were made on and is otherwise megatron's (non-interleaved: ``cat(freqs, freqs)``, the layout of
Hugging Face's ``rotate_half``). The values are the same bits megatron computes on CUDA's path
before the move. Imports megatron at import time; only ``hf_build`` imports it, lazily.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding


class CPURotaryEmbedding(RotaryEmbedding):
    """``RotaryEmbedding`` whose frequencies stay where they are (see the module docstring)."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if self.rotary_interleaved:
            raise ValueError("CPURotaryEmbedding supports the non-interleaved layout only")
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


def cpu_rotary(model: Any) -> None:
    """Make ``model.rotary_pos_emb`` (when it is megatron's ``RotaryEmbedding``) CPU-capable."""
    rope = getattr(model, "rotary_pos_emb", None)
    if type(rope) is RotaryEmbedding:
        rope.__class__ = CPURotaryEmbedding
