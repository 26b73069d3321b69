"""XXH3-64 of whole 256 KiB chunks, computed with torch operations wherever the bytes are.

``chunk_digests(words)`` (``finish(block_sums(words))``) takes ``C`` chunks of ``CHUNK_BYTES``
bytes as an int64 tensor ``[C, CHUNK_BYTES // 8]`` (their little-endian 64-bit words, on any
device) and returns an int64 tensor ``[C]`` on that device whose bits are ``XXH3_64bits(chunk)``
(seed 0, default secret): python-xxhash's ``xxh3_64_intdigest`` as a two's-complement int64.
It is the device half of the ``ftkit-fp2`` fingerprint (docs/fingerprints.md); the host half
hashes the same chunks with the C library, and tests hold the two to the same bits.

How: XXH3's long-input loop, vectorised. Within each 1 KiB block the 16 stripes only *add*
into the eight 64-bit accumulators, so a block's contribution is a sum over its stripes
(``_block_sums``: one reduction over all blocks at once); only the scramble between blocks is
sequential, 255 steps per chunk on ``[C, 8]`` lanes (``_scramble_chain``), then the merge of
the accumulators (a 64x64->128 bit multiply in 32-bit limbs) and the avalanche. All arithmetic
is on int64 with wrap-around (torch's and Triton's integer ops wrap; right shifts are made
logical with masks), so the bits are uint64 arithmetic modulo 2^64.

Every operation is an eager torch operation, one kernel each, so the wrap-around holds on
every device as it does in the CPU tests. (``torch.compile`` is not used: its C++ backend
treats signed overflow as impossible and drops the masks of the 128-bit multiply, which gives
other bits.) The cost on a device is the memory-bound block sums (about ten passes over the
bytes) plus a fixed ~1,500 small kernels for the chain, once per batch of tensors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

CHUNK_BYTES = 256 << 10
_STRIPES = 16  # stripes of 64 bytes per 1 KiB block (the default secret's 192 bytes)
_BLOCKS = CHUNK_BYTES // 1024
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb"
    "170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_INIT_ACC = (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)
_M32 = 0xFFFFFFFF


def _signed(v: int) -> int:
    """A uint64 value as the int64 with the same bits."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _read64(offset: int) -> int:
    return _signed(int.from_bytes(_SECRET[offset : offset + 8], "little"))


def _lsr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


@functools.lru_cache(maxsize=8)
def _keys(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The secret words each stripe lane is mixed with, ``[BLOCKS, STRIPES, 8]`` (the last
    stripe of the last block takes the ``secret + 121`` words), and the scramble words ``[8]``."""
    import torch

    stripe = [[_read64(8 * s + 8 * i) for i in range(8)] for s in range(_STRIPES)]
    keys = torch.tensor(stripe, dtype=torch.int64).repeat(_BLOCKS, 1, 1)
    keys[-1, -1] = torch.tensor([_read64(len(_SECRET) - 64 - 7 + 8 * i) for i in range(8)], dtype=torch.int64)
    scramble = torch.tensor([_read64(len(_SECRET) - 64 + 8 * i) for i in range(8)], dtype=torch.int64)
    return keys.to(device), scramble.to(device)


def block_sums(words: torch.Tensor) -> torch.Tensor:
    """``[C, BLOCKS, 8]``: what each 1 KiB block of each chunk adds to each accumulator lane
    (mod 2^64). ``words``: int64 ``[C, CHUNK_BYTES // 8]``. The memory-bound part: callers cut
    a large tensor into slabs and concatenate the sums of all their tensors for ``finish``."""
    import torch

    if words.dtype != torch.int64 or words.dim() != 2 or words.shape[1] != CHUNK_BYTES // 8:
        raise ValueError(f"block_sums needs int64 [C, {CHUNK_BYTES // 8}], got {words.dtype} {tuple(words.shape)}")
    keys, _ = _keys(words.device)
    w = words.view(-1, _BLOCKS, _STRIPES, 8)
    dk = w ^ keys
    hi = _lsr(dk, 32)
    products = dk.bitwise_and_(_M32).mul_(hi).sum(dim=2)
    del dk, hi
    data = w.sum(dim=2)  # lane i's data goes into accumulator i ^ 1
    return products + data.view(-1, _BLOCKS, 4, 2).flip(-1).reshape(-1, _BLOCKS, 8)


def _scramble_chain(sums: torch.Tensor, scramble: torch.Tensor) -> torch.Tensor:
    """The accumulators after the whole chunk: add each block, scramble between blocks."""
    acc = sums[:, 0] + sums.new_tensor([_signed(v) for v in _INIT_ACC])
    for b in range(1, _BLOCKS):
        acc ^= _lsr(acc, 47)
        acc ^= scramble
        acc *= _P32_1
        acc += sums[:, b]
    return acc


def _fold_mul128(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The low and high halves of the 128-bit product ``a * b`` (as uint64), xor-ed."""
    a_lo, a_hi, b_lo, b_hi = a & _M32, _lsr(a, 32), b & _M32, _lsr(b, 32)
    lo_lo, hi_lo, lo_hi, hi_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi, a_hi * b_hi
    cross = _lsr(lo_lo, 32) + (hi_lo & _M32) + lo_hi
    upper = _lsr(hi_lo, 32) + _lsr(cross, 32) + hi_hi
    lower = ((cross & _M32) << 32) | (lo_lo & _M32)
    return lower ^ upper


def finish(sums: torch.Tensor) -> torch.Tensor:
    """``XXH3_64bits`` of each chunk (int64 ``[C]``) from its ``block_sums``: the scramble chain
    between blocks (sequential in the block, parallel over chunks and lanes), the merge of the
    accumulators and the avalanche. A few hundred small operations whatever ``C`` is, so
    callers run it once over the chunks of every tensor they hash."""
    if sums.shape[0] == 0:
        return sums.new_empty((0,))
    _, scramble = _keys(sums.device)
    acc = _scramble_chain(sums, scramble)
    h = acc.new_full((acc.shape[0],), _signed(CHUNK_BYTES * _P64_1))
    for i in range(4):
        h += _fold_mul128(acc[:, 2 * i] ^ _read64(11 + 16 * i), acc[:, 2 * i + 1] ^ _read64(11 + 16 * i + 8))
    h ^= _lsr(h, 37)
    h *= _signed(0x165667919E3779F9)
    return h ^ _lsr(h, 32)


def chunk_digests(words: torch.Tensor) -> torch.Tensor:
    """``XXH3_64bits`` of each row of ``words`` (int64 ``[C, CHUNK_BYTES // 8]``) as int64 ``[C]``."""
    return finish(block_sums(words))
