"""Pair metrics against the numpy oracle (tests/dumps/metrics_oracle.py) and hand-made cases,
across stripe boundaries."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from metrics_oracle import assert_matches, reference  # tests/dumps/metrics_oracle.py

from ftkit.dumps import metrics
from ftkit.dumps.metrics import diff_metrics, equal_metrics, nonfinite_counts


@pytest.fixture(params=[None, (3, 5)], ids=["default-stripes", "stripes-3-5"])
def chunk(request, monkeypatch):
    """Default stripes, or stripes of 3-5 elements (merged in order across many pool tasks)."""
    if request.param:
        monkeypatch.setattr(metrics, "MIN_STRIPE", request.param[0])
        monkeypatch.setattr(metrics, "STRIPE", request.param[1])
    return request.param


floats = st.floats(-1e6, 1e6, allow_nan=False, width=32) | st.sampled_from(
    [0.0, -0.0, float("nan"), float("inf"), float("-inf")]
)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 40), elements=floats), st.data())
def test_matches_reference(a, data):
    noise = data.draw(arrays(np.float32, a.shape, elements=floats))
    b = np.where(data.draw(arrays(np.bool_, a.shape)), a, noise).astype(np.float32)
    default = metrics.MIN_STRIPE, metrics.STRIPE
    for stripe in (default, (7, 7), (3, 12)):  # several stripes run threaded, merged in order
        metrics.MIN_STRIPE, metrics.STRIPE = stripe
        try:
            m = diff_metrics(a.copy(), b.copy(), 1e-3, 1e-6)
        finally:
            metrics.MIN_STRIPE, metrics.STRIPE = default
        assert_matches(m, reference(a, b, 1e-3, 1e-6))


def test_location_of_largest_difference(chunk):
    a = np.zeros((3, 4, 5), np.float32)
    b = a.copy()
    b[2, 1, 3] = -4.0
    b[0, 0, 1] = 1.0
    m = diff_metrics(a, b, 0, 0)
    assert m.argmax == [2, 1, 3] and (m.a_at, m.b_at) == (0.0, -4.0)
    assert m.max_abs == 4.0 and m.max_rel == 1.0 and m.dissimilarity == pytest.approx(1.0)


def test_dissimilarity_values():
    x = np.random.default_rng(0).standard_normal(100)
    assert diff_metrics(x, -x, 0, 0).dissimilarity == pytest.approx(2.0)
    assert diff_metrics(x, x * 1.0, 0, 0).dissimilarity == 0.0
    assert diff_metrics(np.zeros(3), np.zeros(3), 0, 0).dissimilarity == 0.0


def test_dissimilarity_of_nearly_equal_tensors_is_not_lost_to_cancellation():
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    y = x.copy()
    y[5] = np.nextafter(y[5], np.float32(np.inf))
    m = diff_metrics(x, y, 0, 0)
    expected = float((np.float64(x[5]) - np.float64(y[5])) ** 2) / float(2 * (x.astype(np.float64) ** 2).sum())
    assert m.dissimilarity == pytest.approx(expected, rel=1e-3) and m.dissimilarity > 0


def test_integer_bool_and_low_precision_dtypes():
    m = diff_metrics(np.array([1, 2, 3]), np.array([1, 2, 7]), 0, 0)
    assert (m.max_abs, m.argmax, m.bits_differ, m.tol_fail) == (4.0, [2], 1, 1)
    m = diff_metrics(np.array([True, False]), np.array([True, True]), 0, 0)
    assert (m.max_abs, m.argmax) == (1.0, [1])
    a = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    b = np.array([1.0, 2.015625], ml_dtypes.bfloat16)  # one bf16 ulp at 2.0
    m = diff_metrics(a, b, 0, 0)
    assert m.bits_differ == 1 and m.max_abs == 0.015625
    f8 = np.array([1.0, 2.0], ml_dtypes.float8_e4m3fn)
    assert diff_metrics(f8, f8.copy(), 0, 0).bitwise_equal
    m = diff_metrics(np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0], np.float64), 0, 0)
    assert not m.bitwise_equal and m.max_abs == 0 and m.bits_differ == 2  # dtypes differ


def test_float32_overflow_of_the_difference_is_measured_in_float64():
    a = np.array([3e38, 1.0], np.float32)
    b = np.array([-3e38, 1.0], np.float32)
    m = diff_metrics(a, b, 0, 0)
    assert m.max_abs == pytest.approx(6e38, rel=1e-6) and m.nonfinite_mismatch == 0 and m.argmax == [0]


def test_nonfinite_mismatch_is_the_worst_difference():
    nan, inf = float("nan"), float("inf")
    m = diff_metrics(np.array([1, nan, inf], np.float32), np.array([1, 2, -inf], np.float32), 1e-5, 1e-8)
    assert m.nonfinite_mismatch == 2 and m.tol_fail == 2
    assert m.max_abs == m.max_rel == m.mean_abs == m.dissimilarity == inf
    assert m.argmax == [1] and m.b_at == 2.0
    m = diff_metrics(np.array([1, nan], np.float32), np.array([1, nan], np.float32), 0, 0)
    assert m.nonfinite_mismatch == 0 and m.max_abs == 0  # NaN matches NaN


def test_infinities():
    inf = float("inf")
    m = diff_metrics(np.array([inf, 1.0, -inf]), np.array([inf, 1.0, inf]), 0, 0)
    assert (m.nonfinite_mismatch, m.tol_fail, m.argmax, m.max_abs) == (1, 1, [2], inf)
    assert (m.inf_a, m.inf_b) == (2, 2)


def test_nonfinite_counts_fast_and_exact_paths():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert nonfinite_counts(x) == (0, 0)
    x[3], x[5], x[7] = float("nan"), float("inf"), float("-inf")
    assert nonfinite_counts(x) == (1, 2)
    assert nonfinite_counts(np.full((10,), 3e38, np.float32)) == (0, 0)  # the sum is in float64
    assert nonfinite_counts(np.array([1.0, float("nan")], ml_dtypes.float8_e5m2)) == (1, 0)
    assert nonfinite_counts(np.arange(5)) == (0, 0)
    assert nonfinite_counts(np.array([1 + 1j, complex("nan+1j")], np.complex64)) == (1, 0)
    m = equal_metrics(x)
    assert m.bitwise_equal and (m.nan_a, m.nan_b, m.inf_a, m.inf_b) == (1, 1, 2, 2)


def test_bfloat16_pairs_measure_like_their_float32_values(chunk):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(5000).astype(ml_dtypes.bfloat16)
    b = a.copy()
    b[::3] = (b[::3].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
    b[7], a[11] = np.nan, np.inf
    m = diff_metrics(a, b, 1e-3, 1e-6)
    assert_matches(m, reference(a, b, 1e-3, 1e-6))


@pytest.mark.parametrize("rtol", [1e-2, 1e-5, 1e-7])
def test_tolerance_count_is_exact_around_the_relative_bound(chunk, rtol):
    """Dense pairs whose relative differences sit just under, around and just over ``rtol``:
    the count never depends on whether the no-failure shortcut of a chunk was taken."""
    rng = np.random.default_rng(int(-np.log10(rtol)))
    b = rng.standard_normal(20000)
    for scale in (0.1, 0.45, 0.9, 1.1, 3.0):
        a = b * (1 + scale * rtol * rng.uniform(-1, 1, b.size))
        a[::5000] = b[::5000] * (1 + 2 * rtol)  # a few failures in some runs' chunks
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        m = diff_metrics(a32, b32, rtol, 0.0)
        d = np.abs(a32.astype(np.float64) - b32.astype(np.float64))
        limit = rtol * np.abs(b32.astype(np.float64))
        sure_fail, sure_pass = d > limit * (1 + 1e-5), d < limit * (1 - 1e-5)  # away from float32 rounding
        assert int(sure_fail.sum()) <= m.tol_fail <= int((~sure_pass).sum()), scale


def test_byte_order_is_read_not_compared():
    """Arrays in non-native byte order are measured by value: the same values in either order
    are bitwise equal (a dump is little-endian; a caller's array may not be)."""
    a = np.array([1.0, 2.0, np.nan, -0.0], ">f4")
    m = diff_metrics(a, a.astype("<f4"), 0, 0)
    assert m.bitwise_equal and (m.nan_a, m.nan_b) == (1, 1)
    m = diff_metrics(a, np.array([1.0, 2.5, np.nan, 0.0], "<f4"), 0, 0)
    assert (m.bits_differ, m.argmax, m.max_abs, m.b_at) == (2, [1], 0.5, 2.5)
    assert nonfinite_counts(np.array([np.inf, np.nan, 1], ">f8")) == (1, 1)
