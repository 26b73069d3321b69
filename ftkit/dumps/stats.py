"""Statistics of one stored tensor for ``ftkit dump``: one pass, chunked, multi-threaded.

``tensor_stats(a)`` gives ``numel``, ``min``, ``max``, ``mean`` and ``std`` (population) over
the finite elements, and the NaN and Inf counts. Complex tensors count their real and
imaginary parts as elements; integers and bools have no non-finite values.

Each chunk is converted to float64 (exact for every stored dtype but 64-bit integers beyond
2^53) and reduced to (count, min, max, mean, M2); chunks are merged in order with Chan's
parallel update, so the variance needs no second pass over the data and does not suffer the
cancellation of a sum-of-squares formula. Stripes run on ``ftkit.tensors.parallel``'s pool.
Finite float64 values whose sum or squared deviations overflow (``1e308, 1e308, -1e308``) are
measured again scaled by ``2**-600`` (a power of two: exact), so their mean and std are finite
numbers, not ``inf`` / ``nan``; only such tensors pay the second pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ftkit.tensors.arrays import real_view, sum_squares
from ftkit.tensors.parallel import map_ordered, stripes

CHUNK = 1 << 16  # elements per inner step (float64 temporaries stay in the L2 cache)
_SCALE = 2.0**-600  # the second pass's factor for finite values whose sums overflow


@dataclass
class _Moments:
    n: int = 0
    lo: float = math.inf
    hi: float = -math.inf
    mean: float = 0.0
    m2: float = 0.0
    nan: int = 0
    inf: int = 0

    def add(self, n: int, lo: float, hi: float, mean: float, m2: float) -> None:
        """Chan et al.'s merge of a chunk's moments into the running ones."""
        if n == 0:
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)

    def merge(self, o: _Moments) -> None:
        self.add(o.n, o.lo, o.hi, o.mean, o.m2)
        self.nan += o.nan
        self.inf += o.inf


def tensor_stats(a: np.ndarray) -> dict[str, Any]:
    """min, max, mean, std (population) over finite elements, plus NaN/Inf counts and numel."""
    flat = real_view(a).reshape(-1)
    floating = flat.dtype.kind == "f" or flat.dtype.name == "bfloat16" or flat.dtype.name.startswith("float8_")

    def stripe(span: tuple[int, int], scale: float = 1.0) -> _Moments:
        acc = _Moments()
        buf = np.empty(min(CHUNK, span[1] - span[0]), np.float64)
        for i in range(span[0], span[1], CHUNK):
            src = flat[i : min(i + CHUNK, span[1])]
            c = buf[: src.size]
            c[...] = src
            if scale != 1.0:
                c *= scale
            if floating:
                s = float(np.add.reduce(c))
                if not math.isfinite(s):
                    bad_nan, bad_inf = np.isnan(c), np.isinf(c)
                    acc.nan += int(np.count_nonzero(bad_nan))
                    acc.inf += int(np.count_nonzero(bad_inf))
                    c = c[~(bad_nan | bad_inf)]
                    if not c.size:
                        continue
                    s = float(np.add.reduce(c))
            else:
                s = float(np.add.reduce(c))
            lo, hi, mean = float(c.min()), float(c.max()), s / c.size
            dev = np.subtract(c, mean, out=c)
            acc.add(c.size, lo, hi, mean, sum_squares(dev))
        return acc

    def moments(scale: float = 1.0) -> _Moments:
        def quiet_stripe(span: tuple[int, int]) -> _Moments:
            with np.errstate(all="ignore"):  # an overflowing sum is a value here (inf), not a warning to print
                return stripe(span, scale)

        total = _Moments()
        for part in map_ordered(quiet_stripe, stripes(flat.size)):
            total.merge(part)
        return total

    total = moments()
    n, unscale = total.n, 1.0
    if n and floating and not (math.isfinite(total.mean) and math.isfinite(total.m2)):
        scaled = moments(_SCALE)  # finite values whose sums overflow float64: measure them scaled
        total.mean, total.m2, unscale = scaled.mean, scaled.m2, 1.0 / _SCALE
    return {
        "numel": int(a.size),
        "min": total.lo if n else None,
        "max": total.hi if n else None,
        "mean": total.mean * unscale if n else None,
        "std": math.sqrt(total.m2 / n) * unscale if n else None,
        "nan": total.nan,
        "inf": total.inf,
    }
