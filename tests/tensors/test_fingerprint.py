"""Fingerprints: logical-order bytes + dtype + shape, device/stride independent, order-free combine."""

from __future__ import annotations

import json
import random
import struct

import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ftkit.tensors.fingerprint import (
    SCHEME,
    _device_chunks,
    combine,
    fingerprint,
    fingerprint_buffers,
    fingerprint_tensors,
    logical_bytes,
)

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
]


def _sample(dtype: torch.dtype, shape=(5, 7), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def test_known_answer_pins_the_format():
    """Dumps (ftkit-fp1) and logs and checkpoints (ftkit-fp2) store fingerprints: neither
    format may change silently."""
    t = torch.arange(4, dtype=torch.int32).reshape(2, 2)
    data = struct.pack("<4i", 0, 1, 2, 3)
    fp1 = xxhash.xxh3_128(b"ftkit-fp1\0int32\x002,2\0" + data).hexdigest()
    fp2 = xxhash.xxh3_128(b"ftkit-fp2\0int32\x002,2\0" + struct.pack("<Q", xxhash.xxh3_64_intdigest(data))).hexdigest()
    assert fingerprint(t, scheme="ftkit-fp1") == fp1
    assert fingerprint(t) == fp2 and SCHEME == "ftkit-fp2"
    assert len(fp1) == len(fp2) == 32 and fp2 == fp2.lower()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_is_deterministic_and_shape_and_dtype_sensitive(dtype):
    t = _sample(dtype)
    fp = fingerprint(t)
    assert fp == fingerprint(t.clone()) and len(fp) == 32
    assert fingerprint(t.reshape(7, 5)) != fp  # same bytes, other shape
    assert fingerprint(t.reshape(-1)) != fp
    same_bytes_other_dtype = t.reshape(-1).view(torch.uint8)
    assert fingerprint(same_bytes_other_dtype) != fp
    assert fingerprint(_sample(dtype, seed=1)) != fp


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_dim_and_empty_tensors(dtype):
    scalar = _sample(dtype, shape=())
    empties = [torch.empty(0, dtype=dtype), torch.empty(0, 3, dtype=dtype), torch.empty(3, 0, dtype=dtype)]
    fps = [fingerprint(scalar)] + [fingerprint(e) for e in empties]
    assert len(set(fps)) == 4  # shapes (), (0,), (0,3), (3,0) all differ
    assert fingerprint(scalar) != fingerprint(scalar.reshape(1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_flipped_bit_changes_it(dtype):
    t = _sample(dtype, shape=(6, 9))
    raw = bytearray(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    rng = random.Random(str(dtype))
    before = fingerprint(t)
    for _ in range(8):
        pos, bit = rng.randrange(len(raw)), rng.randrange(8)
        flipped = bytearray(raw)
        flipped[pos] ^= 1 << bit
        u = torch.frombuffer(flipped, dtype=torch.uint8).view(dtype).reshape(t.shape)
        assert fingerprint(u) != before


@settings(max_examples=30, deadline=None)
@given(pos=st.integers(0, 4 * 64 - 1), bit=st.integers(0, 7))
def test_any_single_bit_of_a_float32_tensor(pos, bit):
    t = torch.linspace(-3, 3, 64)
    raw = bytearray(t.numpy().tobytes())
    raw[pos] ^= 1 << bit
    assert fingerprint(torch.frombuffer(raw, dtype=torch.float32)) != fingerprint(t)


def _views(base: torch.Tensor):
    yield "transpose", base.t()
    yield "step-slice", base[::2, 1::3]
    yield "expand", base[:1].expand(9, -1)
    yield "permute-3d", base.reshape(3, 3, 8).permute(2, 0, 1)
    yield "column", base[:, 3]
    yield "single-element", base[2:3, 5]


@pytest.mark.parametrize("chunk", [64 << 20, 40, 7], ids=["whole", "small-pieces", "sub-row"])
def test_non_contiguous_equals_contiguous_copy(chunk):
    base = torch.randn(9, 8, dtype=torch.float64).to(torch.float32)
    for label, v in _views(base):
        assert v.stride() != torch.empty(v.shape).stride(), label  # really strided
        assert fingerprint(v, chunk_bytes=chunk) == fingerprint(v.contiguous()), label


def test_device_streaming_path_matches_host_path():
    """The chunked staging path used for CUDA (exercised here on a CPU tensor) yields the
    same logical bytes as the zero-copy host path, for contiguous and strided tensors."""
    base = torch.randn(33, 17)
    for t in (base, base.t(), base[::3]):
        for chunk in (12, 100, 1 << 20):
            streamed = fingerprint_buffers("float32", t.shape, _device_chunks(t, chunk))
            assert streamed == fingerprint(t.contiguous())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", ["ftkit-fp1", "ftkit-fp2"])
def test_cuda_equals_cpu(scheme):  # pragma: no cover - runs where a GPU is
    t = torch.randn(1 << 20, 3)
    for v in (t, t.t(), t[::5], t.to(torch.bfloat16)[1:]):
        assert fingerprint(v.cuda(), chunk_bytes=1 << 20, scheme=scheme) == fingerprint(v, scheme=scheme)


def test_conjugate_and_negative_views_hash_their_values():
    c = torch.randn(4, 3, dtype=torch.complex64)
    assert fingerprint(c.conj()) == fingerprint(c.conj().resolve_conj())
    assert fingerprint(c.conj()) != fingerprint(c)


def test_logical_bytes_concatenate_to_the_row_major_bytes():
    t = torch.arange(24, dtype=torch.int16).reshape(2, 3, 4).permute(2, 0, 1)
    got = b"".join(bytes(b) for b in logical_bytes(t, chunk_bytes=6))
    assert got == t.contiguous().numpy().tobytes()


def test_rejects_unsupported_layouts():
    with pytest.raises(TypeError):
        fingerprint(torch.eye(3).to_sparse())


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.from_regex(r"[0-9a-f]{32}", fullmatch=True), min_size=1, max_size=8
    ),
    st.randoms(),
)
def test_combine_ignores_insertion_order(items, rnd):
    keys = list(items)
    rnd.shuffle(keys)
    assert combine({k: items[k] for k in keys}) == combine(items)


def test_combine_sees_values_names_and_membership():
    base = {"a": "0" * 32, "b": "1" * 32}
    total = combine(base)
    assert combine({"a": "0" * 32, "b": "2" * 32}) != total
    assert combine({"a": "0" * 32, "c": "1" * 32}) != total
    assert combine({"a": "0" * 32}) != total
    assert combine({"a": "1" * 32, "b": "0" * 32}) != total  # values swapped between names


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12) | st.integers(), max_size=12))
def test_combine_hashes_the_documented_bytes(items):
    """The digest is of ``json.dumps(name):str(value)\\n`` per pair in name order (logged totals in
    existing logs depend on it): quotes, backslashes, control and non-ASCII characters in names."""
    h = xxhash.xxh3_128(b"ftkit-state-fp1\n")
    for name in sorted(items):
        h.update(f"{json.dumps(name)}:{items[name]}\n".encode())
    assert combine(items) == h.hexdigest()
    assert combine({1: "a", 2: "b"}) == xxhash.xxh3_128(b"ftkit-state-fp1\n1:a\n2:b\n").hexdigest()  # not str


def test_fingerprint_tensors():
    tensors = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    total, per = fingerprint_tensors(tensors)
    assert per == {"w": fingerprint(tensors["w"]), "b": fingerprint(tensors["b"])}
    assert total == combine(per)
    assert fingerprint_tensors(dict(reversed(list(tensors.items()))))[0] == total


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 7), (), (0, 3), (1, 1)], ids=str)
def test_fast_path_equals_the_streamed_bytes(dtype, shape):
    """Contiguous CPU tensors hash their numpy view directly; the digest is the general one."""
    t = _sample(dtype, shape=shape)
    general = fingerprint_buffers(str(dtype).rsplit(".", 1)[-1], tuple(t.shape), logical_bytes(t))
    assert fingerprint(t) == general
    if dtype.is_floating_point and shape:
        param = torch.nn.Parameter(t.clone())  # requires grad: hashed through detach
        assert fingerprint(param) == general
