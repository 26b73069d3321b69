"""The ``ftkit-fp2`` fingerprint on the host: XXH3-64 of each 256 KiB chunk, then xxh3-128.

``ftkit-fp2`` (docs/fingerprints.md) hashes a tensor's logical bytes in independent chunks of
``CHUNK_BYTES`` so that a device can hash them all in parallel (``ftkit.tensors.xxh3_torch``),
and the host hashes the same chunks with the C library at its usual speed:

    fingerprint = xxh3_128( header || LE64(XXH3_64(chunk 0)) || LE64(XXH3_64(chunk 1)) || ... )

where the last chunk may be shorter and an empty tensor has no chunk.

- ``ChunkedHasher(header)``: the streaming form (the ``Hasher`` protocol): ``update`` with the
  bytes in any pieces, ``hexdigest`` once they are all in. Pieces need not align with chunks.
- ``hash_contiguous(header, flat)``: the whole-buffer form for bytes already in memory.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import xxhash

from ftkit.tensors import xxh3
from ftkit.tensors.xxh3_torch import CHUNK_BYTES


def _as_bytes(data: Any) -> np.ndarray:
    arr = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    if not arr.flags.c_contiguous:
        raise ValueError("fingerprint update needs contiguous data")
    return arr.reshape(-1).view(np.uint8)


def _le64(digests: np.ndarray) -> bytes:
    return digests.astype("<u8", copy=False).tobytes()


def hash_contiguous(header: bytes, flat: Any) -> str:
    """The fingerprint of ``header`` and the bytes of ``flat`` (any C-contiguous buffer)."""
    arr = _as_bytes(flat)
    if arr.nbytes <= CHUNK_BYTES:  # one chunk at most (most tensors of a model): two C calls
        tail = struct.pack("<Q", xxhash.xxh3_64_intdigest(arr)) if arr.nbytes else b""  # type: ignore[arg-type]
        return xxhash.xxh3_128(header + tail).hexdigest()
    h = xxh3.new(header)
    h.update(_le64(xxh3.chunk_digests(arr, CHUNK_BYTES)))
    return h.hexdigest()


class ChunkedHasher:
    """Streaming ``ftkit-fp2``: full chunks are hashed as soon as they are complete, a partial
    chunk waits in a buffer of at most ``CHUNK_BYTES``. ``hexdigest`` ends the stream (later
    calls return the same digest; ``update`` after it raises ``RuntimeError``)."""

    def __init__(self, header: bytes) -> None:
        self._outer = xxh3.new(header)
        self._pending = bytearray()
        self._digest: str | None = None

    def update(self, data: Any) -> None:
        if self._digest is not None:
            raise RuntimeError("update after hexdigest")
        arr = _as_bytes(data)
        if self._pending:
            take = min(CHUNK_BYTES - len(self._pending), arr.nbytes)
            self._pending += arr[:take].tobytes()
            arr = arr[take:]
            if len(self._pending) < CHUNK_BYTES:
                return
            self._outer.update(_le64(xxh3.chunk_digests(np.frombuffer(self._pending, np.uint8), CHUNK_BYTES)))
            self._pending.clear()
        whole = arr.nbytes - arr.nbytes % CHUNK_BYTES
        if whole:
            self._outer.update(_le64(xxh3.chunk_digests(arr[:whole], CHUNK_BYTES)))
        if whole < arr.nbytes:
            self._pending += arr[whole:].tobytes()

    def hexdigest(self) -> str:
        if self._digest is None:
            if self._pending:
                self._outer.update(_le64(xxh3.chunk_digests(np.frombuffer(self._pending, np.uint8), CHUNK_BYTES)))
                self._pending.clear()
            self._digest = self._outer.hexdigest()
        return self._digest
