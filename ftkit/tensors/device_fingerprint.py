"""``ftkit-fp2`` fingerprints of tensors where they are, without streaming their bytes to the host.

``fingerprints_on_device(items)`` takes ``(header, flat)`` pairs, ``flat`` a contiguous uint8
tensor of a tensor's logical bytes (on a GPU, or any device), and returns each fingerprint: the
same 32 hex chars the host computes from the same bytes (``ftkit.tensors.chunked``). The whole
256 KiB chunks are hashed where they are (``ftkit.tensors.xxh3_torch``), in slabs of
``SLAB_CHUNKS`` chunks per tensor (the temporaries stay a few times a slab) and one chain for
every chunk of every item; then one copy brings the 8-byte chunk digests and the partial last
chunks (under 256 KiB per tensor) to the host, which hashes those and the outer xxh3-128.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ftkit.tensors import xxh3
from ftkit.tensors.xxh3_torch import CHUNK_BYTES, block_sums, finish

if TYPE_CHECKING:  # pragma: no cover
    import torch

SLAB_CHUNKS = 256  # 64 MiB of a tensor per block_sums call


def _words(slab: torch.Tensor) -> torch.Tensor:
    """A slab of whole chunks (uint8) as int64 ``[chunks, CHUNK_BYTES // 8]``; a slab whose
    start is not 8-byte aligned in its storage is copied first."""
    import torch

    try:
        words = slab.view(torch.int64)
    except RuntimeError:
        words = slab.clone().view(torch.int64)
    return words.view(-1, CHUNK_BYTES // 8)


def fingerprints_on_device(items: Sequence[tuple[bytes, torch.Tensor]]) -> list[str]:
    """The fingerprint of each ``(header, flat uint8 bytes)``; all ``flat`` on one device."""
    import torch

    if not items:
        return []
    sums: list[torch.Tensor] = []
    counts: list[int] = []
    tails: list[torch.Tensor] = []
    for _, flat in items:
        full = flat.numel() // CHUNK_BYTES
        for i in range(0, full, SLAB_CHUNKS):
            j = min(full, i + SLAB_CHUNKS)
            sums.append(block_sums(_words(flat[i * CHUNK_BYTES : j * CHUNK_BYTES])))
        counts.append(full)
        tails.append(flat[full * CHUNK_BYTES :])
    device = items[0][1].device
    digests = finish(torch.cat(sums)) if sums else torch.empty(0, dtype=torch.int64, device=device)
    host = torch.cat([digests.view(torch.uint8), *tails]).cpu().numpy()
    out: list[str] = []
    pos, tail_pos = 0, digests.numel() * 8
    for (header, _), full, tail in zip(items, counts, tails):
        h = xxh3.new(header)
        if full:
            h.update(host[pos : pos + 8 * full])
            pos += 8 * full
        if tail.numel():
            last = host[tail_pos : tail_pos + tail.numel()]
            h.update(xxh3.chunk_digests(np.ascontiguousarray(last), CHUNK_BYTES).astype("<u8").tobytes())
            tail_pos += tail.numel()
        out.append(h.hexdigest())
    return out
