"""``ftkit.model.output_positions`` and the policy's log-probs of logits kept at the scored positions."""

import pytest
import torch

from ftkit.engines.policy import allowed_index, policy_logprobs, policy_logprobs_entropy
from ftkit.model.output_positions import output_positions, scored, widen


class _Model(torch.nn.Module):
    """A stand-in with megatron's layout: hidden states ``[s, b, h]`` into ``output_layer``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(11, 6)
        self.output_layer = torch.nn.Linear(6, 11)

    def forward(self, tokens):
        hidden = self.embed(tokens).transpose(0, 1)  # [s, b, h]
        return self.output_layer(hidden).transpose(0, 1)  # [b, s, V]


def test_the_output_layer_sees_the_kept_positions_only_while_open():
    model = _Model()
    tokens = torch.randint(0, 11, (3, 7))
    full = model(tokens)
    with output_positions(model, scored(4)):
        kept = model(tokens)
    assert kept.shape == (3, 4, 11)
    assert torch.equal(kept, full[:, 2:6])  # the positions that predict the last 4 tokens
    assert model(tokens).shape == (3, 7, 11)  # the hook is gone
    with output_positions(model, None), output_positions(torch.nn.Identity(), scored(2)):
        assert model(tokens).shape == (3, 7, 11)  # None, or a stage without an output layer: untouched


def test_scored_and_widen():
    assert scored(3) == slice(-4, -1) and scored(0) is None and scored(None) is None
    values = torch.arange(6.0).view(2, 3)
    assert widen(values, 6).tolist() == [[0, 0, 0, 1, 2, 0], [0, 0, 3, 4, 5, 0]]
    assert widen(values, 3) is values
    values.requires_grad_()
    widen(values, 6).sum().backward()
    assert torch.equal(values.grad, torch.ones(2, 3))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_of_kept_positions_are_the_full_ones_there_and_zero_elsewhere(temperature):
    g = torch.Generator().manual_seed(1)
    b, s, v, r = 4, 9, 13, 5
    logits = torch.randn(b, s, v, generator=g)
    tokens = torch.randint(0, v, (b, s), generator=g)
    allowed = torch.tensor([0, 2, 3, 5, 7, 11])
    tokens[:, s - r :] = allowed[torch.randint(0, len(allowed), (b, r), generator=g)]
    index = allowed_index(allowed.tolist(), v)
    full = policy_logprobs(logits, tokens, allowed, index, temperature)
    kept = policy_logprobs(logits[:, scored(r)], tokens, allowed, index, temperature)
    window = slice(s - 1 - r, s - 1)
    assert kept.shape == (b, s)
    assert torch.equal(kept[:, window], full[:, window])  # the same operations on the same logits
    assert not kept[:, : s - 1 - r].any() and not kept[:, -1].any()
    at = torch.zeros(b, s, dtype=torch.bool)
    at[:, window] = torch.rand(b, r, generator=g) > 0.3
    logp_full, ent_full = policy_logprobs_entropy(logits, tokens, allowed, index, at, temperature)
    logp_kept, ent_kept = policy_logprobs_entropy(logits[:, scored(r)], tokens, allowed, index, at, temperature)
    assert torch.equal(logp_kept, kept) and torch.equal(logp_full, full)
    assert torch.equal(ent_kept, ent_full)
