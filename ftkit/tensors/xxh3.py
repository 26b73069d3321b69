"""Streaming xxh3-128 that releases the GIL, so several threads hash at once.

python-xxhash holds the GIL while it hashes, which serialises every hashing thread. The
same C functions are exported by python-xxhash's own extension module (``XXH3_createState``,
``XXH3_128bits_reset/update/digest``); called through ``ctypes`` (which releases the GIL for
the duration of a foreign call) they hash in parallel. ``new()`` returns such a hasher when
the symbols are there and give the known answer of ``xxhash.xxh3_128`` (checked once), and a
plain ``xxhash.xxh3_128`` object otherwise: the digest is the same either way, only the
parallelism differs.

``update`` takes bytes or a numpy array (any dtype, C-contiguous; read-only arrays over file
mappings included); ``hexdigest`` gives the canonical (big-endian) 32 hex chars.

``chunk_digests(flat, chunk)`` is ``XXH3_64bits`` of each ``chunk``-byte piece of a flat uint8
array (the last piece may be shorter), as a uint64 array: the same library's function, called
chunk after chunk by ftkit's compiled kernels without the GIL (``_kernels.chunk_hashes`` given
its address; ``xxhash.xxh3_64_intdigest`` where the symbols are missing): the host half of the
``ftkit-fp2`` fingerprint.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Protocol

import numpy as np
import xxhash


class Hasher(Protocol):
    def update(self, data: Any) -> None: ...

    def hexdigest(self) -> str: ...


class _Hash128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


class _CHasher:
    """xxh3-128 state in C memory, updated without the GIL."""

    def __init__(self, lib: Any, seed: bytes) -> None:
        self._lib = lib
        self._state = lib.XXH3_createState()
        if not self._state:
            raise MemoryError("XXH3_createState failed")
        lib.XXH3_128bits_reset(self._state)
        if seed:
            self.update(seed)

    def update(self, data: Any) -> None:
        if isinstance(data, bytes):
            self._lib.XXH3_128bits_update_dispatch(self._state, data, len(data))
            return
        arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        if not arr.flags.c_contiguous:
            raise ValueError("xxh3 update needs contiguous data")
        if arr.nbytes:
            self._lib.XXH3_128bits_update_dispatch(self._state, ctypes.c_void_p(arr.ctypes.data), arr.nbytes)

    def hexdigest(self) -> str:
        h = self._lib.XXH3_128bits_digest(self._state)
        return f"{h.high64:016x}{h.low64:016x}"

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.XXH3_freeState(state)


@functools.lru_cache(maxsize=1)
def _library() -> Any | None:
    """The ctypes handle on python-xxhash's extension, or ``None`` when unusable."""
    try:
        import importlib

        lib = ctypes.CDLL(importlib.import_module("xxhash._xxhash").__file__)
        lib.XXH3_createState.restype = ctypes.c_void_p
        lib.XXH3_freeState.argtypes = [ctypes.c_void_p]
        lib.XXH3_128bits_reset.argtypes = [ctypes.c_void_p]
        lib.XXH3_128bits_update_dispatch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.XXH3_128bits_digest.argtypes = [ctypes.c_void_p]
        lib.XXH3_128bits_digest.restype = _Hash128
        lib.XXH3_64bits.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.XXH3_64bits.restype = ctypes.c_uint64
        probe = b"ftkit xxh3 known answer" * 7
        h = _CHasher(lib, probe[:5])
        h.update(np.frombuffer(probe[5:], np.uint8))
        if h.hexdigest() != xxhash.xxh3_128(probe).hexdigest():
            return None
        if lib.XXH3_64bits(probe, len(probe)) != xxhash.xxh3_64_intdigest(probe):
            return None
        return lib
    except (OSError, AttributeError, ImportError, MemoryError):  # pragma: no cover - other builds
        return None


def new(seed: bytes = b"") -> Hasher:
    """A fresh xxh3-128 hasher that has already consumed ``seed``."""
    lib = _library()
    if lib is None:  # pragma: no cover - python-xxhash without exported symbols
        return xxhash.xxh3_128(seed)
    return _CHasher(lib, seed)


def parallel_capable() -> bool:
    """Whether hashing threads run in parallel (the GIL-free path is in use)."""
    return _library() is not None


def chunk_digests(flat: np.ndarray, chunk: int) -> np.ndarray:
    """``XXH3_64bits`` of each ``chunk``-byte piece of ``flat`` (a C-contiguous uint8 array; the
    last piece may be shorter) as a uint64 array of ``ceil(len / chunk)`` entries."""
    n = flat.nbytes
    out = np.empty((n + chunk - 1) // chunk, dtype=np.uint64)
    lib, kernels = _library(), _chunk_kernel()
    if lib is not None and kernels is not None:  # one call: the loop in C, without the GIL
        kernels(ctypes.cast(lib.XXH3_64bits, ctypes.c_void_p).value, flat, chunk, out)
    elif lib is not None:  # a process without ftkit's compiled kernels (another interpreter's venv)
        fn, base = lib.XXH3_64bits, flat.ctypes.data
        for k, i in enumerate(range(0, n, chunk)):
            out[k] = fn(base + i, min(chunk, n - i))
    else:  # pragma: no cover - python-xxhash without exported symbols
        view = memoryview(flat.data).cast("B")
        for k, i in enumerate(range(0, n, chunk)):
            out[k] = xxhash.xxh3_64_intdigest(view[i : i + chunk])
    return out


@functools.lru_cache(maxsize=1)
def _chunk_kernel() -> Any | None:
    """``ftkit.tensors._kernels.chunk_hashes``, or ``None`` where the extension is not built for
    this interpreter (a vLLM server's virtualenv imports this module from the checkout)."""
    try:
        from ftkit.tensors import _kernels
    except ImportError:
        return None
    return _kernels.chunk_hashes
