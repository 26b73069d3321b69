"""ftkit-fp2: XXH3-64 per 256 KiB chunk, then xxh3-128. The device path (torch operations,
run here on CPU tensors) gives the host's digests for every dtype, size and layout; the
streaming hasher does not depend on how the bytes are cut; the chunk digests are XXH3-64's."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ftkit.tensors import device_fingerprint
from ftkit.tensors import fingerprint as fp_module
from ftkit.tensors.fingerprint import (
    check_scheme,
    fingerprint,
    fingerprint_array,
    fingerprint_hasher,
    fingerprints,
    fingerprints_through_device_path,
)
from ftkit.tensors.xxh3_torch import CHUNK_BYTES, chunk_digests

C = CHUNK_BYTES


def _definition(header: bytes, data: bytes) -> str:
    """ftkit-fp2 written out from docs/fingerprints.md with python-xxhash alone."""
    digests = b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(data[i : i + C])) for i in range(0, len(data), C))
    return xxhash.xxh3_128(header + digests).hexdigest()


def test_the_chunk_size_constants_agree():
    assert fp_module._FP2_CHUNK == C == 256 << 10


@pytest.mark.parametrize("n", [0, 1, 7, C - 1, C, C + 1, 3 * C, 3 * C + 5])
def test_known_answer_from_the_definition(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    header = b"ftkit-fp2\0uint8\0" + str(n).encode() + b"\0"
    assert fingerprint(torch.from_numpy(data.copy())) == _definition(header, data.tobytes())
    assert fingerprint_array(data) == _definition(header, data.tobytes())


@pytest.mark.parametrize("fill", ["random", "zeros", "ones", "max", "alternating"], ids=str)
def test_device_chunk_digests_are_xxh3_64(fill):
    rng = np.random.default_rng(7)
    raw = {
        "random": lambda: rng.integers(0, 256, 4 * C, dtype=np.uint8),
        "zeros": lambda: np.zeros(4 * C, np.uint8),
        "ones": lambda: np.full(4 * C, 1, np.uint8),
        "max": lambda: np.full(4 * C, 255, np.uint8),
        "alternating": lambda: np.tile(np.array([0, 255], np.uint8), 2 * C),
    }[fill]()
    words = torch.from_numpy(raw.copy().view(np.int64).reshape(4, -1))
    before = words.clone()
    got = [int(d) & (2**64 - 1) for d in chunk_digests(words)]
    assert got == [xxhash.xxh3_64_intdigest(raw[i * C : (i + 1) * C].tobytes()) for i in range(4)]
    assert torch.equal(words, before)  # the input is read, never changed


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn, torch.int8,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]  # fmt: skip


def _values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (n,), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_path_equals_host_path_for_every_dtype_and_size(dtype):
    es = torch.empty(0, dtype=dtype).element_size()
    sizes = [0, 1, 3, C // es - 1, C // es, C // es + 1, 2 * C // es + 7]
    tensors = {f"n{n}": _values(dtype, n, n) for n in sizes}
    tensors["0d"] = _values(dtype, 1, 5).reshape(())
    tensors["2d"] = _values(dtype, 6 * (C // es // 5), 9).reshape(6, -1)
    host = {name: fingerprint(t) for name, t in tensors.items()}
    assert fingerprints_through_device_path(tensors) == host
    assert fingerprints(tensors) == host


def test_device_path_views_misaligned_offsets_and_lazy_views():
    base = torch.randn(3 * C // 4 + 11)
    bf = base.to(torch.bfloat16)
    c = torch.randn(C // 8 + 3, dtype=torch.complex64)
    views = {
        "offset by one bf16 (not 8-byte aligned)": bf[1:],
        "offset by one float32": base[1:],
        "strided": base[::3],
        "transposed": torch.randn(700, 300).t(),
        "expanded": torch.randn(1, 4000).expand(30, 4000),
        "conj": c.conj(),
        "neg": torch.randn(C // 2)._neg_view(),
    }
    host = {name: fingerprint(v.contiguous().resolve_conj().resolve_neg()) for name, v in views.items()}
    assert fingerprints_through_device_path(views) == host
    assert {name: fingerprint(v) for name, v in views.items()} == host


def test_slabs_and_one_batch_give_the_same_digests(monkeypatch):
    tensors = {"a": torch.randn(5 * C // 4 + 3), "b": torch.randn(7 * C // 4), "c": torch.randn(10)}
    whole = fingerprints_through_device_path(tensors)
    monkeypatch.setattr(device_fingerprint, "SLAB_CHUNKS", 2)
    assert fingerprints_through_device_path(tensors) == whole
    assert {n: fingerprints_through_device_path({n: t})[n] for n, t in tensors.items()} == whole


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3 * C), st.lists(st.integers(0, 3 * C), max_size=6), st.integers(0, 2**31))
def test_streaming_hasher_does_not_depend_on_the_pieces(n, cuts, seed):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    h = fingerprint_hasher("uint8", (n,))
    pos = 0
    for cut in sorted(c for c in cuts if c <= n):
        h.update(data[pos:cut] if cut > pos else b"")
        pos = max(pos, cut)
    h.update(data[pos:])
    assert h.hexdigest() == fingerprint_array(data)
    assert h.hexdigest() == h.hexdigest()  # ends the stream once
    with pytest.raises(RuntimeError):
        h.update(b"x")


def test_the_schemes_differ_and_unknown_ones_are_refused():
    t = torch.randn(10)
    assert fingerprint(t, scheme="ftkit-fp1") != fingerprint(t, scheme="ftkit-fp2")
    with pytest.raises(ValueError, match="unknown fingerprint scheme 'ftkit-fp9'"):
        check_scheme("ftkit-fp9")
    with pytest.raises(ValueError, match="unknown fingerprint scheme"):
        fingerprint(t, scheme="sha256")


def test_one_flipped_bit_in_any_chunk_changes_it_on_both_paths():
    t = torch.randn(3 * C // 4)
    base = fingerprint(t)
    raw = t.view(torch.uint8)
    for pos in (0, C - 1, C, 2 * C + 12345, raw.numel() - 1):
        flipped = raw.clone()
        flipped[pos] ^= 1 << (pos % 8)
        v = flipped.view(torch.float32)
        assert fingerprint(v) != base
        assert fingerprints_through_device_path({"v": v})["v"] == fingerprint(v)


def test_every_host_path_of_the_chunk_loop_gives_the_same_digests(monkeypatch):
    """The compiled loop, and the per-chunk ctypes calls a process without ftkit's extension
    (a vLLM server's virtualenv) uses, agree with python-xxhash chunk by chunk."""
    from ftkit.tensors import xxh3

    data = np.random.default_rng(4).integers(0, 256, 5 * C + 123, dtype=np.uint8)
    expected = [xxhash.xxh3_64_intdigest(data[i : i + C].tobytes()) for i in range(0, data.nbytes, C)]
    assert xxh3._chunk_kernel() is not None  # the compiled loop is in use here
    assert xxh3.chunk_digests(data, C).tolist() == expected
    monkeypatch.setattr(xxh3, "_chunk_kernel", lambda: None)
    assert xxh3.chunk_digests(data, C).tolist() == expected
