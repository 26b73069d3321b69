"""The numpy oracle of ``ftkit.dumps.metrics``: the metrics docstring's definitions, written out
whole-array in float64 numpy with no chunks, stripes, shortcuts or compiled code.

``reference(a, b, rtol, atol)`` returns the ``Metrics`` the product must return. Counts, indexes,
``max_abs`` and ``max_rel`` are computed with the same float64 operations as the kernel (so they
must agree exactly); the sums (``mean_abs``, ``dissimilarity``) agree to rounding order.
"""

from __future__ import annotations

import numpy as np

from ftkit.dumps.metrics import Metrics
from ftkit.tensors.arrays import bits, real_view

INF = float("inf")


def _first(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(index, shape)] if shape else []


@np.errstate(all="ignore")
def reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Metrics:
    ra, rb = real_view(a), real_view(b)
    fa, fb = np.ascontiguousarray(ra).reshape(-1), np.ascontiguousarray(rb).reshape(-1)
    x, y = fa.astype(np.float64), fb.astype(np.float64)
    same = fa.dtype == fb.dtype
    ne = bits(fa) != bits(fb) if same else np.ones(fa.size, bool)
    nan_x, nan_y, inf_x, inf_y = np.isnan(x), np.isnan(y), np.isinf(x), np.isinf(y)
    fin = ~(nan_x | nan_y | inf_x | inf_y)
    mism = ~fin & ~((nan_x & nan_y) | (x == y))
    d = np.where(fin, np.abs(x - y), -1.0)
    df, xf, yf = d[fin], x[fin], y[fin]
    den = np.maximum(np.abs(xf), np.abs(yf))
    m = Metrics(fa.size, same and not ne.any(), int(ne.sum()))
    m.nan_a, m.nan_b, m.inf_a, m.inf_b = (int(v.sum()) for v in (nan_x, nan_y, inf_x, inf_y))
    m.nonfinite_mismatch = int(mism.sum())
    m.tol_fail = int((df > atol + rtol * np.abs(yf)).sum()) + m.nonfinite_mismatch
    if m.nonfinite_mismatch:
        m.max_abs = m.mean_abs = m.max_rel = m.dissimilarity = INF
        at = _first(mism)
    else:
        m.max_abs = float(df.max(initial=0.0))
        m.max_rel = float((df / np.where(den > 0, den, 1.0)).max(initial=0.0))
        m.mean_abs = float(df.sum() / df.size) if df.size else 0.0
        sxx = float((xf * xf + yf * yf).sum())
        m.dissimilarity = float((df * df).sum()) / sxx if sxx > 0 else 0.0
        at = int(np.argmax(d)) if m.max_abs > 0 else _first(ne)
    if at is not None:
        m.argmax = _unravel(at, ra.shape)
        m.a_at, m.b_at = float(x[at]), float(y[at])
    return m


EXACT_FIELDS = ("numel", "bitwise_equal", "bits_differ", "tol_fail", "max_abs", "max_rel", "argmax")
EXACT_FIELDS += ("nan_a", "nan_b", "inf_a", "inf_b", "nonfinite_mismatch")


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True  # NaN is the value there on both sides
    return x == y


def assert_matches(got: Metrics, want: Metrics) -> None:
    """``got`` equals the oracle's ``want``: exactly, except the sums' rounding order."""
    import pytest

    for k in EXACT_FIELDS + ("a_at", "b_at"):
        assert _same(getattr(got, k), getattr(want, k)), (k, getattr(got, k), getattr(want, k))
    for k in ("mean_abs", "dissimilarity"):
        assert getattr(got, k) == pytest.approx(getattr(want, k), rel=1e-9, abs=1e-300, nan_ok=True), k
