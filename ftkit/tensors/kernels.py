"""The Python face of ftkit's compiled compare kernels (``ftkit/tensors/_kernels.c``).

- ``element_format(dtype)``: how the kernels read a numpy dtype's elements: a format code and,
  for one-byte formats (float8 variants, int8, uint8, bool), a table of the 256 float64 values
  the bytes stand for, built once from numpy/ml_dtypes' own conversion (so every float8
  variant's NaN/Inf/subnormal semantics are the library's). ``None`` for dtypes the kernels
  do not read (complex: see ``arrays.real_view``).
- ``diff_stripe(a, b, rtol, atol)``: every pair metric of two flat arrays of the same length
  in one pass (``StripePart``), without the GIL; indexes are relative to the arrays.
- ``nonfinite(a)``: ``(nan, inf)`` counts of a flat array, without the GIL.

The extension is part of the install (``pip install -e .`` compiles it; ``python setup.py
build_ext --inplace`` in a checkout): a missing build is an ``InstallError`` (an
``ImportError``; exit 2 with a hint at the CLI) that says how to build it, never a silent slow path.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from ftkit.errors import InstallError
from ftkit.tensors.arrays import bits

try:
    from ftkit.tensors import _kernels
except ImportError as exc:  # an incomplete install (tests/tensors/test_kernels.py simulates one)
    raise InstallError(
        f"ftkit's compiled kernels (ftkit.tensors._kernels) are not built ({exc})",
        "reinstall with `pip install -e .` (a C compiler and the Python headers are needed), or in a "
        "checkout used through PYTHONPATH run `python setup.py build_ext --inplace`",
    ) from exc

# Element format codes: the order of ``enum Fmt`` in _kernels.c.
_CODES = {
    "float64": 0,
    "float32": 1,
    "float16": 2,
    "bfloat16": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
}
_TABLE8 = 10


class StripePart(NamedTuple):
    """What ``diff_stripe`` measures; indexes are -1 when unset, sums are float64."""

    bits_differ: int
    first_bits: int  # first element whose bytes differ
    first_bad: int  # first non-finite mismatch
    nonfinite_mismatch: int
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    finite_n: int  # positions where both values are finite
    sum_abs: float  # Σ|a - b| over them
    best: float  # largest |a - b| (-1 when none), at best_at (its first occurrence)
    best_at: int
    max_rel: float
    tol_fail: int  # finite positions with |a - b| > atol + rtol·|b|
    sdd: float  # Σ(a - b)²
    sxx: float  # Σ(a² + b²)


@functools.cache
def element_format(dtype: np.dtype[Any]) -> tuple[int, bytes | None] | None:
    """``(code, table)`` of a dtype the kernels read (native byte order), else ``None``."""
    if not dtype.isnative:
        return None
    if dtype.name in _CODES:
        return _CODES[dtype.name], None
    if dtype.itemsize == 1 and (dtype.kind in "biu" or dtype.name.startswith("float8_")):
        with np.errstate(all="ignore"):
            table = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
        return _TABLE8, table.tobytes()
    return None


def _format(a: np.ndarray) -> tuple[int, bytes | None]:
    fmt = element_format(a.dtype)
    if fmt is None:
        raise TypeError(f"the compare kernels do not read {a.dtype}")
    return fmt


def diff_stripe(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> StripePart:
    """Pair metrics of flat, C-contiguous ``a`` and ``b`` (dtypes may differ; then every
    element counts as differing in bits). ``rtol = atol = 0`` counts every numeric difference."""
    (fa, ta), (fb, tb) = _format(a), _format(b)
    return StripePart(*_kernels.diff(bits(a), bits(b), fa, fb, ta, tb, rtol, atol))


def nonfinite(a: np.ndarray) -> tuple[int, int]:
    """``(nan, inf)`` of a flat, C-contiguous array of a dtype the kernels read."""
    fmt, table = _format(a)
    return _kernels.nonfinite(bits(a), fmt, table)
