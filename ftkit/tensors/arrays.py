"""Safetensors data as numpy arrays, without torch: dtypes, read-only mappings, torch bridges.

- ``numpy_dtype(code)``: the numpy dtype of a safetensors dtype code. bfloat16 and the float8
  types come from ``ml_dtypes`` (a small, well-kept numpy dtype extension), so their values
  convert to float32 exactly, with NaN/Inf semantics of the format.
- ``MappedFile(path)``: a read-only memory mapping of one safetensors file; ``array(info)``
  returns a zero-copy, read-only, C-contiguous array over a validated ``TensorInfo``. Pages
  are read when touched and ``release(info)`` unmaps them again, so memory follows what is
  being read, not the file size. The file
  must not shrink while it is mapped (the header reader checked its size; a concurrent
  truncation is outside the contract).
- ``bits(array)``: the same bytes as unsigned integers of the element size (bitwise compare).
- ``from_torch(t)``: a CPU torch tensor as a numpy array of the same bytes (zero copy when
  contiguous), for the training-side callers of numpy kernels.
"""

from __future__ import annotations

import functools
import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ftkit.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ftkit.tensors.st import TensorInfo

_UINT: dict[int, np.dtype[Any]] = {n: np.dtype(f"uint{8 * n}") for n in (1, 2, 4, 8)}


@functools.cache
def numpy_dtype(name: str) -> np.dtype[Any]:
    """numpy dtype for a torch-style dtype name (``"bfloat16"``, ``"float8_e4m3fn"``, ``"int64"``)."""
    if name in ("bfloat16",) or name.startswith("float8_"):
        import ml_dtypes

        dt: np.dtype[Any] = np.dtype(getattr(ml_dtypes, name))
        return dt
    return np.dtype(np.bool_) if name == "bool" else np.dtype(name)


def bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes viewed as unsigned integers of its element size (complex64: uint64)."""
    out: np.ndarray = a.view(_UINT[a.dtype.itemsize])
    return out


def sum_squares(x: np.ndarray) -> float:
    """Σx² of a 1-d array, accumulated in its dtype by ``einsum``'s own SIMD loop: not a BLAS
    call, whose worker threads spin against ours (and against other processes) and made a
    64K-element dot product take milliseconds on a loaded machine."""
    return float(np.einsum("i,i->", x, x))


def real_view(a: np.ndarray) -> np.ndarray:
    """Complex arrays as their (real, imaginary) float pairs along a trailing axis; else ``a``."""
    if a.dtype.kind == "c":
        flat = np.ascontiguousarray(a).reshape(-1)
        return flat.view(np.float32 if a.dtype.itemsize == 8 else np.float64).reshape(*a.shape, 2)
    return a


class MappedFile:
    """A read-only mapping of one file; ``array(info)`` views a tensor's bytes as an array."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot map {path}: {getattr(exc, 'strerror', None) or exc}", "check the file") from exc
        self.size = size

    def array(self, info: TensorInfo) -> np.ndarray:
        """Zero-copy read-only array of ``info`` (shape and dtype from the validated header)."""
        if info.end > self.size:
            raise InputError(
                f"{self.path} shrank to {self.size} bytes while reading tensor {info.name!r}",
                "do not modify dumps while reading them",
            )
        dtype = numpy_dtype(info.dtype)
        if info.nbytes == 0 or self._mm is None:
            return np.empty(info.shape, dtype)
        flat = np.frombuffer(self._mm, dtype=dtype, count=info.numel, offset=info.start)
        return flat.reshape(info.shape)

    def release(self, info: TensorInfo) -> None:
        """Drop ``info``'s pages from this process's mapping (``MADV_DONTNEED``): the resident
        set stays near what is being worked on, however large the file. The data stays in the
        page cache; touching an array over it again simply maps the pages back in."""
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED") or info.nbytes == 0:
            return
        start = info.start - info.start % mmap.PAGESIZE
        end = min(info.end, self.size)
        if end > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        """Drop the mapping; arrays handed out keep it alive until they are released."""
        self._mm = None


def from_torch(t: torch.Tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array with the same dtype semantics and bytes.

    bfloat16 and float8 go through an integer view of the same size (zero copy); complex32
    and other dtypes without a numpy equivalent raise ``TypeError``.
    """
    from ftkit.tensors.fingerprint import dtype_name

    t = t.detach().cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    name = dtype_name(t.dtype)
    try:
        target = numpy_dtype(name)
    except (TypeError, AttributeError) as exc:
        raise TypeError(f"no numpy dtype for torch {t.dtype}") from exc
    if name == "bfloat16" or name.startswith("float8_"):
        import torch

        raw = t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()
        return raw.view(target)
    return t.numpy()
