"""The policy's log-probs (``ftkit.engines.policy``): one formulation for engine and trainer."""

from __future__ import annotations

import torch

from ftkit.engines.policy import allowed_index, policy_logprobs, sampled_logprobs


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
