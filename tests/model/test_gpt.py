"""The megatron-core GPT of a preset: deterministic build, CPU attention, preset sizes."""

import pytest
import torch

from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel, layer_spec
from ftkit.model.presets import PRESETS, VOCAB_SIZE, get_preset
from ftkit.train.config import TrainConfig
from ftkit.train.plan.run_plan import build_plan


@pytest.fixture(scope="module", autouse=True)
def world():
    configure_determinism(1)
    init_local_parallel("cpu")


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_build_is_a_function_of_the_seed():
    a = _params(build_gpt(build_plan(TrainConfig(seed=3)).model, 3, "cpu"))
    b = _params(build_gpt(build_plan(TrainConfig(seed=3)).model, 3, "cpu"))
    c = _params(build_gpt(build_plan(TrainConfig(seed=4)).model, 4, "cpu"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["decoder.layers.0.mlp.linear_fc1.weight"], c["decoder.layers.0.mlp.linear_fc1.weight"])


def test_tiny_model_runs_forward_and_backward_on_cpu():
    model = build_gpt(build_plan(TrainConfig()).model, 0, "cpu").to("cpu")
    tokens = torch.randint(0, VOCAB_SIZE, (3, 13))
    pos = torch.arange(13).unsqueeze(0).expand(3, -1)
    logits = model(tokens, pos, None)
    assert logits.shape == (3, 13, VOCAB_SIZE)
    logits.float().pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == get_preset("tiny").approx_params


def test_the_model_is_causal():
    model = build_gpt(build_plan(TrainConfig()).model, 0, "cpu")
    tokens = torch.randint(0, VOCAB_SIZE, (2, 10))
    pos = torch.arange(10).unsqueeze(0).expand(2, -1)
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % VOCAB_SIZE
    with torch.no_grad():
        a, b = model(tokens, pos, None), model(changed, pos, None)
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.equal(a[:, 7:], b[:, 7:])


def test_sdp_attention_matches_a_reference_causal_softmax():
    from megatron.core.transformer.enums import AttnMaskType

    from ftkit.model.attention import SDPAttention
    from ftkit.model.gpt import transformer_config

    cfg = transformer_config("tiny", 1, 1, "cpu")
    attn = SDPAttention(cfg, 1, AttnMaskType.causal, "self")
    s, b, n, d = 6, 2, cfg.num_attention_heads, cfg.kv_channels
    q, k, v = (torch.randn(s, b, n, d, dtype=torch.float64) for _ in range(3))
    out = attn(q, k, v, None)
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / d**0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(s, b, n * d)
    assert out.shape == (s, b, n * d)
    assert torch.allclose(out, ref, atol=1e-12)


def test_sdp_attention_refuses_dropout():
    from megatron.core.transformer.enums import AttnMaskType

    from ftkit.model.attention import SDPAttention
    from ftkit.model.gpt import transformer_config

    with pytest.raises(ValueError, match="dropout"):
        SDPAttention(transformer_config("tiny", 1, 1, "cpu"), 1, AttnMaskType.causal, "self", attention_dropout=0.1)


def test_cpu_layer_spec_uses_sdp_attention():
    from ftkit.model.attention import SDPAttention

    assert layer_spec("cpu").submodules.self_attention.submodules.core_attention is SDPAttention


def test_small_preset_has_20_to_50_million_parameters():
    model = build_gpt(build_plan(TrainConfig(model="small", samples_per_rollout=32)).model, 0, "cpu")
    count = sum(p.numel() for p in model.parameters())
    assert 20e6 <= count <= 50e6
    assert count == PRESETS["small"].approx_params


def test_every_preset_vocabulary_splits_evenly_for_supported_tp_sizes():
    for p in PRESETS.values():
        assert p.vocab_size == VOCAB_SIZE and all(p.vocab_size % tp == 0 for tp in (1, 2, 4, 8))
