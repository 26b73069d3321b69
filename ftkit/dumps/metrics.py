"""Per-pair metrics of two arrays: the compiled kernel over stripes on the thread pool, no torch.

Definitions (over the flattened arrays; A is the first argument, B the reference):

- ``bitwise_equal``: same dtype, shape and bytes (NaNs compare by bits, -0.0 != +0.0);
- ``bits_differ``: elements whose bit patterns differ (every element when dtypes differ);
- ``nonfinite_mismatch``: positions where a NaN/Inf is not matched by the same value on the
  other side (NaN matches NaN); ``nan_a``/``nan_b``/``inf_a``/``inf_b``: counts per side;
- where both are finite: ``max_abs`` / ``mean_abs`` of |a - b|; ``max_rel``, the max of
  |a - b| / max(|a|, |b|) (0 where both are 0; between 0 and 2); ``dissimilarity``,
  Σ(a - b)² / Σ(a² + b²) (= 1 - 2·Σab / Σ(a² + b²): 0 identical, 1 orthogonal, 2 opposite;
  0 when both are all zero);
- a non-finite mismatch is the worst kind of difference: when ``nonfinite_mismatch > 0``,
  ``max_abs``, ``mean_abs``, ``max_rel`` and ``dissimilarity`` are ``inf``, so such a pair
  ranks first among the most different tensors and fails every finite bound;
- ``tol_fail``: positions failing ``|a - b| <= atol + rtol·|b|`` plus ``nonfinite_mismatch``;
- ``argmax``: index of the largest finite |a - b|; when there is a non-finite mismatch, of
  the first one; when nothing differs numerically, of the first element whose bits differ
  (-0.0 vs 0.0, NaN payloads); ``a_at`` / ``b_at`` are the values there.

Arithmetic: one pass of the compiled kernel (``ftkit.tensors.kernels``) per stripe reads
each element once, widens it to float64 (exact for every float format here, and for integers
up to 2^53) and computes all of the above at once; blocks whose bits agree cost a bit compare
and Σa². Sums are float64. Work is split into stripes whose bounds depend only on the element
count (from ``MIN_STRIPE`` up to ``STRIPE`` elements), run over ``ftkit.tensors.parallel``'s
pool without the GIL and merged in order, so the result does not depend on the thread count.

Memory: nothing beyond the inputs but a few KiB of stack per stripe in work.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ftkit.tensors.arrays import real_view
from ftkit.tensors.kernels import StripePart, diff_stripe, element_format, nonfinite
from ftkit.tensors.parallel import map_ordered, stripes

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.tensors.xxh3 import Hasher

MIN_STRIPE = 1 << 16  # fewest elements per task: smaller tensors run in one call
STRIPE = 1 << 20  # most elements per task (measured: 8 tasks of up to 1M elements per tensor took
# 15% less CPU than 16 of up to 256K on the 1 GiB bench pair, the same wall time)
_STRIPES = 8  # a mid-sized tensor is cut into this many stripes (fixed: not the thread count)
_INF = math.inf


#: The metrics a finding's evidence carries (``Metrics.brief``).
BRIEF = (
    "max_abs", "max_rel", "mean_abs", "dissimilarity", "bits_differ", "tol_fail",
    "argmax", "a_at", "b_at", "nan_a", "nan_b", "inf_a", "inf_b",
)  # fmt: skip


@dataclass
class Metrics:
    numel: int
    bitwise_equal: bool
    bits_differ: int = 0
    tol_fail: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    dissimilarity: float = 0.0
    argmax: list[int] | None = None
    a_at: float | None = None
    b_at: float | None = None
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    nonfinite_mismatch: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line of the worst differences (a finding's message)."""
        parts = [f"max_abs={self.max_abs:.3g}", f"max_rel={self.max_rel:.3g}"]
        parts.append(f"dissimilarity={self.dissimilarity:.3g}")
        if self.argmax is not None:
            parts.append(f"at {self.argmax} (A={self.a_at!r}, B={self.b_at!r})")
        if self.nan_a or self.nan_b:
            parts.append(f"NaN A={self.nan_a} B={self.nan_b}")
        if self.inf_a or self.inf_b:
            parts.append(f"Inf A={self.inf_a} B={self.inf_b}")
        return ", ".join(parts)

    def brief(self) -> dict[str, Any]:
        """The metrics a finding's evidence carries."""
        return {k: v for k, v in self.to_dict().items() if k in BRIEF}

    @property
    def nonfinite(self) -> bool:
        return bool(self.nan_a or self.nan_b or self.inf_a or self.inf_b)


def equal_metrics(a: np.ndarray) -> Metrics:
    """Metrics of a bitwise-equal pair: all differences zero, non-finite counts of ``a``."""
    nan, inf = nonfinite_counts(a)
    return Metrics(a.size, True, nan_a=nan, nan_b=nan, inf_a=inf, inf_b=inf)


def nonfinite_counts(a: np.ndarray, threads: bool = True) -> tuple[int, int]:
    """``(nan, inf)`` counts of an array of any dtype (0, 0 for integers and bools).

    ``threads=False`` keeps the work on the calling thread (training ranks, whose thread
    count is fixed by their configuration)."""
    flat = _flat(a)
    if flat.dtype.kind in "biu" or element_format(flat.dtype) is None:
        return 0, 0
    spans = _stripes(flat.size)
    parts = (
        [nonfinite(flat[i:j]) for i, j in spans]
        if not threads
        else map_ordered(lambda s: nonfinite(flat[s[0] : s[1]]), spans)
    )
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _flat(a: np.ndarray) -> np.ndarray:
    """``a``'s values as a flat C-contiguous array in native byte order (complex as float pairs);
    no copy for what the loader hands out."""
    flat = np.ascontiguousarray(real_view(a)).reshape(-1)
    return flat if flat.dtype.isnative else flat.astype(flat.dtype.newbyteorder("="))


def _stripes(n: int) -> list[tuple[int, int]]:
    """Stripe bounds of ``n`` elements: a function of ``n`` alone (sums then round the same way
    on any number of threads)."""
    return stripes(n, min(STRIPE, max(MIN_STRIPE, -(-n // _STRIPES))))


@dataclass
class _Total:
    """The stripes' partial results folded in stripe order."""

    bits_differ: int = 0
    first_bits: int | None = None
    first_bad: int | None = None
    nonfinite_mismatch: int = 0
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    finite_n: int = 0
    sum_abs: float = 0.0
    best: float = -1.0
    best_at: int | None = None
    max_rel: float = 0.0
    tol_fail: int = 0
    sdd: float = 0.0
    sxx: float = 0.0

    def merge(self, start: int, p: StripePart) -> None:
        """Fold in stripe ``p``, whose indexes count from ``start``."""
        self.bits_differ += p.bits_differ
        self.nonfinite_mismatch += p.nonfinite_mismatch
        self.nan_a, self.nan_b = self.nan_a + p.nan_a, self.nan_b + p.nan_b
        self.inf_a, self.inf_b = self.inf_a + p.inf_a, self.inf_b + p.inf_b
        self.finite_n += p.finite_n
        self.sum_abs += p.sum_abs
        self.sdd += p.sdd
        self.sxx += p.sxx
        self.max_rel = max(self.max_rel, p.max_rel)
        self.tol_fail += p.tol_fail
        if self.first_bits is None and p.first_bits >= 0:
            self.first_bits = start + p.first_bits
        if self.first_bad is None and p.first_bad >= 0:
            self.first_bad = start + p.first_bad
        if p.best > self.best:  # strictly: the first occurrence of the largest difference wins
            self.best, self.best_at = p.best, start + p.best_at


class _Stripes:
    """The per-stripe work of ``diff_metrics`` over flat arrays ``fa``/``fb``."""

    def __init__(
        self, fa: np.ndarray, fb: np.ndarray, rtol: float, atol: float, hashers: Sequence[Hasher] = ()
    ) -> None:
        self.fa, self.fb, self.rtol, self.atol = fa, fb, rtol, atol
        self.hashers = hashers
        self._turn = 0
        self._failed = False
        self._cond = threading.Condition()

    def stripe(self, job: tuple[int, tuple[int, int]]) -> StripePart:
        k, (start, stop) = job
        ok = False
        try:
            part = self.measure(start, stop)
            ok = True
        finally:
            if self.hashers:  # hash the stripe while it is still in cache, in stripe order
                self._hash_in_turn(k, start, stop, ok)
        return part

    def measure(self, start: int, stop: int) -> StripePart:
        """The kernel over elements ``[start, stop)`` of both sides."""
        return diff_stripe(self.fa[start:stop], self.fb[start:stop], self.rtol, self.atol)

    def _hash_in_turn(self, k: int, start: int, stop: int, ok: bool) -> None:
        """Wait until stripes 0..k-1 have hashed, hash stripe k (unless a stripe failed: the
        result is then an exception anyway), pass the turn on. Stripes start in order, so the
        one waited for is running or done; every stripe passes the turn on, even on errors."""
        with self._cond:
            self._cond.wait_for(lambda: self._turn == k)
        try:
            if ok and not self._failed:
                for h, flat in zip(self.hashers, (self.fa, self.fb)):
                    h.update(flat[start:stop])
            else:
                self._failed = True
        finally:
            with self._cond:
                self._turn = k + 1
                self._cond.notify_all()


def diff_metrics(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, hashers: Sequence[Hasher] = ()) -> Metrics:
    """Full metrics of two arrays of the same shape (dtypes may differ).

    ``rtol = atol = 0`` (``--exact``) makes ``tol_fail`` count every numeric difference.
    ``hashers``: optionally two streaming hashers that are fed ``a``'s and ``b``'s bytes in
    order during the same pass (a fingerprint costs no second read of the data).
    """
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    shape = real_view(a).shape
    fa, fb = _flat(a), _flat(b)
    work = _Stripes(fa, fb, rtol, atol, hashers)
    spans = _stripes(fa.size)
    total = _Total()
    for (start, _), part in zip(spans, map_ordered(work.stripe, list(enumerate(spans)))):
        total.merge(start, part)
    same = fa.dtype == fb.dtype
    m = Metrics(fa.size, same and total.bits_differ == 0, total.bits_differ)
    m.nan_a, m.nan_b, m.inf_a, m.inf_b = total.nan_a, total.nan_b, total.inf_a, total.inf_b
    m.nonfinite_mismatch = total.nonfinite_mismatch
    m.tol_fail = total.tol_fail + total.nonfinite_mismatch
    if total.nonfinite_mismatch:
        m.max_abs = m.mean_abs = m.max_rel = m.dissimilarity = _INF
        at = total.first_bad
    else:
        m.max_abs = max(total.best, 0.0)
        m.max_rel = total.max_rel
        m.mean_abs = total.sum_abs / total.finite_n if total.finite_n else 0.0
        m.dissimilarity = total.sdd / total.sxx if total.sxx > 0 else 0.0
        at = total.best_at if m.max_abs > 0 else total.first_bits
    if at is not None:
        m.argmax = _unravel(at, shape)
        m.a_at, m.b_at = _value(fa[at]), _value(fb[at])
    return m


def _value(v: Any) -> float:
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on a NaN it casts; NaN is the value
        return float(np.asarray(v).astype(np.float64))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index //= dim if dim else 1
    return list(reversed(out))
