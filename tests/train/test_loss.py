"""The PG loss of micro-shards adds up to the step's loss for any cut."""

import torch

from ftkit.train.rank.loss import pg_loss, step_tokens, targets


def test_micro_shard_losses_add_up_to_the_step_loss_for_any_cut():
    g = torch.Generator().manual_seed(1)
    nll = torch.rand(12, 9, generator=g, dtype=torch.float64)
    mask = (torch.rand(12, 9, generator=g) > 0.3).float()
    adv = torch.randn(12, generator=g)
    norm = step_tokens(mask)
    whole = pg_loss(nll, mask, adv, norm).double()
    for size in (1, 2, 3, 4, 6, 12):
        parts = sum(
            pg_loss(nll[i : i + size], mask[i : i + size], adv[i : i + size], norm).double() for i in range(0, 12, size)
        )
        assert torch.allclose(parts, whole, rtol=1e-6)
    expected = (adv[:, None].double() * nll * mask).sum() / mask.sum()
    assert torch.allclose(whole, expected, rtol=1e-6)


def test_step_tokens_never_divides_by_zero():
    assert step_tokens(torch.zeros(3, 4)) == 1.0
    assert step_tokens(torch.ones(3, 4)) == 12.0


def test_targets_shift_left():
    t = torch.tensor([[5, 6, 7, 8]])
    assert targets(t).tolist() == [[6, 7, 8, 0]]
