"""Per-pair metrics of two arrays: chunked, multi-threaded numpy kernels, no torch.

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

Arithmetic: values are converted per chunk to float32 when both dtypes convert to it exactly
(float32, float16, bfloat16, float8), else to float64; sums are accumulated in float64
across chunks. A chunk holding non-finite values, or whose float32 arithmetic overflows, is
redone in float64 with explicit masks. Chunks whose bits mostly agree measure only the
differing positions. Work is split into stripes over ``ftkit.tensors.parallel``'s pool and
merged in order, so the result does not depend on the thread count.

Memory: a few chunk-sized temporaries per thread on top of the inputs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ftkit.tensors.arrays import bits, compute_dtype, real_view, sum_squares
from ftkit.tensors.parallel import map_ordered, stripes

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.tensors.xxh3 import Hasher

CHUNK = 1 << 16  # elements per inner step: temporaries stay in the L2 cache
_SPARSE = 8  # measure only differing positions when fewer than 1/_SPARSE of a chunk differ
_INF = math.inf


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

    @property
    def nonfinite(self) -> bool:
        return bool(self.nan_a or self.nan_b or self.inf_a or self.inf_b)


def equal_metrics(a: np.ndarray) -> Metrics:
    """Metrics of a bitwise-equal pair: all differences zero, non-finite counts of ``a``."""
    nan, inf = nonfinite_counts(a)
    return Metrics(a.size, True, nan_a=nan, nan_b=nan, inf_a=inf, inf_b=inf)


def nonfinite_counts(a: np.ndarray) -> tuple[int, int]:
    """``(nan, inf)`` counts of an array of any dtype (0, 0 for integers and bools)."""
    flat = real_view(a).reshape(-1)
    if flat.dtype.kind not in "fV" and not _is_ml_float(flat.dtype):
        return 0, 0
    cdt = compute_dtype(str(flat.dtype))

    def part(span: tuple[int, int]) -> tuple[int, int]:
        nan = inf = 0
        with np.errstate(all="ignore"):
            for i in range(span[0], span[1], CHUNK):
                x = flat[i : min(i + CHUNK, span[1])].astype(cdt, copy=False)
                if math.isfinite(float(np.add.reduce(x, dtype=np.float64))):
                    continue
                nan += int(np.count_nonzero(np.isnan(x)))
                inf += int(np.count_nonzero(np.isinf(x)))
        return nan, inf

    parts = map_ordered(part, stripes(flat.size))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _is_ml_float(dt: np.dtype[Any]) -> bool:
    return bool(dt.name == "bfloat16" or dt.name.startswith("float8_"))


@dataclass
class _Part:
    """Partial sums of one stripe; ``merge`` folds them in stripe order."""

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

    def merge(self, o: _Part) -> None:
        for name in ("bits_differ", "nonfinite_mismatch", "nan_a", "nan_b", "inf_a", "inf_b", "finite_n", "tol_fail"):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.sum_abs += o.sum_abs
        self.sdd += o.sdd
        self.sxx += o.sxx
        self.max_rel = max(self.max_rel, o.max_rel)
        if self.first_bits is None:
            self.first_bits = o.first_bits
        if self.first_bad is None:
            self.first_bad = o.first_bad
        if o.best > self.best:
            self.best, self.best_at = o.best, o.best_at


class _Kernel:
    """The per-chunk work of ``diff_metrics`` over flat arrays ``fa``/``fb``."""

    def __init__(
        self, fa: np.ndarray, fb: np.ndarray, rtol: float, atol: float, hashers: Sequence[Hasher] = ()
    ) -> None:
        self.fa, self.fb, self.rtol, self.atol = fa, fb, rtol, atol
        self.same = fa.dtype == fb.dtype
        self.cdt = compute_dtype(str(fa.dtype), str(fb.dtype))
        self.hashers = hashers
        self._turn = 0
        self._failed = False
        self._cond = threading.Condition()

    def stripe(self, job: tuple[int, tuple[int, int]]) -> _Part:
        k, (start, stop) = job
        p = _Part()
        ok = False
        try:
            for i in range(start, stop, CHUNK):
                self.chunk(p, i, min(i + CHUNK, stop))
            ok = True
        finally:
            if self.hashers:  # hash the stripe while it is still in cache, in stripe order
                self._hash_in_turn(k, start, stop, ok)
        return p

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

    def chunk(self, p: _Part, i: int, j: int) -> None:
        ac, bc = self.fa[i:j], self.fb[i:j]
        n = j - i
        if self.same:
            ne = bits(ac) != bits(bc)
            nb = int(np.count_nonzero(ne))
            if nb and p.first_bits is None:
                p.first_bits = i + int(np.argmax(ne))
        else:
            ne, nb = None, n
            if n and p.first_bits is None:
                p.first_bits = i
        x, y = ac.astype(self.cdt, copy=False), bc.astype(self.cdt, copy=False)
        with np.errstate(all="ignore"):
            sx = sum_squares(x)
            if nb == 0:  # bitwise equal chunk: only the energy (2Σa², a = b) and the count
                if not math.isfinite(sx):
                    return self.masked(p, i, x, y)
                p.sxx += 2 * sx
                p.finite_n += n
                return None
            if ne is not None and nb * _SPARSE < n:  # a = b off the differing positions
                where = np.flatnonzero(ne)
                xd, yd = x[where], y[where]
                sxx = 2 * sx + (sum_squares(yd) - sum_squares(xd))
            else:
                where, xd, yd = None, x, y
                sxx = sx + sum_squares(y)
            if not math.isfinite(sxx):  # NaN/Inf somewhere, or float32 squares overflowed
                return self.masked(p, i, x, y)
            q = _Part()
            self.measure(q, i, xd, yd, where)
            if not (math.isfinite(q.sum_abs) and math.isfinite(q.sdd)):
                return self.masked(p, i, x, y)  # float32 overflow of a - b: redo in float64
        q.sxx, q.finite_n = sxx, n
        q.bits_differ, q.first_bits = nb, None
        p.merge(q)
        return None

    def measure(self, p: _Part, i: int, x: np.ndarray, y: np.ndarray, where: np.ndarray | None) -> None:
        """Difference metrics of finite ``x``/``y`` (``where``: their chunk positions, or all)."""
        if not x.size:
            return
        d = np.subtract(x, y)
        np.abs(d, out=d)
        k = int(np.argmax(d))
        p.best, p.best_at = float(d[k]), i + (k if where is None else int(where[k]))
        p.sum_abs = float(np.add.reduce(d))  # pairwise summation: relative error ~1e-6 in float32
        p.sdd = sum_squares(d)
        ay = np.abs(y)
        den = np.maximum(np.abs(x), ay)
        np.maximum(den, np.finfo(den.dtype).tiny, out=den)
        np.divide(d, den, out=den)
        p.max_rel = float(den.max())
        np.multiply(ay, self.rtol, out=ay)
        np.add(ay, self.atol, out=ay)
        p.tol_fail = int(np.count_nonzero(d > ay))

    def masked(self, p: _Part, i: int, x: np.ndarray, y: np.ndarray) -> None:
        """The general path for a chunk with non-finite values (or float32 overflow): float64."""
        x, y = x.astype(np.float64), y.astype(np.float64)
        q = _Part()
        with np.errstate(all="ignore"):
            na, nb_, xa, xb = np.isnan(x), np.isnan(y), np.isinf(x), np.isinf(y)
            q.nan_a, q.nan_b = int(np.count_nonzero(na)), int(np.count_nonzero(nb_))
            q.inf_a, q.inf_b = int(np.count_nonzero(xa)), int(np.count_nonzero(xb))
            fin = ~(na | nb_ | xa | xb)
            mism = ~fin & ~((na & nb_) | (x == y))
            q.nonfinite_mismatch = int(np.count_nonzero(mism))
            if q.nonfinite_mismatch:
                q.first_bad = i + int(np.argmax(mism))
            where = np.flatnonzero(fin)
            xf, yf = x[where], y[where]
            self.measure(q, i, xf, yf, where)
            q.sxx = sum_squares(xf) + sum_squares(yf)
        q.finite_n = int(where.size)
        if self.same:
            ne = bits(self.fa[i : i + x.size]) != bits(self.fb[i : i + x.size])
            q.bits_differ = int(np.count_nonzero(ne))
        else:
            q.bits_differ = int(x.size)
        p.merge(q)


def diff_metrics(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, hashers: Sequence[Hasher] = ()) -> Metrics:
    """Full metrics of two arrays of the same shape (dtypes may differ).

    ``hashers``: optionally two streaming hashers that are fed ``a``'s and ``b``'s bytes in
    order during the same pass (a fingerprint costs no second read of the data).
    """
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    ra, rb = real_view(a), real_view(b)
    shape = ra.shape
    fa, fb = np.ascontiguousarray(ra).reshape(-1), np.ascontiguousarray(rb).reshape(-1)
    kernel = _Kernel(fa, fb, rtol, atol, hashers)
    total = _Part()
    for part in map_ordered(kernel.stripe, list(enumerate(stripes(fa.size)))):
        total.merge(part)
    m = Metrics(fa.size, kernel.same and total.bits_differ == 0, total.bits_differ)
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
    return float(np.asarray(v).astype(np.float64))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index //= dim if dim else 1
    return list(reversed(out))
