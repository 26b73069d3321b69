"""Witness table: bitwise identity in forward, exact per-sample counts in backward."""

import pytest
import torch

from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
from ftkit.train.config import TrainConfig
from ftkit.train.plan.run_plan import build_plan
from ftkit.train.rank.loss import pg_loss, targets
from ftkit.train.rank.witness import WitnessTable


@pytest.fixture(scope="module")
def model():
    configure_determinism(1)
    init_local_parallel("cpu")
    return build_gpt(build_plan(TrainConfig(seed=5)).model, 5, "cpu")


def _run(model, tokens, mask, adv, witness=None, ids=None):
    """Logits-free loss path of the worker: per-token NLL -> PG loss -> backward."""
    model.zero_grad(set_to_none=True)
    pos = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    if witness is None:
        nll = model(tokens, pos, None, labels=targets(tokens))
    else:
        emb = witness.apply(model.embedding(input_ids=tokens, position_ids=pos), witness.rows(ids))
        nll = model(tokens, pos, None, decoder_input=emb, labels=targets(tokens))
    pg_loss(nll, mask, adv, 10.0).backward()
    return nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _batch(n=4, s=12):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 15, (n, s), generator=g)
    mask = torch.zeros(n, s)
    mask[:, 4:-1] = 1
    return tokens, mask, torch.tensor([1.0, -0.5, 0.25, 2.0])[:n]


def test_witness_changes_neither_activations_nor_gradients(model):
    tokens, mask, adv = _batch()
    ref_nll, ref_grads = _run(model, tokens, mask, adv)
    w = WitnessTable(capacity=32)
    nll, grads = _run(model, tokens, mask, adv, w, torch.tensor([40, 41, 42, 43]))
    assert torch.equal(nll, ref_nll)
    assert all(torch.equal(grads[k], ref_grads[k]) for k in ref_grads)
    assert not any(p is w.param for p in model.parameters())


def test_backward_counts_each_sample_once_at_its_row(model):
    tokens, mask, adv = _batch()
    w = WitnessTable(capacity=32)
    _run(model, tokens, mask, adv, w, torch.tensor([40, 41, 42, 43]))
    g = w.param.grad
    assert torch.equal(g[8:12, 0], torch.ones(4))  # rows = id % 32
    assert g[:, 0].sum() == 4 and torch.all(g[8:12, 1] > 0)
    assert w.read(g, [40, 41, 42, 43]) == ([40, 41, 42, 43], [1, 1, 1, 1], g[8:12, 1].double().tolist())


def test_a_duplicated_sample_counts_twice(model):
    tokens, mask, adv = _batch()
    tokens[3], mask[3], adv[3] = tokens[1], mask[1], adv[1]
    w = WitnessTable(capacity=8)
    _run(model, tokens, mask, adv, w, torch.tensor([0, 1, 2, 1]))
    ids, counts, _ = w.read(w.param.grad, [0, 1, 2, 1])
    assert (ids, counts) == ([0, 1, 2], [1, 2, 1])


def test_contribution_is_zero_when_the_loss_does_not_reach_the_model(model):
    tokens, mask, adv = _batch()
    mask[2] = 0  # sample 2 learns nothing
    w = WitnessTable(capacity=8)
    _run(model, tokens, mask, adv, w, torch.tensor([4, 5, 6, 7]))
    ids, counts, contribs = w.read(w.param.grad, [4, 5, 6, 7])
    assert counts == [1, 1, 1, 1]
    assert contribs[2] == 0.0 and all(c > 0 for i, c in enumerate(contribs) if i != 2)


def test_ids_colliding_modulo_capacity_are_refused():
    w = WitnessTable(capacity=8)
    with pytest.raises(ValueError, match="collide"):
        w.rows(torch.tensor([1, 9]))
    assert w.rows(torch.tensor([1, 1])).tolist() == [1, 1]  # the same id twice is a duplicate, not a collision


def test_read_refuses_a_fractional_count():
    w = WitnessTable(capacity=4)
    g = torch.zeros(4, 2)
    g[1, 0] = 0.5
    with pytest.raises(ValueError, match="not an integer"):
        w.read(g, [1])
    assert w.read(torch.zeros(4, 2), [0, 1]) == ([], [], [])  # lost samples are absent
