"""Tensor bytes and the NaN/Inf scan, shared by the publisher and the verifier.

Both sides work on the same thing: a tensor's little-endian row-major bytes plus its
safetensors dtype code. ``host_bytes`` turns a torch tensor or a numpy array into that;
``count_nonfinite`` counts NaN and +/-Inf elements in such bytes for every floating code
(integers and bool have none), bit-exactly for the types numpy lacks (bfloat16, float8).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ftkit.tensors.st import ST_DTYPES, TORCH_TO_ST

CHUNK_BYTES = 16 << 20  # scan/hash/write granularity: stays in cache, bounds temporaries

# code -> (numpy view dtype, how to count non-finite elements of that view)
_NUMPY_FLOATS = {"F32": np.float32, "F64": np.float64, "C64": np.float32}
# integer-view codes: (view dtype, exponent mask, value of the mask for NaN/Inf) or an exact NaN byte
# (float16 too: numpy's isfinite on float16 runs at ~1.7 GB/s, the mask at ~5 GB/s, measured)
_MASKED = {
    "F16": (np.uint16, 0x7C00, 0x7C00),
    "BF16": (np.uint16, 0x7F80, 0x7F80),
    "F8_E4M3": (np.uint8, 0x7F, 0x7F),  # e4m3fn: no infinities, NaN = S.1111.111
    "F8_E5M2": (np.uint8, 0x7C, 0x7C),  # IEEE-like: exponent all ones
}
# fnuz: the only NaN is 0x80, no inf; e8m0 (MX scales, powers of two): the only NaN is 0xFF, no inf
_NAN_BYTE = {"F8_E4M3FNUZ": 0x80, "F8_E5M2FNUZ": 0x80, "F8_E8M0": 0xFF}
FLOAT_CODES = frozenset(_NUMPY_FLOATS) | frozenset(_MASKED) | frozenset(_NAN_BYTE)

if sys.byteorder != "little":  # pragma: no cover - safetensors is little-endian by definition
    raise ImportError("ftkit.checkpoint needs a little-endian host")


def host_bytes(t: Any) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``(safetensors code, shape, flat uint8 array)`` of a torch tensor or numpy array.

    Torch tensors are detached, moved to the CPU and made contiguous (a copy only where
    needed); numpy arrays are made contiguous and little-endian. Raises ``ValueError`` for a
    dtype safetensors cannot hold.
    """
    if isinstance(t, np.ndarray):
        a = np.ascontiguousarray(t)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        name, shape = a.dtype.name, tuple(a.shape)
        flat = a.reshape(-1).view(np.uint8)
    else:
        import torch

        from ftkit.tensors.fingerprint import dtype_name

        x = t.detach().to("cpu").contiguous()
        name, shape = dtype_name(x.dtype), tuple(x.shape)
        flat = x.reshape(-1).view(torch.uint8).numpy() if x.numel() else np.empty(0, np.uint8)
    if name not in TORCH_TO_ST:
        raise ValueError(f"dtype {name} cannot be stored in safetensors")
    return TORCH_TO_ST[name], shape, flat


def dtype_of(code: str) -> str:
    """The torch dtype name of a safetensors code (``"BF16"`` -> ``"bfloat16"``)."""
    return ST_DTYPES[code][0]


def count_nonfinite(code: str, buf: Any) -> int:
    """How many NaN / +-Inf elements ``buf`` (bytes of dtype ``code``) holds; 0 for non-floats."""
    if code not in FLOAT_CODES:
        return 0
    raw = np.frombuffer(buf, dtype=np.uint8)
    total = 0
    for i in range(0, raw.size, CHUNK_BYTES):
        piece = raw[i : i + CHUNK_BYTES]
        if code in _NUMPY_FLOATS:
            total += int(piece.size // np.dtype(_NUMPY_FLOATS[code]).itemsize) - int(
                np.count_nonzero(np.isfinite(piece.view(_NUMPY_FLOATS[code])))
            )
        elif code in _MASKED:
            view, mask, bad = _MASKED[code]
            total += int(np.count_nonzero((piece.view(view) & mask) == bad))
        else:
            total += int(np.count_nonzero(piece == _NAN_BYTE[code]))
    return total
