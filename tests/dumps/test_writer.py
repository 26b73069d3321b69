"""DumpWriter: layout, index content, capture order, atomicity under SIGKILL, isolation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from safetensors import safe_open

from ftkit.dumps.layout import DUMP_SCHEME, INDEX_SCHEMA, INDEX_VERSION, kind_of, microshard_writer, replicated_writer
from ftkit.dumps.loader import TensorLoader, fingerprint_verified
from ftkit.dumps.sources import open_source
from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.arrays import from_torch
from ftkit.tensors.fingerprint import fingerprint, fingerprint_array
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import read_header


def test_layout_and_index_content(tmp_path):
    w = torch.randn(4, 3)
    out = torch.randn(2, 5).to(torch.bfloat16)
    dw = DumpWriter(
        tmp_path / "dumps",
        prefix="actor",
        phase="fwd_bwd",
        rollout=3,
        writer=microshard_writer(4, 3, tp=1, pp=0),
        meta={"cell": 2, "rank": 5, "tp": 1},
    )
    dw.add("decoder.layers.1.mlp.output", out, step=4, micro_shard=3, sharding=Sharding.split(1, 1, 2))
    dw.add("embedding.word_embeddings.weight.param", w, step=4)
    info = dw.write()
    rdir = tmp_path / "dumps" / "actor" / "fwd_bwd" / "rollout_000003"
    assert info.path == rdir / "step000004-ms003-tp1-pp0.safetensors"
    assert info.index_path == rdir / "step000004-ms003-tp1-pp0.index.json"
    assert sorted(p.name for p in rdir.iterdir()) == [info.index_path.name, info.path.name]
    assert info.tensors == 2 and info.bytes == info.path.stat().st_size
    idx = json.loads(info.index_path.read_text())
    assert idx["schema"] == INDEX_SCHEMA and idx["schema_version"] == INDEX_VERSION
    assert (idx["prefix"], idx["phase"], idx["rollout"], idx["writer"]) == (
        "actor",
        "fwd_bwd",
        3,
        "step000004-ms003-tp1-pp0",
    )
    assert (idx["cell"], idx["rank"], idx["meta"]) == (2, 5, {"cell": 2, "rank": 5, "tp": 1})
    assert idx["file"] == info.path.name and idx["file_bytes"] == info.bytes
    first, second = idx["tensors"]
    assert first == {
        "order": 0,
        "name": "decoder.layers.1.mlp.output",
        "key": first["key"],
        "kind": "output",
        "step": 4,
        "micro_shard": 3,
        "dtype": "bfloat16",
        "shape": [2, 5],
        "fingerprint": fingerprint(out, scheme="ftkit-fp1"),  # dump indexes stay ftkit-fp1
        "sharding": {"kind": "split", "dim": 1, "tp_rank": 1, "tp_size": 2, "stride": 1},
        "nan": 0,
        "inf": 0,
    }
    assert second["order"] == 1 and second["kind"] == "param" and second["micro_shard"] is None
    assert second["sharding"]["kind"] == "replicated"
    with safe_open(str(info.path), "pt") as f:  # a plain safetensors file, no pickle anywhere
        assert f.metadata()["writer"] == "step000004-ms003-tp1-pp0"
        assert torch.equal(f.get_tensor(first["key"]), out)
        assert torch.equal(f.get_tensor(second["key"]), w)


def test_capture_order_is_call_order_and_names_repeat_across_steps(tmp_path):
    dw = DumpWriter(tmp_path, "actor", "fwd_bwd", 0, replicated_writer(0, 0))
    names = ["z.grad", "a.grad", "m.grad"]
    for step in (0, 1):
        for n in names:
            dw.add(n, torch.full((2,), float(step)), step=step)
    dw.write()
    idx = json.loads(dw.index_path.read_text())
    assert [(t["name"], t["step"]) for t in idx["tensors"]] == [(n, s) for s in (0, 1) for n in names]
    assert [t["order"] for t in idx["tensors"]] == list(range(6))


def test_add_snapshots_and_rejects_duplicates_and_bad_names(tmp_path):
    dw = DumpWriter(tmp_path, "actor", "fwd_bwd", 0, "w")
    t = torch.zeros(3)
    dw.add("x.output", t, step=0, micro_shard=0)
    t += 1  # later in-place updates must not reach the dump
    dw.write()
    with safe_open(str(dw.path), "pt") as f:
        assert torch.equal(f.get_tensor(f.keys()[0]), torch.zeros(3))
    with pytest.raises(ValueError, match="already added"):
        dw.add("x.output", t, step=0, micro_shard=0)
    dw.add("x.output", t, step=0, micro_shard=1)  # another micro-shard is another tensor
    for bad in ("../evil", "a/b", "", ".hidden"):
        with pytest.raises(ValueError):
            DumpWriter(tmp_path, "actor", "fwd_bwd", 0, bad)
        with pytest.raises(ValueError):
            DumpWriter(tmp_path, bad, "fwd_bwd", 0, "w")


def test_kinds_and_writer_names():
    assert kind_of("decoder.layers.0.mlp.output") == "output"
    assert kind_of("decoder.layers.0.mlp.output_grad.1") == "output_grad"
    assert kind_of("decoder.input.hidden_states") == "input"
    assert kind_of("grad.output") == "output"  # the last kind wins over a module called "grad"
    assert kind_of("output_layer.weight.grad") == "grad"
    assert kind_of("tokens") == "tensor"
    assert microshard_writer(4, 3, 1, 0, cell=2) == "step000004-ms003-tp1-pp0-cell2"
    assert replicated_writer(0, 1) == "replicated-tp0-pp1"


def test_second_writer_never_removes_the_first_writers_files(tmp_path):
    a = DumpWriter(tmp_path, "actor", "fwd_bwd", 1, "replicated-tp0-pp0-cell0")
    b = DumpWriter(tmp_path, "actor", "fwd_bwd", 1, "replicated-tp0-pp0-cell1")
    a.add("w.param", torch.ones(4), step=0)
    b.add("w.param", torch.ones(4), step=0)
    a.write()
    b.write()
    foreign = a.directory / "notes.txt"
    foreign.write_text("keep me")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (b.path, b.index_path)}
    a.add("w.grad", torch.zeros(4), step=0)  # a retried rollout rewrites writer a only
    a.write()
    fresh = DumpWriter(tmp_path, "actor", "fwd_bwd", 1, "replicated-tp0-pp0-cell0")  # a healed cell's writer
    fresh.add("w.param", torch.full((4,), 2.0), step=0)
    fresh.write()
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (b.path, b.index_path)}
    assert after == before and foreign.read_text() == "keep me"
    assert sorted(p.name for p in a.directory.iterdir()) == sorted(
        [a.path.name, a.index_path.name, b.path.name, b.index_path.name, "notes.txt"]
    )
    assert set(read_header(a.path).tensors) == {"0/-/w.param"}  # replaced, not merged


_CHILD = textwrap.dedent("""
    import sys, torch
    from ftkit.dumps.writer import DumpWriter
    i = 0
    while True:
        dw = DumpWriter(sys.argv[1], "actor", "fwd_bwd", 0, "replicated-tp0-pp0", meta={"cell": 0})
        dw.add("big.param", torch.full((2 << 20,), float(i)), step=0)
        dw.add("count.param", torch.tensor(i), step=0)
        dw.write()
        print(i, flush=True)
        i += 1
""")


def _kill_mid_write(root, rdir) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0"  # one complete write first
        deadline = time.monotonic() + 60  # a guard against hanging, not a measurement
        while time.monotonic() < deadline:
            if any(n.startswith(".") for n in os.listdir(rdir)):
                break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL


def test_writer_killed_mid_write_leaves_no_visible_partial_file(tmp_path):
    root = tmp_path / "dumps"
    rdir = root / "actor" / "fwd_bwd" / "rollout_000000"
    for _ in range(3):
        _kill_mid_write(root, rdir)
        visible = sorted(n for n in os.listdir(rdir) if not n.startswith("."))
        assert visible in (
            ["replicated-tp0-pp0.index.json", "replicated-tp0-pp0.safetensors"],
            ["replicated-tp0-pp0.safetensors"],
        )
        read_header(rdir / "replicated-tp0-pp0.safetensors")  # complete, never partial
        src = open_source(root)
        if len(visible) == 1:  # killed between the renames: uncommitted, reported as an orphan
            assert src.orphans == ["actor/fwd_bwd/rollout_000000/replicated-tp0-pp0.safetensors"]
            continue
        loader = TensorLoader()
        values = {e.name: loader.load(e.ref) for e in src.entries}
        for e in src.entries:  # the index describes exactly the data next to it
            fingerprint_verified(e.ref, loader)
        assert np.array_equal(values["big.param"], np.full((2 << 20,), float(values["count.param"]), np.float32))
    hidden = [n for n in os.listdir(rdir) if n.startswith(".")]
    assert hidden  # the killed writer's temp is still there, hidden from every reader
    dw = DumpWriter(root, "actor", "fwd_bwd", 0, "replicated-tp0-pp0")
    dw.add("count.param", torch.tensor(-1), step=0)
    dw.write()  # the same writer, restarted, cleans up its dead predecessor's temps
    assert not [n for n in os.listdir(rdir) if n.startswith(".")]


def test_index_records_non_finite_counts(tmp_path):
    x = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), float("nan")]).to(torch.bfloat16)
    dw = DumpWriter(tmp_path, "actor", "fwd_bwd", 0, "w")
    dw.add("x.output", x, step=0, micro_shard=0)
    dw.add("i.output", torch.arange(3), step=0, micro_shard=0)
    dw.write()
    entries = json.loads(dw.index_path.read_text())["tensors"]
    assert [(e["nan"], e["inf"]) for e in entries] == [(2, 2), (0, 0)]


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float8_e5m2,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
    ids=str,
)
def test_fingerprint_read_from_the_file_equals_the_tensor_fingerprint(tmp_path, dtype):
    t = (torch.randn(7, 9) * 4).to(dtype) if dtype != torch.bool else torch.randn(7, 9) > 0
    dw = DumpWriter(tmp_path, "actor", "fwd_bwd", 0, "w")
    written = {"x.output": t, "s.output": t[0, 0].clone(), "e.output": t[:0]}
    for name, value in written.items():
        dw.add(name, value, step=0, micro_shard=0)
    dw.write()
    entries = open_source(tmp_path).entries
    assert len(entries) == 3
    loader = TensorLoader()
    for e in entries:  # read without torch: numpy arrays hash like the torch tensors written
        fp = fingerprint(written[e.name], scheme=DUMP_SCHEME)
        assert DUMP_SCHEME == "ftkit-fp1"  # what index version 1 defines
        assert fingerprint_verified(e.ref, loader) == e.ref.fingerprint == fp
        assert fingerprint_array(loader.load(e.ref), DUMP_SCHEME) == fp
        assert fingerprint_array(from_torch(written[e.name]), DUMP_SCHEME) == fp
