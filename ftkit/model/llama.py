"""The Llama family (``LlamaForCausalLM``): the base every Hugging Face family here extends.

``parse(config)`` maps a Llama ``config.json`` to an ``HFArch``: grouped-query attention,
RMSNorm with ``rms_norm_eps``, SwiGLU (``hidden_act`` silu), RoPE with ``rope_theta`` and
optionally Llama-3 scaling, tied or untied embeddings, no biases. Anything else that would change
the arithmetic (``attention_bias``, ``mlp_bias``, ``pretraining_tp`` != 1, other activations,
sliding windows) is a ``ModelConfigError`` naming the field. Other families call
``parse_common`` with their own switches (``qkv_bias``, ``qk_norm``).
"""

from __future__ import annotations

from typing import Any

from ftkit.model.hf_config import ConfigReader, HFArch

NAME = "llama"
ARCHITECTURES = ("LlamaForCausalLM",)


def parse_common(r: ConfigReader, architecture: str, *, qkv_bias: bool = False, qk_norm: bool = False) -> HFArch:
    """The fields every family shares, read through ``r`` (which is then ``finish``-ed)."""
    hidden = r.get("hidden_size", int)
    heads = r.get("num_attention_heads", int)
    kv = r.get("num_key_value_heads", int, heads)
    if kv <= 0 or heads % kv:
        raise r.bad("num_key_value_heads", f"must divide num_attention_heads={heads}")
    head_dim = r.get("head_dim", int, hidden // heads)
    r.require("hidden_act", ("silu",), "silu")
    r.require("pretraining_tp", (1,), 1)
    r.require("attention_dropout", (0, 0.0), 0.0)
    r.require("mlp_bias", (False,), False)
    if not qkv_bias:
        r.require("attention_bias", (False,), False)
    layers = r.get("num_hidden_layers", int)
    types = r.get("layer_types", list, None)
    if types is not None and (len(types) != layers or set(types) - {"full_attention"}):
        raise r.bad("layer_types", "every layer must be 'full_attention'")
    theta, factor = r.rope()
    arch = HFArch(
        family=r.family,
        architecture=architecture,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden_size=r.get("intermediate_size", int),
        vocab_size=r.get("vocab_size", int),
        max_seq_len=r.get("max_position_embeddings", int),
        tied=r.get("tie_word_embeddings", bool, False),
        rope_theta=theta,
        rope_scaling_factor=factor,
        norm_eps=float(r.get("rms_norm_eps", (int, float))),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        dtype=r.dtype(),
    )
    return arch


def parse(config: dict[str, Any], architecture: str = ARCHITECTURES[0]) -> HFArch:
    """The ``HFArch`` of a Llama config (``ModelConfigError`` naming the first unmappable field)."""
    r = ConfigReader(config, NAME)
    arch = parse_common(r, architecture)
    r.finish()
    return arch
