"""Hugging Face config.json -> HFArch, and the fields ftkit refuses (exit 2, named)."""

from __future__ import annotations

from typing import Any

import pytest

from ftkit.model.families import arch_for
from ftkit.model.hf_config import ModelConfigError

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "pretraining_tp": 1,
    "bos_token_id": 1,
}


def test_llama_fields_map() -> None:
    a = arch_for({**BASE, "rope_theta": 500000.0})
    assert (a.family, a.head_dim, a.num_kv_heads, a.tied, a.dtype) == ("llama", 32, 2, True, "bfloat16")
    assert (a.rope_theta, a.rope_scaling_factor, a.norm_eps, a.qkv_bias, a.qk_norm) == (
        500000.0,
        None,
        1e-5,
        False,
        False,
    )
    assert a.padded_vocab == 1024
    assert arch_for({**BASE, "vocab_size": 1025}).padded_vocab == 2048
    for vocab, padded in ((32000, 32768), (151936, 152576), (128256, 129024), (49152, 49152)):
        arch = arch_for({**BASE, "vocab_size": vocab, "num_key_value_heads": 8})  # Llama-2, Qwen2/3, Llama-3, SmolLM2
        assert arch.padded_vocab == padded
        for tp in (1, 2, 4, 8):  # the same rows at every power-of-two TP
            arch.check_layout(tp, 1)


def test_family_switches() -> None:
    assert arch_for({**BASE, "architectures": ["Qwen2ForCausalLM"]}).qkv_bias
    q3 = arch_for({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 64})
    assert q3.qk_norm and q3.head_dim == 64
    mistral = arch_for({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 128})
    assert mistral.max_seq_len == 128


def test_llama3_rope_scaling_both_spellings() -> None:
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    assert arch_for({**BASE, "rope_theta": 5e5, "rope_scaling": scaling}).rope_scaling_factor == 32.0
    a = arch_for({**BASE, "rope_parameters": {**scaling, "rope_theta": 5e5}})
    assert (a.rope_theta, a.rope_scaling_factor) == (5e5, 32.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 2.0}}, "rope_scaling"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"pretraining_tp": 2}, "pretraining_tp"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True}, "use_sliding_window"),
        ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_unrepresentable_fields_are_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelConfigError, match=field) as info:
        arch_for({**BASE, **change})
    assert info.value.exit_code == 2 and info.value.hint


def test_layout_must_split() -> None:
    a = arch_for(BASE)
    a.check_layout(2, 3)
    with pytest.raises(ModelConfigError, match="num_key_value_heads=2 does not split over TP=4"):
        a.check_layout(4, 1)
    odd = arch_for(
        {**BASE, "num_attention_heads": 6, "num_key_value_heads": 6, "hidden_size": 192, "intermediate_size": 384}
    )
    with pytest.raises(ModelConfigError, match=r"vocab_size=1000 \(padded to 1024 rows\) does not split over TP=3"):
        odd.check_layout(3, 1)
