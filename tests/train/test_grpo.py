"""The GRPO objective: hand-computed cases, clipping, k3 KL, the gradient against a reference
written differently, and membership invariance over fixed micro-shards."""

import itertools
import math

import pytest
import torch

from ftkit.engines.policy import next_token_logprobs, token_logprobs
from ftkit.errors import ConfigError
from ftkit.train.rank.loss import pg_loss
from ftkit.train.rl import rollouts
from ftkit.train.rl.grpo import (
    GrpoConfig,
    aggregate,
    group_advantages,
    grpo_loss,
    k3,
    loss_norm,
    sum_losses,
    token_loss,
)


def test_token_logprobs_are_float32_log_softmax_at_the_targets():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]], dtype=torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert out.dtype == torch.float32
    want = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.bfloat16).float()  # the bf16 logits, in float32
    torch.testing.assert_close(out[0, 0], want[0, 1] - torch.logsumexp(want[0], 0))
    torch.testing.assert_close(out[0, 1], torch.tensor(math.log(0.5)))


def test_next_token_logprobs_score_token_t_plus_1_at_position_t():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g)
    tokens = torch.randint(0, 7, (2, 4), generator=g)
    out = next_token_logprobs(logits, tokens)
    assert out.shape == (2, 4) and torch.all(out[:, -1] == 0)
    for i, t in itertools.product(range(2), range(3)):
        assert out[i, t] == torch.log_softmax(logits[i, t], -1)[tokens[i, t + 1]]


def test_group_advantages_hand_values_and_equal_to_the_rollout_module():
    r = torch.tensor([0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(r, 4)
    want = torch.tensor([-1, 1, 1, -1, 0, 0, 0, 0], dtype=torch.float64) * (0.5 / (0.5 + 1e-6))
    assert torch.equal(adv, want.float())
    g = torch.Generator().manual_seed(1)
    rand = torch.rand(64, generator=g)
    assert torch.equal(group_advantages(rand, 8), rollouts.group_advantages(rand, 8))
    assert torch.equal(group_advantages(r, 4, scale=False), torch.tensor([-0.5, 0.5, 0.5, -0.5, 0, 0, 0, 0]))
    with pytest.raises(ConfigError, match="groups of 3"):
        group_advantages(r, 3)
    with pytest.raises(ConfigError, match="groups of 1"):
        group_advantages(r, 1)


def _one(lp_minus_old, adv, cfg, mask=None):
    lp = torch.tensor([lp_minus_old], dtype=torch.float32)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp) if mask is None else torch.tensor([mask], dtype=torch.float32)
    return grpo_loss(lp, old, torch.tensor([adv]), mask, loss_norm(mask), cfg)


def test_hand_computed_clipping_both_signs():
    cfg = GrpoConfig(clip_low=0.2, clip_high=0.28)
    ln = math.log
    # A = +1: ratio 1.5 is clipped to 1.28 (no push beyond), ratio 0.5 is not (min picks 0.5)
    loss, terms = _one([ln(1.5), ln(0.5)], 1.0, cfg)
    torch.testing.assert_close(loss, torch.tensor(-(1.28 + 0.5) / 2))
    assert terms.clipped.tolist() == [[True, False]]
    # A = -1: ratio 1.5 is not clipped (pessimistic: -1.5 < -1.28), ratio 0.5 is clipped to 0.8
    loss, terms = _one([ln(1.5), ln(0.5)], -1.0, cfg)
    torch.testing.assert_close(loss, torch.tensor((1.5 + 0.8) / 2))
    assert terms.clipped.tolist() == [[False, True]]
    # inside the band nothing is clipped and the loss is -A * ratio
    loss, terms = _one([ln(1.1), ln(0.9)], 2.0, cfg)
    torch.testing.assert_close(loss, torch.tensor(-2.0 * (1.1 + 0.9) / 2))
    assert not terms.clipped.any()


def test_a_clipped_token_has_no_gradient_and_an_unclipped_one_does():
    lp = torch.tensor([[math.log(1.5), math.log(1.1)]], requires_grad=True)
    loss, _ = grpo_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 2.0, GrpoConfig())
    loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] != 0
    torch.testing.assert_close(lp.grad[0, 1], torch.tensor(-1.1 / 2))


def test_masked_positions_contribute_nothing_even_when_their_values_are_garbage():
    lp = torch.tensor([[-0.5, float("-inf"), 3e4]], requires_grad=True)
    old = torch.tensor([[-0.7, 0.0, float("nan")]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    loss, terms = grpo_loss(lp, old, torch.tensor([1.0]), mask, 1.0, GrpoConfig(kl_coef=0.1), ref_logprobs=old)
    loss.backward()
    assert torch.isfinite(loss) and torch.all(torch.isfinite(lp.grad)) and lp.grad[0, 1:].tolist() == [0.0, 0.0]
    assert terms.loss[0, 1:].tolist() == [0.0, 0.0]


def test_k3_is_zero_when_the_policies_are_equal_and_hand_value_otherwise():
    g = torch.Generator().manual_seed(2)
    lp = -torch.rand(3, 5, generator=g)
    assert torch.equal(k3(lp, lp), torch.zeros(3, 5))
    got = k3(torch.tensor([0.0]), torch.tensor([math.log(2.0)]))
    torch.testing.assert_close(got, torch.tensor([2.0 - math.log(2.0) - 1.0]))
    assert torch.all(k3(lp, lp - 0.3) > 0) and torch.all(k3(lp, lp + 0.3) > 0)
    # with equal policies the KL term adds nothing at all
    mask, adv = torch.ones(3, 5), torch.tensor([1.0, -1.0, 0.5])
    a, _ = grpo_loss(lp, lp - 0.1, adv, mask, 15.0, GrpoConfig())
    b, _ = grpo_loss(lp, lp - 0.1, adv, mask, 15.0, GrpoConfig(kl_coef=0.5), ref_logprobs=lp)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="reference model's log-probs"):
        grpo_loss(lp, lp, adv, mask, 15.0, GrpoConfig(kl_coef=0.5))


def _reference(lp, old, ref, adv, mask, cl, ch, beta, aggregation, norm):
    """The objective written per token as the piecewise PPO definition: a token whose ratio left the
    band in the direction its advantage pushes is a constant (no gradient), otherwise -A * ratio."""
    total = lp.new_zeros(())
    for i in range(lp.shape[0]):
        seq = lp.new_zeros(())
        for t in range(lp.shape[1]):
            if mask[i, t] == 0:
                continue
            r = torch.exp(lp[i, t] - old[i, t])
            a = adv[i]
            if (a > 0 and r.item() > 1 + ch) or (a < 0 and r.item() < 1 - cl):
                term = -a * (1 + ch if a > 0 else 1 - cl)
            else:
                term = -a * r
            kl = torch.exp(ref[i, t] - lp[i, t]) - (ref[i, t] - lp[i, t]) - 1
            seq = seq + term + beta * kl
        total = total + (seq / mask[i].sum().clamp(min=1) if aggregation == "sequence" else seq)
    return total / norm


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_loss_and_gradient_equal_a_reference_written_differently(aggregation):
    g = torch.Generator().manual_seed(3)
    n, s = 6, 7
    old = -torch.rand(n, s, generator=g) * 3
    lp0 = old + torch.randn(n, s, generator=g) * 0.3  # ratios spread over and outside the band
    ref = old + torch.randn(n, s, generator=g) * 0.2
    adv = torch.randn(n, generator=g)
    mask = (torch.rand(n, s, generator=g) > 0.3).float()
    cfg = GrpoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.05, aggregation=aggregation)
    norm = loss_norm(mask, aggregation)
    lp = lp0.clone().requires_grad_()
    loss, terms = grpo_loss(lp, old, adv, mask, norm, cfg, ref_logprobs=ref)
    loss.backward()
    lp_ref = lp0.clone().requires_grad_()
    want = _reference(lp_ref, old, ref, adv, mask, 0.2, 0.28, 0.05, aggregation, norm)
    want.backward()
    assert 0 < int(terms.clipped.sum()) < int(mask.sum())  # the case exercises both branches
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-5, atol=1e-7)


def test_at_ratio_one_without_kl_the_gradient_is_reinforces_bit_for_bit():
    g = torch.Generator().manual_seed(4)
    lp0 = -torch.rand(4, 6, generator=g)
    adv, mask = torch.randn(4, generator=g), (torch.rand(4, 6, generator=g) > 0.4).float()
    norm = loss_norm(mask)
    lp = lp0.clone().requires_grad_()
    grpo_loss(lp, lp0, adv, mask, norm)[0].backward()
    nll = (-lp0).requires_grad_()
    pg_loss(nll, mask, adv, norm).backward()
    assert torch.equal(lp.grad, -nll.grad)


def _case(seed=5, n=8, s=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, s, generator=g) * 2
    lp = old + torch.randn(n, s, generator=g) * 0.25
    ref = old + torch.randn(n, s, generator=g) * 0.1
    mask = torch.zeros(n, s)
    for i in range(n):  # variable response lengths: 1 to s - 1 learned tokens
        mask[i, s - 1 - (i * 5 % (s - 1)) - 1 : s - 1] = 1
    return lp, old, ref, torch.randn(n, generator=g), mask


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_fixed_micro_shards_in_any_order_and_any_grouping_give_the_same_bits(aggregation):
    lp0, old, ref, adv, mask = _case()
    cfg = GrpoConfig(clip_high=0.28, kl_coef=0.02, aggregation=aggregation)
    norm = loss_norm(mask, aggregation)  # from the whole step: every cell computes the same number
    shards = [slice(i, i + 2) for i in range(0, 8, 2)]

    def run(groups):
        """Each group is what one cell computes as one batch (its micro-shards concatenated)."""
        losses, grads = {}, {}
        for group in groups:
            rows = torch.cat([torch.arange(8)[shards[k]] for k in group])
            lp = lp0[rows].clone().requires_grad_()
            terms = token_loss(lp, old[rows], adv[rows], mask[rows], cfg, ref[rows])
            for j, k in enumerate(group):  # each micro-shard's own loss term
                part = slice(2 * j, 2 * j + 2)
                losses[k] = aggregate(terms.loss[part], mask[rows][part], norm, aggregation)
            sum(losses[k] for k in group).backward()
            for j, k in enumerate(group):
                grads[k] = lp.grad[2 * j : 2 * j + 2]
        return sum_losses(losses[k].item() for k in range(4)), torch.cat([grads[k] for k in range(4)])

    one_cell = run([[0, 1, 2, 3]])
    for groups in ([[0, 1], [2, 3]], [[3], [1], [0], [2]], [[2, 3, 0], [1]]):
        other = run(groups)
        assert other[0] == one_cell[0]
        assert torch.equal(other[1], one_cell[1])
    full = grpo_loss(lp0, old, adv, mask, norm, cfg, ref)[0]
    assert math.isclose(one_cell[0], full.item(), rel_tol=1e-6)
    # sum_losses is exact: the order of the micro-shard values never changes the bits
    vals = [0.1, 1e16, -1e16, 0.3]
    assert len({sum_losses(p) for p in itertools.permutations(vals)}) == 1


def test_normalising_by_a_micro_shards_own_tokens_would_not_be_the_step_loss():
    lp, old, ref, adv, mask = _case()
    norm = loss_norm(mask)
    step = grpo_loss(lp, old, adv, mask, norm)[0].item()
    own = [grpo_loss(lp[k : k + 2], old[k : k + 2], adv[k : k + 2], mask[k : k + 2], loss_norm(mask[k : k + 2]))[0]
           for k in range(0, 8, 2)]  # fmt: skip
    assert not math.isclose(sum_losses(x.item() for x in own) / 4, step, rel_tol=1e-3)


def test_config_is_validated():
    for bad in ({"clip_low": 1.0}, {"clip_low": -0.1}, {"clip_high": float("inf")}, {"kl_coef": -1.0}):
        with pytest.raises(ConfigError):
            GrpoConfig(**bad)
    with pytest.raises(ConfigError, match="unknown aggregation 'mean'"):
        GrpoConfig(aggregation="mean")  # type: ignore[arg-type]
    assert loss_norm(torch.zeros(3, 4)) == 1.0 and loss_norm(torch.zeros(3, 4), "sequence") == 3.0
