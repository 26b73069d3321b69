"""Per-pair metrics of two tensors, streamed in chunks with float64 accumulation.

Definitions (over the flattened tensors; A is the first argument, B the reference):

- ``bitwise_equal``: same dtype, shape and bytes (NaNs compare by bits, -0.0 != +0.0);
- ``bits_differ``: elements whose bit patterns differ;
- ``max_abs`` / ``mean_abs``: max / mean of |a - b| over positions where both are finite;
- ``max_rel``: max of |a - b| / max(|a|, |b|) over those positions (0 where both are 0;
  symmetric, between 0 and 2);
- ``dissimilarity``: 1 - 2·Σab / Σ(a² + b²) over those positions (0 identical, 1 orthogonal,
  2 opposite; 0 when both are all zero);
- ``argmax``: index of the largest |a - b|; when no finite difference exists, of the first
  non-finite mismatch, else of the first element whose bits differ (-0.0 vs 0.0, NaN
  payloads); ``a_at`` / ``b_at`` are the values there;
- ``nan_a``/``nan_b``/``inf_a``/``inf_b``: non-finite counts per side;
- ``nonfinite_mismatch``: positions where a non-finite value is not matched by the same
  value on the other side (NaN matches NaN);
- ``tol_fail``: positions failing ``|a - b| <= atol + rtol·|b|`` plus ``nonfinite_mismatch``.

Memory: one chunk (``CHUNK`` elements) of float64 temporaries on top of the two inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

CHUNK = 1 << 20
_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


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


def equal_metrics(t: "torch.Tensor") -> Metrics:
    """Metrics of a bitwise-equal pair: all differences zero, non-finite counts of ``t``."""
    nan, inf = nonfinite_counts(t)
    return Metrics(t.numel(), True, nan_a=nan, nan_b=nan, inf_a=inf, inf_b=inf)


def nonfinite_counts(t: "torch.Tensor") -> tuple[int, int]:
    """``(nan, inf)`` counts; one fast reduction decides the common all-finite case."""
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0, 0
    if t.is_complex():
        t = torch.view_as_real(t)
    try:
        total = t.sum(dtype=torch.float32 if t.element_size() < 4 else None)
        if bool(torch.isfinite(total)):  # NaN and Inf propagate through a sum
            return 0, 0
    except (RuntimeError, TypeError):  # dtypes without a CPU sum kernel (float8): count directly
        pass
    flat, nan, inf = t.reshape(-1), 0, 0
    for i in range(0, flat.numel(), CHUNK):
        c = flat[i:i + CHUNK].to(torch.float64)
        nan += int(torch.isnan(c).sum())
        inf += int(torch.isinf(c).sum())
    return nan, inf


def diff_metrics(a: "torch.Tensor", b: "torch.Tensor", rtol: float, atol: float) -> Metrics:
    """Full metrics of two tensors of the same shape (dtypes may differ)."""
    import torch

    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    shape = tuple(a.shape)
    same_dtype = a.dtype == b.dtype
    if a.is_complex() or b.is_complex():  # compare real and imaginary parts as a trailing dim of 2
        a, b = (torch.view_as_real(t.to(torch.complex128)) for t in (a, b))
        shape = tuple(a.shape)
    fa, fb = a.reshape(-1), b.reshape(-1)
    m = Metrics(fa.numel(), False)
    if same_dtype:
        ia, ib = bits_view(fa), bits_view(fb)
    floating = a.is_floating_point() or b.is_floating_point()
    sum_abs = sxy = sxx = 0.0
    finite_n = 0
    best, best_at, first_bad, first_bits = -1.0, None, None, None
    for i in range(0, m.numel, CHUNK):
        ac, bc = fa[i:i + CHUNK], fb[i:i + CHUNK]
        if same_dtype:
            ne = ia[i:i + CHUNK] != ib[i:i + CHUNK]
            n_ne = int(ne.sum())
            if n_ne and first_bits is None:
                first_bits = i + int(torch.nonzero(ne)[0, 0])
            m.bits_differ += n_ne
        else:
            m.bits_differ += ac.numel()
        a64, b64 = ac.to(torch.float64), bc.to(torch.float64)
        d = (a64 - b64).abs_()
        if floating:
            na, nb, xa, xb = torch.isnan(a64), torch.isnan(b64), torch.isinf(a64), torch.isinf(b64)
            m.nan_a, m.nan_b = m.nan_a + int(na.sum()), m.nan_b + int(nb.sum())
            m.inf_a, m.inf_b = m.inf_a + int(xa.sum()), m.inf_b + int(xb.sum())
            bad = na | nb | xa | xb
            if bool(bad.any()):
                mism = bad & ~((na & nb) | (a64 == b64))
                n_mism = int(mism.sum())
                if n_mism and first_bad is None:
                    first_bad = i + int(torch.nonzero(mism)[0, 0])
                m.nonfinite_mismatch += n_mism
                d.masked_fill_(bad, 0.0)
                a64, b64 = a64.masked_fill(bad, 0.0), b64.masked_fill(bad, 0.0)
            finite_n += ac.numel() - int(bad.sum())
        else:
            finite_n += ac.numel()
        if d.numel():
            j = int(torch.argmax(d))
            if float(d[j]) > best:
                best, best_at = float(d[j]), i + j
        sum_abs += float(d.sum())
        den = torch.maximum(a64.abs(), b64.abs())
        rel = d / den.clamp_min(torch.finfo(torch.float64).tiny)
        m.max_rel = max(m.max_rel, float(rel.max()) if rel.numel() else 0.0)
        m.tol_fail += int((d > atol + rtol * b64.abs()).sum())
        sxy += float(torch.dot(a64, b64))
        sxx += float(torch.dot(a64, a64) + torch.dot(b64, b64))
    m.tol_fail += m.nonfinite_mismatch
    m.max_abs = max(best, 0.0)
    m.mean_abs = sum_abs / finite_n if finite_n else 0.0
    m.dissimilarity = 1.0 - 2.0 * sxy / sxx if sxx > 0 else 0.0
    m.bitwise_equal = same_dtype and m.bits_differ == 0
    at = best_at if m.max_abs > 0 else first_bad if first_bad is not None else first_bits
    if at is not None:
        m.argmax = _unravel(at, shape)
        m.a_at, m.b_at = float(fa[at].to(torch.float64)), float(fb[at].to(torch.float64))
    return m


def bits_view(flat: "torch.Tensor") -> "torch.Tensor":
    import torch

    return flat.view(getattr(torch, _INT_VIEW[flat.element_size()]))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index //= dim if dim else 1
    return list(reversed(out))
