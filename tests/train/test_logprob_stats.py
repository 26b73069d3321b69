"""Engine vs trainer log-prob statistics: exact differing-token counts, deltas, k3, by position."""

import math

import numpy as np
import pytest
import torch

from ftkit.train.rl.logprob_stats import MismatchStats, compare_logprobs


def test_identical_log_probs_have_no_mismatch():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=g)
    out = compare_logprobs(lp, lp.clone(), torch.ones(4, 6))
    assert out.step == MismatchStats(tokens=24, differing=0, nonfinite=0, max_abs=0.0, mean_abs=0.0, k3=0.0)
    assert len(out.positions) == 6 and all(p.tokens == 4 for p in out.positions)


def test_hand_computed_sample_with_padding_ignored():
    engine = np.array([[-1.0, -2.0, -3.0, 5.0]], dtype=np.float32)
    trainer = np.array([[-1.0, -2.5, -3.0, -7.0]], dtype=np.float32)  # the padded column differs: not compared
    out = compare_logprobs(engine, trainer, np.array([[1, 1, 1, 0]]))
    s = out.samples[0]
    assert (s.tokens, s.differing, s.nonfinite) == (3, 1, 0)
    assert s.max_abs == 0.5 and math.isclose(s.mean_abs, 0.5 / 3)
    assert math.isclose(s.k3, (math.exp(-0.5) + 0.5 - 1) / 3)
    assert [p.differing for p in out.positions] == [0, 1, 0]
    assert out.step == s


def test_one_ulp_is_a_differing_token():
    a = np.full((1, 3), -1.25, dtype=np.float32)
    b = a.copy()
    b[0, 2] = np.nextafter(np.float32(-1.25), np.float32(0))
    out = compare_logprobs(a, b, np.ones((1, 3)))
    assert out.step.differing == 1 and 0 < out.step.max_abs < 1e-6
    assert compare_logprobs(np.zeros((1, 1), np.float32), -np.zeros((1, 1), np.float32), [[1]]).step.differing == 1


def test_positions_count_from_each_samples_first_compared_token():
    # left-padded prompts then responses of lengths 3 and 1, starting at different columns here
    mask = np.array([[0, 1, 1, 1, 0], [0, 0, 0, 1, 0]])
    engine = np.zeros((2, 5), dtype=np.float32)
    trainer = np.zeros((2, 5), dtype=np.float32)
    trainer[0, 3] = 0.25  # sample 0, response position 2
    trainer[1, 3] = 0.5  # sample 1, response position 0
    out = compare_logprobs(engine, trainer, mask)
    assert [(p.tokens, p.differing, p.max_abs) for p in out.positions] == [(2, 1, 0.5), (1, 0, 0.0), (1, 1, 0.25)]
    assert [s.tokens for s in out.samples] == [3, 1]
    assert out.step.mean_abs == 0.75 / 4


def test_non_finite_values_are_counted_and_kept_out_of_the_figures():
    engine = np.array([[-1.0, np.nan, -np.inf]], dtype=np.float32)
    trainer = np.array([[-1.5, -1.0, -1.0]], dtype=np.float32)
    s = compare_logprobs(engine, trainer, np.ones((1, 3))).step
    assert (s.tokens, s.differing, s.nonfinite, s.max_abs) == (3, 3, 2, 0.5)
    assert math.isfinite(s.k3)


def test_torch_tensors_that_require_grad_are_read_and_results_are_plain_numbers():
    lp = torch.zeros(2, 2, requires_grad=True)
    out = compare_logprobs(lp, lp.detach() - 0.125, torch.ones(2, 2, dtype=torch.bool))
    d = out.as_dict()
    assert d["step"]["differing"] == 4 and d["step"]["max_abs"] == 0.125
    assert isinstance(d["samples"][0]["k3"], float) and d["samples"][0]["k3"] > 0


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="must be the same"):
        compare_logprobs(np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3)))


def test_nothing_to_compare_is_all_zero():
    out = compare_logprobs(np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), np.zeros((2, 3)))
    assert out.positions == [] and out.step.tokens == 0 and out.step.max_abs == 0.0
    assert [s.tokens for s in out.samples] == [0, 0]
