"""``stfile``: the records ``write_files`` computes while writing (sha256, fingerprints,
NaN/Inf counts, as parallel jobs) equal what independent tools compute from the written bytes,
and ``digest_files`` re-derives exactly them from disk; tensors larger than a hashing chunk,
0-d and empty tensors, several files at once."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ftkit.checkpoint.scan import CHUNK_BYTES
from ftkit.checkpoint.stfile import digest_files, layout_st, write_files
from ftkit.errors import InputError
from ftkit.tensors.fingerprint import fingerprint


def _files(tmp_path: Path) -> dict[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(CHUNK_BYTES // 4 + 1000, generator=g)  # spans two hashing chunks
    big[CHUNK_BYTES // 4 - 1] = math.inf  # the last element of the first chunk
    big[CHUNK_BYTES // 4 + 7] = math.nan  # inside the second
    return {
        tmp_path / "a.safetensors": {"big": big, "scalar": torch.tensor(3.0), "empty": torch.zeros(0, 4)},
        tmp_path / "b.safetensors": {
            "bf16": torch.randn(33, 7, generator=g).to(torch.bfloat16),
            "ids": torch.arange(10, dtype=torch.int64),
        },
    }


def test_records_equal_independent_computation_and_the_verifier_agrees(tmp_path) -> None:
    files = _files(tmp_path)
    records = write_files({p: layout_st(t, {"step": "1"}) for p, t in files.items()})
    for path, tensors in files.items():
        rec, raw = records[path], path.read_bytes()
        assert (rec.size, rec.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
        back = load_file(path)  # the safetensors library reads what was written
        assert sorted(back) == sorted(tensors) == sorted(rec.tensors or {})
        for name, t in tensors.items():
            assert torch.equal(back[name], t) or (t.is_floating_point() and torch.equal(back[name].isnan(), t.isnan()))
            got = (rec.tensors or {})[name]
            assert got.fingerprint == fingerprint(t) and got.shape == tuple(t.shape)
            want_bad = int((~t.float().isfinite()).sum()) if t.is_floating_point() else 0
            assert got.nonfinite == want_bad
    assert (records[tmp_path / "a.safetensors"].tensors or {})["big"].nonfinite == 2
    found = dict(digest_files([(p, True) for p in files] + [(tmp_path / "a.safetensors", False)]))
    assert found[tmp_path / "b.safetensors"] == records[tmp_path / "b.safetensors"]
    assert found[tmp_path / "a.safetensors"].sha256 == records[tmp_path / "a.safetensors"].sha256


def test_a_writer_error_is_raised_after_every_job_ended(tmp_path) -> None:
    layout = layout_st({"x": np.ones(1000, np.float32)})
    with pytest.raises(FileNotFoundError):
        write_files({tmp_path / "ok.safetensors": layout, tmp_path / "missing" / "x.safetensors": layout})


def test_digest_files_yields_the_structural_error_of_a_malformed_file(tmp_path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    found = dict(digest_files([(bad, True), (empty, False)]))
    assert isinstance(found[bad], InputError) and "header" in found[bad].message
    assert found[empty].sha256 == hashlib.sha256(b"").hexdigest() and found[empty].size == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nonfinite_count_is_exact_for_every_float_type(dtype) -> None:
    """Every NaN / +-Inf counted, nothing else: the largest finite value, subnormals, -0."""
    from ftkit.checkpoint.scan import count_nonfinite, host_bytes

    info = torch.finfo(dtype)
    values = [0.0, -0.0, 1.0, info.max, -info.max, info.tiny, info.tiny / 4, math.nan, math.inf, -math.inf]
    t = torch.tensor(values, dtype=dtype)
    t = torch.cat([t, -t.flip(0)])  # the NaN with its sign bit flipped too
    code, _, flat = host_bytes(t)
    assert count_nonfinite(code, flat) == int((~t.isfinite()).sum()) == 6


def test_a_file_that_changed_under_the_reader_is_an_error_not_a_record(tmp_path) -> None:
    from ftkit.checkpoint.digest import FileReader, run_digests
    from ftkit.tensors.st import read_header

    p = tmp_path / "a.safetensors"
    write_files({p: layout_st({"x": torch.arange(1000.0)})}, fsync=False)
    tensors = list(read_header(p).tensors.values())
    for size in (p.stat().st_size + 8, p.stat().st_size - 8):  # the file grew, or was cut, after its header check
        d = FileReader(p, size, tensors)
        list(run_digests([d]))
        with pytest.raises(OSError, match="shorter|longer"):
            d.record()


def test_nonfinite_count_of_mx_scales() -> None:
    """F8_E8M0 (MX block scales): 0xFF is the only NaN; there is no zero or infinity."""
    from ftkit.checkpoint.scan import count_nonfinite, host_bytes

    t = torch.tensor([0, 1, 127, 254, 255, 255], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    code, _, flat = host_bytes(t)
    assert code == "F8_E8M0" and count_nonfinite(code, flat) == 2
