"""The Qwen3 family (``Qwen3ForCausalLM``): Llama plus an RMSNorm over each query and key head
(``q_norm`` / ``k_norm``, megatron's ``qk_layernorm``) before RoPE; an explicit ``head_dim``.
``attention_bias`` and a sliding window are refused."""

from __future__ import annotations

from typing import Any

from ftkit.model.hf_config import ConfigReader, HFArch
from ftkit.model.llama import parse_common

NAME = "qwen3"
ARCHITECTURES = ("Qwen3ForCausalLM",)


def parse(config: dict[str, Any], architecture: str = ARCHITECTURES[0]) -> HFArch:
    """The ``HFArch`` of a Qwen3 config (``ModelConfigError`` naming the first unmappable field)."""
    r = ConfigReader(config, NAME)
    r.require("use_sliding_window", (False,), False)
    r.used.add("sliding_window")  # only read by transformers when use_sliding_window is true
    arch = parse_common(r, architecture, qk_norm=True)
    r.finish()
    return arch
