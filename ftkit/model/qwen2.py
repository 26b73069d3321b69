"""The Qwen2 family (``Qwen2ForCausalLM``): Llama plus a bias on the q, k and v projections
(none on the output projection or the MLP). A sliding window (``use_sliding_window``) is refused."""

from __future__ import annotations

from typing import Any

from ftkit.model.hf_config import ConfigReader, HFArch
from ftkit.model.llama import parse_common

NAME = "qwen2"
ARCHITECTURES = ("Qwen2ForCausalLM",)


def parse(config: dict[str, Any], architecture: str = ARCHITECTURES[0]) -> HFArch:
    """The ``HFArch`` of a Qwen2 config (``ModelConfigError`` naming the first unmappable field)."""
    r = ConfigReader(config, NAME)
    r.require("use_sliding_window", (False,), False)
    r.used.add("sliding_window")  # only read by transformers when use_sliding_window is true
    arch = parse_common(r, architecture, qkv_bias=True)
    r.finish()
    return arch
