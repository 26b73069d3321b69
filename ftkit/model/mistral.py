"""The Mistral family (``MistralForCausalLM``): Llama's arithmetic with an optional sliding
window. ftkit's attention is fully causal, which equals sliding-window attention exactly for
sequences no longer than the window, so the model's maximum sequence length becomes
``min(max_position_embeddings, sliding_window)`` (longer sequences are refused, not computed
differently)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ftkit.model.hf_config import ConfigReader, HFArch
from ftkit.model.llama import parse_common

NAME = "mistral"
ARCHITECTURES = ("MistralForCausalLM",)


def parse(config: dict[str, Any], architecture: str = ARCHITECTURES[0]) -> HFArch:
    """The ``HFArch`` of a Mistral config (``ModelConfigError`` naming the first unmappable field)."""
    r = ConfigReader(config, NAME)
    window = r.get("sliding_window", int, None)
    if window is not None and window <= 0:
        raise r.bad("sliding_window", "must be a positive number of tokens")
    arch = parse_common(r, architecture)
    r.finish()
    return replace(arch, max_seq_len=min(arch.max_seq_len, window)) if window else arch
