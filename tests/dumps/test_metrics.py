"""Pair metrics against straightforward numpy references, across chunk boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ftkit.dumps import metrics
from ftkit.dumps.metrics import diff_metrics, equal_metrics, nonfinite_counts


@pytest.fixture(params=[metrics.CHUNK, 7], ids=["one-chunk", "chunk-7"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK", request.param)
    return request.param


@np.errstate(invalid="ignore", over="ignore")
def _reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> dict:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    fin = np.isfinite(a64) & np.isfinite(b64)
    d = np.abs(a64 - b64)[fin]
    den = np.maximum(np.abs(a64), np.abs(b64))[fin]
    rel = np.divide(d, den, out=np.zeros_like(d), where=den > 0)
    af, bf = a64[fin], b64[fin]
    sxx = float((af * af).sum() + (bf * bf).sum())
    bad = ~fin & ~((np.isnan(a64) & np.isnan(b64)) | (a64 == b64))
    return {
        "max_abs": d.max(initial=0.0),
        "mean_abs": d.mean() if d.size else 0.0,
        "max_rel": rel.max(initial=0.0),
        "dissimilarity": 1 - 2 * float((af * bf).sum()) / sxx if sxx > 0 else 0.0,
        "tol_fail": int((d > atol + rtol * np.abs(bf)).sum() + bad.sum()),
        "nonfinite_mismatch": int(bad.sum()),
    }


floats = st.floats(-1e6, 1e6, allow_nan=False, width=32) | st.sampled_from(
    [0.0, -0.0, float("nan"), float("inf"), float("-inf")]
)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 40), elements=floats), st.data())
def test_matches_reference(a, data):
    noise = data.draw(arrays(np.float32, a.shape, elements=floats))
    b = np.where(data.draw(arrays(np.bool_, a.shape)), a, noise).astype(np.float32)
    default = metrics.CHUNK
    for chunk in (default, 7):
        metrics.CHUNK = chunk
        try:
            m = diff_metrics(torch.from_numpy(a.copy()), torch.from_numpy(b.copy()), 1e-3, 1e-6)
        finally:
            metrics.CHUNK = default
        ref = _reference(a, b, 1e-3, 1e-6)
        for k, v in ref.items():
            assert getattr(m, k) == pytest.approx(v, rel=1e-9, abs=1e-12), k
        assert m.nan_a == int(np.isnan(a).sum()) and m.inf_b == int(np.isinf(b).sum())
        assert m.bits_differ == int((a.view(np.int32) != b.view(np.int32)).sum())
        assert m.bitwise_equal == (m.bits_differ == 0)


def test_location_of_largest_difference(chunk):
    a = torch.zeros(3, 4, 5)
    b = a.clone()
    b[2, 1, 3] = -4.0
    b[0, 0, 1] = 1.0
    m = diff_metrics(a, b, 0, 0)
    assert m.argmax == [2, 1, 3] and (m.a_at, m.b_at) == (0.0, -4.0)
    assert m.max_abs == 4.0 and m.max_rel == 1.0 and m.dissimilarity == pytest.approx(1.0)


def test_dissimilarity_values():
    x = torch.randn(100, dtype=torch.float64)
    assert diff_metrics(x, -x, 0, 0).dissimilarity == pytest.approx(2.0)
    assert diff_metrics(x, x * 1.0, 0, 0).dissimilarity == 0.0
    assert diff_metrics(torch.zeros(3), torch.zeros(3), 0, 0).dissimilarity == 0.0


def test_integer_bool_and_low_precision_dtypes():
    m = diff_metrics(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 7]), 0, 0)
    assert (m.max_abs, m.argmax, m.bits_differ, m.tol_fail) == (4.0, [2], 1, 1)
    m = diff_metrics(torch.tensor([True, False]), torch.tensor([True, True]), 0, 0)
    assert (m.max_abs, m.argmax) == (1.0, [1])
    a = torch.tensor([1.0, 2.0]).to(torch.bfloat16)
    b = torch.tensor([1.0, 2.015625]).to(torch.bfloat16)  # one bf16 ulp at 2.0
    m = diff_metrics(a, b, 0, 0)
    assert m.bits_differ == 1 and m.max_abs == 0.015625
    f8 = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    assert diff_metrics(f8, f8.clone(), 0, 0).bitwise_equal


def test_infinities():
    inf = float("inf")
    m = diff_metrics(torch.tensor([inf, 1.0, -inf]), torch.tensor([inf, 1.0, inf]), 0, 0)
    assert (m.nonfinite_mismatch, m.tol_fail, m.argmax, m.max_abs) == (1, 1, [2], 0.0)
    assert (m.inf_a, m.inf_b) == (2, 2)


def test_nonfinite_counts_fast_and_exact_paths():
    x = torch.randn(1000)
    assert nonfinite_counts(x) == (0, 0)
    x[3], x[5], x[7] = float("nan"), float("inf"), float("-inf")
    assert nonfinite_counts(x) == (1, 2)
    assert nonfinite_counts(torch.full((10,), 3e38)) == (0, 0)  # the float32 sum overflows; exact recount
    assert nonfinite_counts(torch.tensor([1.0, float("nan")]).to(torch.float8_e5m2)) == (1, 0)
    assert nonfinite_counts(torch.arange(5)) == (0, 0)
    m = equal_metrics(x)
    assert m.bitwise_equal and (m.nan_a, m.nan_b, m.inf_a, m.inf_b) == (1, 1, 2, 2)
