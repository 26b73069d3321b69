"""The GIL-free xxh3-128 hasher gives python-xxhash's digests; fused hashing in diff_metrics
gives the fingerprints; a file's tensors hash on the shared pool like one by one."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ftkit.dumps import metrics
from ftkit.dumps.metrics import diff_metrics
from ftkit.tensors import xxh3
from ftkit.tensors.fingerprint import fingerprint_array, fingerprint_hasher


def test_the_gil_free_path_is_in_use_here():
    assert xxh3.parallel_capable()


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=5000), st.lists(st.integers(0, 5000), max_size=4), st.binary(max_size=40))
def test_streaming_digest_equals_python_xxhash(data, cuts, seed):
    h = xxh3.new(seed)
    pos = 0
    for cut in sorted(cuts):  # any split of the stream, bytes and arrays mixed
        h.update(np.frombuffer(data[pos:cut], np.uint8) if cut > pos else b"")
        pos = max(pos, cut)
    h.update(data[pos:])
    assert h.hexdigest() == xxhash.xxh3_128(seed + data).hexdigest()


def test_fused_hashing_in_diff_metrics_gives_the_fingerprints(monkeypatch):
    monkeypatch.setattr(metrics, "STRIPE", 1000)  # many stripes on two threads, hashed in order
    monkeypatch.setattr(metrics, "MIN_STRIPE", 300)
    rng = np.random.default_rng(3)
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float64, np.int64):
        a = (rng.standard_normal((97, 103)) * 10).astype(dtype)
        b = a.copy()
        b.reshape(-1)[::7] += dtype(1)
        hashers = [fingerprint_hasher(x.dtype.name, x.shape) for x in (a, b)]
        m = diff_metrics(a, b, 0, 0, hashers)
        assert [h.hexdigest() for h in hashers] == [fingerprint_array(a), fingerprint_array(b)]
        assert m.bits_differ == int((a.reshape(-1)[::7] != b.reshape(-1)[::7]).sum())


def test_a_failing_stripe_never_leaves_the_others_waiting(monkeypatch):
    monkeypatch.setattr(metrics, "STRIPE", 100)
    monkeypatch.setattr(metrics, "MIN_STRIPE", 100)
    a = np.arange(1000, dtype=np.float32)
    b = a + 1
    calls = {"n": 0}
    real = metrics._Stripes.measure

    def flaky(self, start, stop):
        calls["n"] += 1
        if start == 300:
            raise MemoryError("injected")
        return real(self, start, stop)

    monkeypatch.setattr(metrics._Stripes, "measure", flaky)
    hashers = [fingerprint_hasher("float32", a.shape) for _ in range(2)]
    try:
        diff_metrics(a, b, 0, 0, hashers)
    except MemoryError:
        pass
    else:  # pragma: no cover
        raise AssertionError("the injected error must surface")
    monkeypatch.setattr(metrics._Stripes, "measure", real)
    assert diff_metrics(a, b, 0, 0).bits_differ == 1000  # the shared pool is not stuck
