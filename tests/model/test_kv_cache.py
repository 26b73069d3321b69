"""``ftkit.model.kv_cache.DecodeCache``: a token at a time through the cache gives the logits of the
uncached forward at every position (to float rounding), with and without left padding, for the
presets (learned positions) and Hugging Face families (RoPE, grouped-query attention, biases)."""

from __future__ import annotations

import pytest
import torch

from ftkit.engines.policy import padding_mask
from ftkit.model.attention import SDPAttention
from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
from ftkit.model.kv_cache import DecodeCache
from ftkit.train.config import TrainConfig
from ftkit.train.plan.run_plan import build_plan
from tests.model.hf_models import make_model


@pytest.fixture(scope="module", autouse=True)
def world():
    configure_determinism(1)
    init_local_parallel("cpu")


def _decoded(model, tokens, p, mask):
    """Logits at positions ``p - 1 .. s - 2``: the prompt, then one token a call."""
    b, s = tokens.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    cache, out = DecodeCache(model, b, s), []
    with torch.no_grad():
        for n in range(p, s):
            fed = slice(0 if n == p else n - 1, n)
            fed_mask = None if mask is None else mask[..., fed, :n]
            out.append(cache.next_logits(tokens[:, fed], positions[:, fed], fed_mask))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("model", ["tiny", "llama", "qwen2"])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_decoding_gives_the_uncached_logits(model, padded, tmp_path):
    name = model if model == "tiny" else str(make_model(model, tmp_path))
    plan = build_plan(TrainConfig(model=name))
    gpt = build_gpt(plan.model, 0, "cpu").eval()
    g = torch.Generator().manual_seed(0)
    b, p, s = 5, 4, 11
    tokens = torch.randint(1, min(250, gpt.vocab_size), (b, s), generator=g)
    mask = padding_mask(torch.tensor([0, 2, 1, 0, 3]), s) if padded else None
    with torch.no_grad():
        full = gpt(tokens, torch.arange(s).unsqueeze(0).expand(b, s), mask)[:, p - 1 : s - 1]
    cached = _decoded(gpt, tokens, p, mask)
    assert cached.shape == full.shape
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-4)
    assert torch.equal(cached[:, 0], full[:, 0])  # the prompt's pass is the uncached pass's shapes


def test_more_tokens_than_the_cache_holds_is_an_error():
    gpt = build_gpt(build_plan(TrainConfig()).model, 0, "cpu").eval()
    cache = DecodeCache(gpt, 2, 3)
    tokens = torch.ones(2, 4, dtype=torch.int64)
    with torch.no_grad(), pytest.raises(ValueError, match="exceed the cache's 3"):
        cache.next_logits(tokens, torch.arange(4).expand(2, 4), None)


def test_fewer_queries_than_keys_are_the_last_positions():
    """Unmasked, the decoding step's queries attend to every key up to their own position (the
    causal mask aligned to the end, not to the start)."""
    from ftkit.model.gpt import transformer_config

    attn = SDPAttention(transformer_config("tiny", 1, 1, "cpu"), 1, _causal(), "self")
    g = torch.Generator().manual_seed(2)
    h, d = attn.heads_per_partition, attn.head_dim
    q, k, v = (torch.randn(6, 2, h, d, generator=g) for _ in range(3))
    full = attn(q, k, v, None)
    assert torch.allclose(attn(q[-1:], k, v, None), full[-1:], atol=1e-6)
    assert torch.allclose(attn(q[-2:], k, v, None), full[-2:], atol=1e-6)


def _causal():
    from megatron.core.transformer.enums import AttnMaskType

    return AttnMaskType.causal
