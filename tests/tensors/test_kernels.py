"""The compiled compare kernels read every element format exactly, check their arguments, and
are a required part of the install (the metrics themselves: tests/dumps/test_metrics_oracle.py)."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from ftkit import tensors
from ftkit.errors import InstallError
from ftkit.tensors import _kernels
from ftkit.tensors.arrays import numpy_dtype
from ftkit.tensors.kernels import diff_stripe, element_format, nonfinite

ONE_BYTE = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]
ONE_BYTE += ["int8", "uint8", "bool"]


@pytest.mark.parametrize("name", ["float16", "bfloat16", "int16", "uint16", *ONE_BYTE])
def test_every_bit_pattern_widens_to_numpys_value(name):
    """|v - 1| of each single element equals numpy's float64 value: the kernel's half and
    bfloat16 decoding and the one-byte tables are exact (sign, subnormals, Inf, NaN)."""
    dt = numpy_dtype(name)
    patterns = np.arange(1 << (8 * dt.itemsize), dtype=np.uint32).astype(f"uint{8 * dt.itemsize}").view(dt)
    with np.errstate(all="ignore"):
        want = patterns.astype(np.float64)
    one = np.ones(1, dt)
    for i, v in enumerate(want):
        p = diff_stripe(patterns[i : i + 1], one, 0.0, 0.0)
        if np.isfinite(v):
            assert (max(p.best, 0.0), p.finite_n, p.nan_a, p.inf_a) == (abs(v - 1.0), 1, 0, 0), (i, v)
        else:
            assert (p.finite_n, p.nan_a, p.inf_a) == (0, int(np.isnan(v)), int(np.isinf(v))), (i, v)
    assert nonfinite(patterns) == (int(np.isnan(want).sum()), int(np.isinf(want).sum()))


def test_wide_formats_and_unaligned_buffers():
    rng = np.random.default_rng(2)
    for name in ("float32", "float64", "int32", "uint32", "int64", "uint64"):
        dt = np.dtype(name)
        raw = rng.integers(0, 256, 1 + 3001 * dt.itemsize, dtype=np.uint8)
        a = np.frombuffer(raw.tobytes(), dt, 3001, 1)  # one byte off alignment
        assert not a.flags.aligned
        with np.errstate(all="ignore"):
            v = a.astype(np.float64)
        p = diff_stripe(a, np.zeros(a.size, dt), 0.0, 0.0)
        fin = np.isfinite(v)
        assert p.nan_a == int(np.isnan(v).sum()) and p.finite_n == int(fin.sum())
        assert p.best == np.abs(v[fin]).max() and p.best_at == int(np.argmax(np.where(fin, np.abs(v), -1)))


def test_arguments_are_checked():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="element counts"):
        diff_stripe(a, np.zeros(5, np.float32), 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown element format"):
        _kernels.diff(a, a, 99, 1, None, None, 0.0, 0.0)
    with pytest.raises(ValueError, match="256 float64"):
        _kernels.diff(a, a, 10, 10, b"short", b"short", 0.0, 0.0)
    with pytest.raises(ValueError, match="table"):
        _kernels.nonfinite(a, 10, None)
    with pytest.raises(TypeError, match="do not read complex64"):
        diff_stripe(np.zeros(2, np.complex64), np.zeros(2, np.complex64), 0.0, 0.0)
    assert element_format(np.dtype("complex64")) is None


def test_a_missing_build_is_an_import_error_that_says_how_to_build(monkeypatch):
    monkeypatch.setitem(sys.modules, "ftkit.tensors._kernels", None)  # as if the .so were absent
    monkeypatch.delattr(tensors, "_kernels")
    monkeypatch.delitem(sys.modules, "ftkit.tensors.kernels")
    with pytest.raises(InstallError, match="kernels .* are not built") as info:
        importlib.import_module("ftkit.tensors.kernels")
    assert isinstance(info.value, ImportError) and "build_ext --inplace" in (info.value.hint or "")
    assert info.value.exit_code == 2  # the CLI: one Error line and the hint, not an internal error
