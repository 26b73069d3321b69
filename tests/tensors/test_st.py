"""Safetensors helpers: atomic writes that safetensors reads back, and a header reader that
rejects every kind of lie with one clear InputError."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from ftkit.errors import InputError
from ftkit.fsutil import temp_path
from ftkit.tensors.st import read_header, remove_stale_temps, write_bytes_atomic, write_safetensors_atomic


def _raw(path, header: dict, data: bytes = b"", header_len: int | None = None) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if header_len is None else header_len) + h + data)


def test_atomic_write_round_trips_through_safetensors(tmp_path):
    tensors = {
        "w": torch.randn(4, 3).t(),
        "b": torch.arange(5, dtype=torch.int64),
        "h": torch.randn(2, 2).to(torch.bfloat16),
        "s": torch.tensor(True),
        "e": torch.empty(0, 2),
    }
    target = tmp_path / "x.safetensors"
    size = write_safetensors_atomic(target, tensors, metadata={"k": "v"})
    assert size == target.stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]  # no temp left behind
    with safe_open(str(target), "pt") as f:
        assert f.metadata() == {"k": "v"}
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)
    header = read_header(target)
    assert set(header.tensors) == set(tensors)
    assert header.tensors["h"].dtype == "bfloat16" and header.tensors["h"].shape == (2, 2)
    assert header.metadata == {"k": "v"} and header.size == size


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "x.safetensors"
    write_safetensors_atomic(target, {"a": torch.zeros(1000)})
    write_safetensors_atomic(target, {"b": torch.ones(2)})
    assert set(read_header(target).tensors) == {"b"}


def test_unstorable_dtype_is_rejected_before_writing(tmp_path):
    with pytest.raises(ValueError, match="cannot be stored"):
        write_safetensors_atomic(tmp_path / "x.safetensors", {"q": torch.ones(2, dtype=torch.complex32)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "case,needle",
    [
        ("empty", "truncated"),
        ("short-length", "truncated"),
        ("length-beyond-file", "exceeds the file size"),
        ("not-json", "not valid JSON"),
        ("not-object", "not a JSON object"),
        ("unknown-dtype", "unsupported dtype 'F7'"),
        ("bad-shape", "shape"),
        ("offsets-lie-size", "needs 16"),
        ("offsets-overlap", "overlap or leave a gap"),
        ("truncated-data", "truncated: header describes"),
        ("trailing", "trailing bytes"),
        ("bad-metadata", "__metadata__"),
    ],
)
def test_malformed_headers_are_one_input_error(tmp_path, case, needle):
    p = tmp_path / "bad.safetensors"
    f32 = lambda begin, end, shape=(4,): {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, end]}  # noqa: E731
    if case == "empty":
        p.write_bytes(b"")
    elif case == "short-length":
        p.write_bytes(b"\x01\x00")
    elif case == "length-beyond-file":
        _raw(p, {"a": f32(0, 16)}, b"\0" * 16, header_len=10**6)
    elif case == "not-json":
        p.write_bytes(struct.pack("<Q", 5) + b"{nope")
    elif case == "not-object":
        _raw(p, [1, 2])  # type: ignore[arg-type]
    elif case == "unknown-dtype":
        _raw(p, {"a": {"dtype": "F7", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16)
    elif case == "bad-shape":
        _raw(p, {"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16)
    elif case == "offsets-lie-size":
        _raw(p, {"a": f32(0, 8)}, b"\0" * 8)
    elif case == "offsets-overlap":
        _raw(p, {"a": f32(0, 16), "b": f32(8, 24)}, b"\0" * 24)
    elif case == "truncated-data":
        _raw(p, {"a": f32(0, 16)}, b"\0" * 10)
    elif case == "trailing":
        _raw(p, {"a": f32(0, 16)}, b"\0" * 20)
    elif case == "bad-metadata":
        _raw(p, {"__metadata__": {"k": 1}, "a": f32(0, 16)}, b"\0" * 16)
    with pytest.raises(InputError) as err:
        read_header(p)
    assert needle in err.value.message and str(p) in err.value.message
    assert "\n" not in err.value.message and err.value.hint


def test_truncated_real_file(tmp_path):
    p = tmp_path / "x.safetensors"
    write_safetensors_atomic(p, {"a": torch.randn(100)})
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(InputError, match="truncated"):
        read_header(p)


def test_stale_temps_of_dead_local_processes_only(tmp_path):
    target = tmp_path / "w.safetensors"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = socket.gethostname().replace("-", "_")
    stale = tmp_path / f".w.safetensors.tmp-{host}-{dead_pid}-abcd"
    live = tmp_path / f".w.safetensors.tmp-{host}-{os.getpid()}-abcd"
    remote = tmp_path / f".w.safetensors.tmp-otherhost-{dead_pid}-abcd"
    other_writer = tmp_path / f".v.safetensors.tmp-{host}-{dead_pid}-abcd"
    stale_dir = tmp_path / f".w.safetensors.tmp-{host}-{dead_pid}-ef01"  # a staging directory
    stale_dir.mkdir()
    (stale_dir / ".tmpXYZ").write_bytes(b"partial")
    for p in (stale, live, remote, other_writer):
        p.write_bytes(b"partial")
    assert sorted(remove_stale_temps(target)) == sorted([stale, stale_dir])
    assert not stale.exists() and not stale_dir.exists()
    assert live.exists() and remote.exists() and other_writer.exists()


def test_temp_names_are_hidden_and_distinct(tmp_path):
    a, b = temp_path(tmp_path / "f.json"), temp_path(tmp_path / "f.json")
    assert a != b and a.name.startswith(".f.json.tmp-") and a.parent == tmp_path


def test_write_bytes_atomic(tmp_path):
    p = tmp_path / "i.json"
    assert write_bytes_atomic(p, b"{}") == 2 and p.read_bytes() == b"{}"
    write_bytes_atomic(p, b"[1]")
    assert p.read_bytes() == b"[1]" and [x.name for x in tmp_path.iterdir()] == ["i.json"]


@pytest.mark.parametrize("code", ["F4", "F6_E2M3", "F6_E3M2"])
def test_valid_dtypes_ftkit_does_not_read_are_not_called_corrupt(tmp_path, code):
    """The safetensors format's sub-byte dtypes are valid files ftkit does not read: the
    error says so (and what it reads), never that the file is malformed."""
    p = tmp_path / "mx.safetensors"
    _raw(p, {"w": {"dtype": code, "shape": [16], "data_offsets": [0, 16]}}, b"\0" * 16)
    with pytest.raises(InputError) as err:
        read_header(p)
    assert f"dtype {code}, which ftkit does not read" in err.value.message
    assert "malformed" not in err.value.message and "BF16" in err.value.hint


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_saves_in_two_processes_are_the_same_bytes(tmp_path):
    """Issue 38 item 15: the ``final/*.safetensors`` of two bitwise-equal runs differed in bytes:
    the Rust writer's metadata order changes from process to process; ftkit sorts it."""
    code = (
        "import sys, torch; from ftkit.tensors.st import save_safetensors; "
        "meta = {f'key{i}': str(i) for i in range(40)}; "
        "save_safetensors(sys.argv[1], {'w': torch.arange(6.0), 'b': torch.ones(2, dtype=torch.bfloat16)}, meta)"
    )
    files = [tmp_path / f"{i}.safetensors" for i in range(2)]
    for f in files:
        subprocess.run(
            [sys.executable, "-c", code, str(f)],
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
    a, b = (f.read_bytes() for f in files)
    assert a == b
    (n,) = struct.unpack("<Q", a[:8])
    meta = json.loads(a[8 : 8 + n])["__metadata__"]
    assert list(meta) == sorted(meta) and len(meta) == 40
    from safetensors import safe_open

    with safe_open(str(files[0]), "pt") as fh:
        assert fh.metadata() == {f"key{i}": str(i) for i in range(40)} and fh.get_tensor("w").tolist() == [
            0,
            1,
            2,
            3,
            4,
            5,
        ]
