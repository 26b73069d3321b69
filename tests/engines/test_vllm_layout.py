"""layout.to_hf: vLLM's fused, TP-sharded Llama tensors map back to the Hugging Face ones bitwise."""

import pytest
import torch

from ftkit.engines.layout import LayoutError, LlamaShape, to_hf

SHAPE = LlamaShape(num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=100)
HIDDEN, INTER, PADDED = 32, 48, 128


def _hf() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g).to(torch.bfloat16)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": r(SHAPE.vocab_size, HIDDEN),
        p + "self_attn.q_proj.weight": r(4 * 8, HIDDEN),
        p + "self_attn.k_proj.weight": r(2 * 8, HIDDEN),
        p + "self_attn.v_proj.weight": r(2 * 8, HIDDEN),
        p + "self_attn.o_proj.weight": r(HIDDEN, 4 * 8),
        p + "mlp.gate_proj.weight": r(INTER, HIDDEN),
        p + "mlp.up_proj.weight": r(INTER, HIDDEN),
        p + "mlp.down_proj.weight": r(HIDDEN, INTER),
        p + "input_layernorm.weight": r(HIDDEN),
        "model.norm.weight": r(HIDDEN),
        "lm_head.weight": r(SHAPE.vocab_size, HIDDEN),
    }


def _vllm_shards(hf: dict[str, torch.Tensor], tp: int) -> list[dict[str, torch.Tensor]]:
    """What vLLM's loaders put on each TP rank (written from vLLM's sharding rules)."""
    p = "model.layers.0."
    kv_per_rank = max(1, SHAPE.num_kv_heads // tp)
    shards = []
    for r in range(tp):
        kv_head = r * SHAPE.num_kv_heads // tp if tp > SHAPE.num_kv_heads else r * kv_per_rank
        kv = slice(kv_head * 8, (kv_head + kv_per_rank) * 8)
        q = hf[p + "self_attn.q_proj.weight"].chunk(tp)[r]
        vocab = []
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            padded = torch.cat([hf[name], torch.zeros(PADDED - SHAPE.vocab_size, HIDDEN, dtype=torch.bfloat16)])
            vocab.append(padded.chunk(tp)[r])
        shards.append(
            {
                "model.embed_tokens.weight": vocab[0],
                p + "self_attn.qkv_proj.weight": torch.cat(
                    [q, hf[p + "self_attn.k_proj.weight"][kv], hf[p + "self_attn.v_proj.weight"][kv]]
                ),
                p + "self_attn.o_proj.weight": hf[p + "self_attn.o_proj.weight"].chunk(tp, 1)[r],
                p + "mlp.gate_up_proj.weight": torch.cat(
                    [hf[p + "mlp.gate_proj.weight"].chunk(tp)[r], hf[p + "mlp.up_proj.weight"].chunk(tp)[r]]
                ),
                p + "mlp.down_proj.weight": hf[p + "mlp.down_proj.weight"].chunk(tp, 1)[r],
                p + "input_layernorm.weight": hf[p + "input_layernorm.weight"],
                "model.norm.weight": hf["model.norm.weight"],
                "lm_head.weight": vocab[1],
            }
        )
    return shards


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_to_hf_recovers_every_tensor_bitwise_at_any_tp(tp: int) -> None:
    hf = _hf()
    back = to_hf(_vllm_shards(hf, tp), SHAPE)
    assert sorted(back) == sorted(hf)
    for name, t in hf.items():
        assert back[name].shape == t.shape and torch.equal(back[name].view(torch.int16), t.view(torch.int16)), name


def test_a_replica_that_differs_is_an_error() -> None:
    shards = _vllm_shards(_hf(), 4)  # TP 4 > 2 kv heads: each kv head on two ranks
    shards[1]["model.layers.0.self_attn.qkv_proj.weight"][8, 0] += 1  # rank 1's copy of kv head 0
    with pytest.raises(LayoutError, match="replica on rank 1"):
        to_hf(shards, SHAPE)
    shards = _vllm_shards(_hf(), 2)
    shards[1]["model.norm.weight"] = shards[1]["model.norm.weight"].clone()
    shards[1]["model.norm.weight"][3] += 1
    with pytest.raises(LayoutError, match="model.norm.weight"):
        to_hf(shards, SHAPE)


def test_an_unknown_vllm_tensor_is_an_error() -> None:
    shards = _vllm_shards(_hf(), 1)
    shards[0]["model.layers.0.mlp.experts.w13_weight"] = torch.zeros(2, 2)
    with pytest.raises(LayoutError, match="no known Hugging Face mapping"):
        to_hf(shards, SHAPE)
