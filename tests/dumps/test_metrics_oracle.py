"""The compiled metrics kernel equals the numpy oracle (tests/dumps/metrics_oracle.py) on random
pairs of every dtype a dump can hold: NaN/Inf/-0.0/subnormals/huge values, all-zero, lengths 0,
1 and odd ones across the kernel's 1024-element blocks, unaligned buffers, argmax ties, mixed
dtypes, tolerance and exact modes, any stripe cut; and never depends on the thread count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metrics_oracle import assert_matches, reference  # tests/dumps/metrics_oracle.py

from ftkit.dumps import metrics
from ftkit.dumps.metrics import diff_metrics
from ftkit.tensors.arrays import numpy_dtype

DTYPES = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"]
DTYPES += ["float8_e5m2fnuz", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool"]
DTYPES += ["complex64", "float8_e8m0fnu"]  # e8m0: MX block scales (powers of two, 0xFF NaN, no zero)
MIXED = [("float32", "float64"), ("bfloat16", "float16"), ("int32", "float32"), ("float8_e4m3fn", "bfloat16")]
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, 1e-40, 6e-8, 1e300, -1e300, 3e38, 65504.0])
TOLERANCES = [(0.0, 0.0), (1e-5, 1e-8), (1e-3, 1e-6), (0.5, 0.0)]
LENGTHS = st.sampled_from([0, 1, 2, 3, 7, 8, 9, 1023, 1024, 1025, 2049]) | st.integers(0, 5000)


def _values(rng: np.random.Generator, dtype: np.dtype, n: int, style: str) -> np.ndarray:
    """``n`` values of ``dtype``: raw random bytes (every bit pattern), few distinct values (ties,
    all-zero), or normal values with specials sprinkled in."""
    if style == "bytes":
        return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    if style == "few":
        v = rng.choice(np.array([0.0, 0.0, 1.0, -1.0, 2.0]), n)
    else:
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)
        spots = rng.random(n) < 0.05
        v[spots] = rng.choice(SPECIALS, int(spots.sum()))
    if dtype.kind in "biu":
        return np.nan_to_num(v, posinf=0, neginf=0).clip(-100, 100).astype(dtype)
    with np.errstate(all="ignore"):
        return v.astype(dtype)


def _perturb(rng: np.random.Generator, a: np.ndarray, dtype_b: np.dtype, style: str) -> np.ndarray:
    """A ``dtype_b`` copy of ``a`` with some positions replaced, nudged or sign-flipped."""
    with np.errstate(all="ignore"):
        b = a.astype(dtype_b)
        frac = rng.choice([0.0, 0.001, 0.1, 1.0])
        spots = rng.random(a.size) < frac
        fresh = _values(rng, dtype_b, a.size, style)
        b[spots] = fresh[spots]
        if dtype_b.kind == "f" or dtype_b.name in DTYPES[:8]:
            near = (rng.random(a.size) < frac) & ~spots
            b[near] = (b[near].astype(np.float64) * (1 + rng.standard_normal(int(near.sum())) * 1e-4)).astype(dtype_b)
            flip = (rng.random(a.size) < frac / 4) & (b.astype(np.float64) == 0)
            b[flip] = (-b[flip].astype(np.float64)).astype(dtype_b)  # -0.0 vs 0.0
    return b


def _unaligned(x: np.ndarray, offset: int) -> np.ndarray:
    """The same values in a buffer that starts ``offset`` bytes into an allocation."""
    buf = bytearray(offset + x.nbytes)
    buf[offset:] = x.tobytes()
    return np.frombuffer(buf, x.dtype, x.size, offset).reshape(x.shape)


pairs = st.one_of(st.sampled_from(DTYPES).map(lambda d: (d, d)), st.sampled_from(MIXED))


@settings(max_examples=200, deadline=None)
@given(
    pair=pairs,
    n=LENGTHS,
    seed=st.integers(0, 2**32 - 1),
    style=st.sampled_from(["bytes", "few", "normal"]),
    tol=st.sampled_from(TOLERANCES),
    offsets=st.tuples(st.integers(0, 7), st.integers(0, 7)),
    stripe=st.sampled_from([None, (5, 7), (1000, 1500)]),
    rows=st.sampled_from([1, 3]),
)
def test_the_kernel_equals_the_oracle(pair, n, seed, style, tol, offsets, stripe, rows):
    rng = np.random.default_rng(seed)
    dt_a, dt_b = numpy_dtype(pair[0]), numpy_dtype(pair[1])
    a = _values(rng, dt_a, n, style if dt_a.kind != "c" else "normal")
    b = _perturb(rng, a, dt_b, style if dt_b == dt_a else "normal")
    shape = (rows, n // rows) if n % rows == 0 and rows > 1 else (n,)
    a, b = _unaligned(a.reshape(shape), offsets[0]), _unaligned(b.reshape(shape), offsets[1])
    default = metrics.MIN_STRIPE, metrics.STRIPE
    if stripe:
        metrics.MIN_STRIPE, metrics.STRIPE = stripe
    try:
        got = diff_metrics(a, b, *tol)
    finally:
        metrics.MIN_STRIPE, metrics.STRIPE = default
    assert_matches(got, reference(a, b, *tol))


@pytest.mark.parametrize("stripe", [None, (3, 3)], ids=["sparse-blocks", "stripes-of-3"])
def test_ties_report_the_first_largest_difference(monkeypatch, stripe):
    if stripe:
        monkeypatch.setattr(metrics, "MIN_STRIPE", stripe[0])
        monkeypatch.setattr(metrics, "STRIPE", stripe[1])
    a = np.zeros(3000, np.float32)
    b = a.copy()
    b[[5, 700, 1500, 2999]] = [2.0, -2.0, -2.0, 2.0]  # the same |a-b| within a block, across blocks and stripes
    m = diff_metrics(a, b, 1e-5, 1e-8)
    assert (m.argmax, m.max_abs, m.tol_fail, m.b_at) == ([5], 2.0, 4, 2.0)
    b[5] = 1.0
    assert (diff_metrics(a, b, 1e-5, 1e-8).argmax, diff_metrics(a, b, 0, 0).b_at) == ([700], -2.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_the_result_does_not_depend_on_the_thread_count(monkeypatch, dtype):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(700_000).astype(numpy_dtype(dtype))
    b = (a.astype(np.float64) * (1 + rng.standard_normal(a.size) * 1e-3)).astype(a.dtype)
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("FTKIT_THREADS", threads)
        results.append(diff_metrics(a, b, 1e-3, 1e-6))
    assert results[0] == results[1]  # bit for bit: every sum rounded in the same order
    assert len(metrics._stripes(a.size)) > 1
