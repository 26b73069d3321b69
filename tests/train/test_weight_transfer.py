"""``PackedTensors``: tensors through Ray's object store as out-of-band numpy bytes."""

import numpy as np
import pytest
import torch

from ftkit.tensors.fingerprint import fingerprint
from ftkit.tensors.transfer import PackedTensors


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(4, 2, generator=g).to(torch.bfloat16),
        "ids": torch.arange(7, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(-0.0),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 4, generator=g).t(),  # not contiguous: copied once
    }


def test_unpack_gives_the_same_dtypes_shapes_and_bytes():
    state = _state()
    out = PackedTensors.of(state).unpack()
    assert list(out) == list(state)
    for name, t in state.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        assert fingerprint(out[name]) == fingerprint(t), name  # every byte, -0.0 included


def test_a_contiguous_cpu_tensor_is_packed_without_a_copy():
    t = torch.randn(64, 8)
    packed = PackedTensors.of({"t": t, "s": t[:, :3]})
    assert np.shares_memory(packed.entries["t"][2], t.numpy())
    assert not np.shares_memory(packed.entries["s"][2], t.numpy())  # a strided view is copied


@pytest.mark.slow
def test_through_the_object_store_the_reader_views_the_stored_bytes(ray_session):
    """Ray stores the packed bytes out of band: the reader's arrays are read-only views of the
    store (no private copy), and the tensors unpacked from them are the sender's."""
    ray = ray_session
    state = _state()
    got = ray.get(ray.put(PackedTensors.of(state)))
    assert all(not data.flags.writeable for _, _, data in got.entries.values() if data.size)
    out = got.unpack()
    assert {n: fingerprint(t) for n, t in out.items()} == {n: fingerprint(t) for n, t in state.items()}
