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
(float32, float16, bfloat16 by a bit shift, float8), else to float64; sums are accumulated in
float64 across chunks. A chunk holding non-finite values, or whose float32 arithmetic
overflows, is redone in float64 with explicit masks. Chunks whose bits mostly agree measure
only the differing positions; chunks whose max relative difference proves every element within
``rtol`` skip the tolerance test. Work is split into stripes (at least four per thread, from
``CHUNK`` up to ``STRIPE`` elements) over ``ftkit.tensors.parallel``'s pool and merged in order,
so the result does not depend on the thread count.

Memory: a few chunk-sized buffers per stripe in work (allocated once per stripe, reused by its
chunks) on top of the inputs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ftkit.tensors.arrays import bits, compute_dtype, real_view, sum_squares
from ftkit.tensors.parallel import map_ordered, stripes, workers

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.tensors.xxh3 import Hasher

CHUNK = 1 << 16  # elements per inner step: inputs and buffers of a chunk stay in the L2 cache
STRIPE = 1 << 20  # most elements per task of diff_metrics (fewer tasks: less dispatch)
_SPARSE = 8  # measure only differing positions when fewer than 1/_SPARSE of a chunk differ
# When every |a-b| <= R·max(|a|,|b|) (R: the chunk's max_rel), then |a| <= |b| + |a-b| gives
# |a-b| <= R/(1-R)·|b|, so R <= rtol/(1+rtol) means no element fails |a-b| <= atol + rtol·|b|.
# Half that bound is used: the float rounding of R is a few ulps of R itself.
_REL_PASSES = 0.5
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


def nonfinite_counts(a: np.ndarray, threads: bool = True) -> tuple[int, int]:
    """``(nan, inf)`` counts of an array of any dtype (0, 0 for integers and bools).

    ``threads=False`` keeps the work on the calling thread (training ranks, whose thread
    count is fixed by their configuration)."""
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

    spans = stripes(flat.size)
    parts = map_ordered(part, spans) if threads else [part(s) for s in spans]
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
        self.bits_differ += o.bits_differ
        self.nonfinite_mismatch += o.nonfinite_mismatch
        self.nan_a, self.nan_b = self.nan_a + o.nan_a, self.nan_b + o.nan_b
        self.inf_a, self.inf_b = self.inf_a + o.inf_a, self.inf_b + o.inf_b
        self.finite_n += o.finite_n
        self.sxx += o.sxx
        if self.first_bits is None:
            self.first_bits = o.first_bits
        if self.first_bad is None:
            self.first_bad = o.first_bad
        self.add_diff((o.best, o.best_at, o.sum_abs, o.sdd, o.max_rel, o.tol_fail))

    def add_diff(self, diff: _Diff) -> None:
        """Fold one ``_Kernel.measure`` result in."""
        best, best_at, sum_abs, sdd, max_rel, tol_fail = diff
        self.sum_abs += sum_abs
        self.sdd += sdd
        self.max_rel = max(self.max_rel, max_rel)
        self.tol_fail += tol_fail
        if best > self.best:
            self.best, self.best_at = best, best_at


_Diff = tuple[float, "int | None", float, float, float, int]  # best, best_at, sum_abs, sdd, max_rel, tol_fail
_NO_DIFF: _Diff = (-1.0, None, 0.0, 0.0, 0.0, 0)


class _Scratch:
    """One stripe's reusable chunk buffers: no temporaries are allocated per chunk."""

    def __init__(self, cdt: np.dtype[Any], n: int) -> None:
        self.x, self.y = np.empty(n, cdt), np.empty(n, cdt)  # converted inputs
        self.d, self.t, self.u = np.empty(n, cdt), np.empty(n, cdt), np.empty(n, cdt)  # |a - b|, work
        self.ne, self.gt = np.empty(n, np.bool_), np.empty(n, np.bool_)


def _convert(src: np.ndarray, cdt: np.dtype[Any], out: np.ndarray) -> np.ndarray:
    """``src`` as ``cdt`` values, in ``out`` unless it already is ``cdt`` (no copy then).
    bfloat16 -> float32 is a 16-bit shift of the bits (exact, NaN payloads included), several
    times faster than the generic cast; other types cast into ``out``."""
    if src.dtype == cdt:
        return src
    dst = out[: src.size]
    if src.dtype.name == "bfloat16" and cdt == np.float32:
        np.left_shift(src.view(np.uint16), 16, out=dst.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(dst, src, casting="unsafe")
    return dst


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
        scratch = _Scratch(self.cdt, min(CHUNK, stop - start))
        try:
            with np.errstate(all="ignore"):
                for i in range(start, stop, CHUNK):
                    self.chunk(p, i, min(i + CHUNK, stop), scratch)
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

    def chunk(self, p: _Part, i: int, j: int, s: _Scratch) -> None:
        """Fold chunk ``[i, j)`` into ``p`` (numpy errors are ignored by the caller)."""
        ac, bc = self.fa[i:j], self.fb[i:j]
        n = j - i
        if self.same:
            ne = np.not_equal(bits(ac), bits(bc), out=s.ne[:n])
            nb = int(np.count_nonzero(ne))
            if nb and p.first_bits is None:
                p.first_bits = i + int(np.argmax(ne))
        else:
            ne, nb = None, n
            if n and p.first_bits is None:
                p.first_bits = i
        x = _convert(ac, self.cdt, s.x)
        sx = sum_squares(x)
        if nb == 0:  # bitwise equal chunk: only the energy (2Σa², a = b) and the count
            if not math.isfinite(sx):
                return self.masked(p, i, j)
            p.sxx += 2 * sx
            p.finite_n += n
            return None
        if ne is not None and nb * _SPARSE < n:  # a = b off the differing positions
            where = np.flatnonzero(ne)
            xd, yd = x[where], bc[where].astype(self.cdt)
            sxx = 2 * sx + (sum_squares(yd) - sum_squares(xd))
        else:
            where, xd, yd = None, x, _convert(bc, self.cdt, s.y)
            sxx = sx + sum_squares(yd)
        if not math.isfinite(sxx):  # NaN/Inf somewhere, or float32 squares overflowed
            return self.masked(p, i, j)
        diff = self.measure(i, xd, yd, where, s)
        if not (math.isfinite(diff[2]) and math.isfinite(diff[3])):
            return self.masked(p, i, j)  # float32 overflow of a - b: redo in float64
        p.sxx += sxx
        p.finite_n += n
        p.bits_differ += nb
        p.add_diff(diff)
        return None

    def measure(
        self, i: int, x: np.ndarray, y: np.ndarray, where: np.ndarray | None, s: _Scratch | None = None
    ) -> _Diff:
        """Difference metrics of finite ``x``/``y`` (``where``: their chunk positions, or all),
        in ``s``'s buffers when given (and large enough), else in temporaries."""
        k = x.size
        if not k:
            return _NO_DIFF
        if s is None or k > s.d.size or x.dtype != s.d.dtype:
            s = _Scratch(x.dtype, k)
        d, t, u, gt = s.d[:k], s.t[:k], s.u[:k], s.gt[:k]
        np.subtract(x, y, out=d)
        np.abs(d, out=d)
        m = int(np.argmax(d))
        best, best_at = float(d[m]), i + (m if where is None else int(where[m]))
        sum_abs = float(np.add.reduce(d))  # pairwise summation: relative error ~1e-6 in float32
        sdd = sum_squares(d)
        np.abs(x, out=t)
        np.abs(y, out=u)
        np.maximum(t, u, out=t)
        np.divide(d, t, out=t)  # 0/0 = NaN where both are 0 (and d is 0): fmax skips it
        rel = float(np.fmax.reduce(t))
        if self.rtol == 0 and self.atol == 0:  # --exact: any numeric difference
            tol_fail = int(np.count_nonzero(d))
        elif rel <= _REL_PASSES * self.rtol / (1 + self.rtol):  # no element can fail: skip the test
            tol_fail = 0
        else:
            np.multiply(u, self.rtol, out=t)
            np.add(t, self.atol, out=t)
            tol_fail = int(np.count_nonzero(np.greater(d, t, out=gt)))
        return best, best_at, sum_abs, sdd, (rel if rel == rel else 0.0), tol_fail

    def masked(self, p: _Part, i: int, j: int) -> None:
        """The general path for a chunk with non-finite values (or float32 overflow): float64."""
        x, y = self.fa[i:j].astype(np.float64), self.fb[i:j].astype(np.float64)
        q = _Part()
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
        q.add_diff(self.measure(i, xf, yf, where))
        q.sxx = sum_squares(xf) + sum_squares(yf)
        q.finite_n = int(where.size)
        if self.same:
            q.bits_differ = int(np.count_nonzero(bits(self.fa[i:j]) != bits(self.fb[i:j])))
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
    step = min(STRIPE, max(CHUNK, -(-fa.size // (4 * workers()))))  # small tensors use every core too
    for part in map_ordered(kernel.stripe, list(enumerate(stripes(fa.size, step)))):
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
