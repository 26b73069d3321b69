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

CHUNK = 1 << 18  # elements; 2 MiB of float64 per temporary stays cache friendly
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


def equal_metrics(t: torch.Tensor) -> Metrics:
    """Metrics of a bitwise-equal pair: all differences zero, non-finite counts of ``t``."""
    nan, inf = nonfinite_counts(t)
    return Metrics(t.numel(), True, nan_a=nan, nan_b=nan, inf_a=inf, inf_b=inf)


def nonfinite_counts(t: torch.Tensor) -> tuple[int, int]:
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
        c = flat[i : i + CHUNK].to(torch.float64)
        nan += int(torch.isnan(c).sum())
        inf += int(torch.isinf(c).sum())
    return nan, inf


def diff_metrics(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> Metrics:
    """Full metrics of two tensors of the same shape (dtypes may differ)."""
    import torch

    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    same_dtype = a.dtype == b.dtype
    if a.is_complex() or b.is_complex():  # compare real and imaginary parts as a trailing dim of 2
        a, b = (torch.view_as_real(t.to(torch.complex128)) for t in (a, b))
    shape = tuple(a.shape)
    fa, fb = a.reshape(-1), b.reshape(-1)
    acc = _Accumulator(Metrics(fa.numel(), False), rtol, atol)
    for i in range(0, fa.numel(), CHUNK):
        ac, bc = fa[i : i + CHUNK], fb[i : i + CHUNK]
        if same_dtype:
            acc.bits(i, bits_view(ac) != bits_view(bc))
        else:
            acc.m.bits_differ += ac.numel()
        acc.values(i, ac.to(torch.float64), bc.to(torch.float64))
    m = acc.finish(same_dtype)
    at = acc.best_at if m.max_abs > 0 else acc.first_bad if acc.first_bad is not None else acc.first_bits
    if at is not None:
        m.argmax = _unravel(at, shape)
        m.a_at, m.b_at = float(fa[at].to(torch.float64)), float(fb[at].to(torch.float64))
    return m


class _Accumulator:
    """Running sums of ``diff_metrics`` over chunks (absolute offsets ``i``)."""

    def __init__(self, m: Metrics, rtol: float, atol: float) -> None:
        self.m, self.rtol, self.atol = m, rtol, atol
        self.sum_abs = self.sxy = self.sxx = 0.0
        self.finite_n = 0
        self.best = -1.0
        self.best_at: int | None = None
        self.first_bad: int | None = None
        self.first_bits: int | None = None

    def bits(self, i: int, ne: torch.Tensor) -> None:
        import torch

        n = int(torch.count_nonzero(ne))
        if n and self.first_bits is None:
            self.first_bits = i + int(torch.nonzero(ne)[0, 0])
        self.m.bits_differ += n

    def values(self, i: int, a64: torch.Tensor, b64: torch.Tensor) -> None:
        import torch

        m = self.m
        d = (a64 - b64).abs_()
        fin = torch.isfinite(a64) & torch.isfinite(b64)
        n_fin = int(torch.count_nonzero(fin))
        if n_fin != fin.numel():  # rare: count and mask the non-finite positions
            na, nb, xa, xb = torch.isnan(a64), torch.isnan(b64), torch.isinf(a64), torch.isinf(b64)
            m.nan_a, m.nan_b = m.nan_a + int(torch.count_nonzero(na)), m.nan_b + int(torch.count_nonzero(nb))
            m.inf_a, m.inf_b = m.inf_a + int(torch.count_nonzero(xa)), m.inf_b + int(torch.count_nonzero(xb))
            mism = ~fin & ~((na & nb) | (a64 == b64))
            n_mism = int(torch.count_nonzero(mism))
            if n_mism and self.first_bad is None:
                self.first_bad = i + int(torch.nonzero(mism)[0, 0])
            m.nonfinite_mismatch += n_mism
            d.masked_fill_(~fin, 0.0)
            a64, b64 = a64.masked_fill(~fin, 0.0), b64.masked_fill(~fin, 0.0)
        self.finite_n += n_fin
        if d.numel():
            top, j = torch.max(d, 0)
            if float(top) > self.best:
                self.best, self.best_at = float(top), i + int(j)
        self.sum_abs += float(d.sum())
        abs_b = b64.abs()
        den = torch.maximum(a64.abs(), abs_b).clamp_min_(torch.finfo(torch.float64).tiny)
        if d.numel():
            m.max_rel = max(m.max_rel, float((d / den).max()))
        m.tol_fail += int(torch.count_nonzero(d > abs_b.mul_(self.rtol).add_(self.atol)))
        self.sxy += float(torch.dot(a64, b64))
        self.sxx += float(torch.dot(a64, a64)) + float(torch.dot(b64, b64))

    def finish(self, same_dtype: bool) -> Metrics:
        m = self.m
        m.tol_fail += m.nonfinite_mismatch
        m.max_abs = max(self.best, 0.0)
        m.mean_abs = self.sum_abs / self.finite_n if self.finite_n else 0.0
        m.dissimilarity = 1.0 - 2.0 * self.sxy / self.sxx if self.sxx > 0 else 0.0
        m.bitwise_equal = same_dtype and m.bits_differ == 0
        return m


def bits_view(flat: torch.Tensor) -> torch.Tensor:
    import torch

    return flat.view(getattr(torch, _INT_VIEW[flat.element_size()]))


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index //= dim if dim else 1
    return list(reversed(out))
