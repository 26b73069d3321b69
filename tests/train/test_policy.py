"""The policy's log-probs (``ftkit.engines.policy``): one formulation for engine and trainer."""

from __future__ import annotations

import torch

from ftkit.engines.policy import allowed_index, policy_logprobs, policy_logprobs_entropy, sampled_logprobs, truncate


def test_log_probs_are_over_the_allowed_tokens_only() -> None:
    logits = torch.randn(6, 40)
    allowed = torch.tensor([7, 2, 30])
    every = torch.stack([sampled_logprobs(logits, allowed, torch.full((6,), k)) for k in range(3)], dim=1)
    torch.testing.assert_close(every.exp().sum(-1), torch.ones(6))
    logits[:, 0] = 1e4  # a token outside the set changes nothing
    assert torch.equal(sampled_logprobs(logits, allowed, torch.zeros(6, dtype=torch.int64)), every[:, 0])


def test_the_trainers_layout_holds_what_an_engine_recorded_bit_for_bit() -> None:
    allowed = torch.tensor([5, 1, 9])
    index = allowed_index(allowed.tolist(), 12)
    assert index[[5, 1, 9, 0]].tolist() == [0, 1, 2, 0]
    tokens = torch.tensor([[3, 4, 5, 9, 1], [3, 4, 1, 1, 5]])
    logits = torch.randn(2, 5, 12)
    lp = policy_logprobs(logits, tokens, allowed, index)
    assert lp.shape == (2, 5) and bool((lp[:, -1] == 0).all())
    for t in (1, 2, 3):  # an engine scoring position t, having sampled token t + 1
        engine = sampled_logprobs(logits[:, t], allowed, index[tokens[:, t + 1]])
        assert torch.equal(lp[:, t], engine)


def test_temperature_scales_the_logits_and_greedy_reads_temperature_one() -> None:
    logits = torch.randn(4, 7, 10)
    tokens = torch.randint(0, 10, (4, 7))
    allowed = torch.arange(10)
    index = allowed_index(allowed.tolist(), 10)
    hot = policy_logprobs(logits, tokens, allowed, index, 0.5)
    assert torch.equal(hot, policy_logprobs(logits / 0.5, tokens, allowed, index))
    assert torch.equal(
        policy_logprobs(logits, tokens, allowed, index, 0.0), policy_logprobs(logits, tokens, allowed, index)
    )
    picks = tokens[:, 1]
    assert torch.equal(sampled_logprobs(logits[:, 0], allowed, picks, 0.5), hot[:, 0])  # the engine's formulation
    _, entropy = policy_logprobs_entropy(logits, tokens, allowed, index, torch.ones(4, 7, dtype=torch.bool), 0.5)
    p = (logits / 0.5).softmax(-1).reshape(-1, 10)
    torch.testing.assert_close(entropy, -(p * p.log()).sum(-1))


def test_top_k_keeps_the_k_most_likely_and_their_ties() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.2, 0.1]], dtype=torch.float64)
    assert truncate(probs, top_k=1).nonzero()[:, 1].tolist() == [1]
    assert truncate(probs, top_k=2).nonzero()[:, 1].tolist() == [1, 2, 3]  # the tie at 0.2 is kept whole
    assert torch.equal(truncate(probs, top_k=0), probs) and torch.equal(truncate(probs, top_k=5), probs)


def test_top_p_keeps_the_smallest_head_that_reaches_p_and_never_nothing() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.3, 0.15], [0.97, 0.01, 0.01, 0.01]], dtype=torch.float64)
    kept = truncate(probs, top_p=0.8)
    assert kept[0].nonzero().flatten().tolist() == [1, 2]  # 0.5 + 0.3 reaches 0.8
    assert kept[1].nonzero().flatten().tolist() == [0]  # the most likely token alone
    assert truncate(probs, top_p=0.81)[0].nonzero().flatten().tolist() == [1, 2, 3]
    assert truncate(probs, top_p=1e-9).count_nonzero(dim=-1).tolist() == [1, 1]  # never empty
    assert torch.equal(kept[0, [1, 2]], probs[0, [1, 2]])  # not renormalised: the sampler reads the cumsum


def test_top_p_is_measured_over_what_top_k_kept() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    # top-k 2 keeps 0.4 and 0.3 (renormalised: 4/7, 3/7); top-p 0.5 of that is the first alone
    assert truncate(probs, top_p=0.5, top_k=2).nonzero()[:, 1].tolist() == [0]
    assert truncate(probs, top_p=0.6, top_k=2).nonzero()[:, 1].tolist() == [0, 1]
