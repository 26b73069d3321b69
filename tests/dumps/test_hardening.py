"""compare-dumps and dump never crash or mislead (issue 9, section 2): one test per named case.

Each malformed input is exit 2 with one ``Error:`` line and a ``Hint:`` (never 3, never a
traceback); special files never hang; symlinks leaving a tree are refused; NaN/Inf mismatches
rank first; runs that differ in what shapes their data say so first.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
import torch

from ftkit import cli
from ftkit.dumps.compare import CompareOptions, compare_paths
from ftkit.dumps.writer import DumpWriter
from ftkit.report.compare_rank import worst
from ftkit.tensors.sharding import Sharding

INDEX = "actor/fwd_bwd/rollout_000000/w.index.json"
DATA = "actor/fwd_bwd/rollout_000000/w.safetensors"


def _tree(root: Path, values: dict[str, torch.Tensor]) -> Path:
    dw = DumpWriter(root, "actor", "fwd_bwd", 0, "w", meta={"cell": 0, "rank": 0})
    for name, t in values.items():
        dw.add(name, t, step=0, micro_shard=0, sharding=Sharding.replicated())
    dw.write()
    return root


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    values = {"l0.output": torch.randn(4, 3), "l1.output": torch.randn(5)}
    return _tree(tmp_path / "a", values), _tree(tmp_path / "b", values)


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _exit2(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    """Run compare-dumps and dump-like argv; assert the exit-2 contract; returns stderr."""
    code, out, err = _cli(capsys, *args)
    assert code == 2, (code, out[-400:], err[-400:])
    lines = err.strip().splitlines()
    assert lines[-2].startswith("Error: ") and lines[-1].startswith("Hint: "), err[-400:]
    assert "Traceback" not in err and out == ""
    return err


def _rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    new = mutate(header) if not isinstance(mutate, bytes) else mutate
    body = new if isinstance(new, bytes) else json.dumps(new).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])


def _both_commands(capsys, a: Path, b: Path) -> None:
    _exit2(capsys, "compare-dumps", a, b)
    _exit2(capsys, "dump", a)


def _first_key(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


@pytest.mark.parametrize("dtype", [["F32"], {"x": "F32"}, 7, None])
def test_header_dtype_of_the_wrong_type(pair, capsys, dtype):
    a, b = pair

    def mutate(h):
        h[_first_key(h)]["dtype"] = dtype
        return h

    _rewrite_header(a / DATA, mutate)
    assert "unsupported dtype" in _exit2(capsys, "compare-dumps", a, b)
    _exit2(capsys, "dump", a)


def test_header_nested_100000_deep(pair, capsys):
    a, b = pair
    _rewrite_header(a / DATA, b"{" + b'"x":[' * 100_000 + b"]" * 100_000 + b"}")
    assert "nested deeper" in _exit2(capsys, "compare-dumps", a, b)


def test_index_nested_100000_deep(pair, capsys):
    a, b = pair
    (a / INDEX).write_text('{"tensors": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _both_commands(capsys, a, b)


@pytest.mark.parametrize("digits", [50, 4000, 5000])
def test_shape_integers_with_thousands_of_digits(pair, capsys, digits):
    a, b = pair
    huge = "9" * digits

    def mutate(h):
        h[_first_key(h)]["shape"] = [0]
        return h

    _rewrite_header(a / DATA, mutate)
    raw = (a / DATA).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    body = raw[8 : 8 + n].replace(b'"shape": [0]', f'"shape": [{huge}, 2]'.encode())
    (a / DATA).write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    _both_commands(capsys, a, b)
    index = (a / INDEX).read_text()  # the same in the index
    (b / INDEX).write_text(index.replace('"shape": [\n    4,\n    3\n   ]', f'"shape": [{huge}]'))
    _exit2(capsys, "compare-dumps", b, b)


@pytest.mark.parametrize("field", ["rollout", "step", "micro_shard", "order", "nan", "file_bytes", "schema_version"])
def test_index_fields_of_1e999(pair, capsys, field):
    a, b = pair
    doc = json.loads((a / INDEX).read_text())
    target = doc if field in doc else doc["tensors"][0]
    target[field] = "__INF__"
    text = json.dumps(doc).replace('"__INF__"', "1e999")
    (a / INDEX).write_text(text)
    _both_commands(capsys, a, b)


@pytest.mark.parametrize("kind", [["output"], {"k": 1}, 3, "weights"])
def test_index_kind_of_the_wrong_type(pair, capsys, kind):
    a, b = pair
    doc = json.loads((a / INDEX).read_text())
    doc["tensors"][0]["kind"] = kind
    (a / INDEX).write_text(json.dumps(doc))
    assert "'kind'" in _exit2(capsys, "compare-dumps", a, b)


@pytest.mark.parametrize("sharding", [{"kind": "split", "dim": 1.5, "tp_size": 2}, {"tp_size": 1e300}, [1], "x"])
def test_index_sharding_of_the_wrong_type(pair, capsys, sharding):
    a, b = pair
    doc = json.loads((a / INDEX).read_text())
    doc["tensors"][0]["sharding"] = sharding
    (a / INDEX).write_text(json.dumps(doc))
    _both_commands(capsys, a, b)


def test_the_same_tensor_twice_in_one_index(pair, capsys):
    a, b = pair
    doc = json.loads((a / INDEX).read_text())
    doc["tensors"].append(dict(doc["tensors"][0]))
    (a / INDEX).write_text(json.dumps(doc))
    assert "repeats" in _exit2(capsys, "compare-dumps", a, b)
    doc["tensors"][-1] = {**doc["tensors"][0], "key": doc["tensors"][1]["key"]}  # same name, another key
    (a / INDEX).write_text(json.dumps(doc))
    _exit2(capsys, "compare-dumps", a, b)


@pytest.mark.parametrize(
    "require",
    [
        "not " * 100_000 + "bitwise_equal",
        "(" * 100_000 + "bitwise_equal" + ")" * 100_000,
        " or ".join(["max_abs < 1"] * 50_000),
        "max_abs < " + "9" * 5000,
        "-" * 10_000 + "max_abs < 1",
    ],
    ids=["not-chain", "parens", "long-or", "huge-int", "minus-chain"],
)
def test_rules_expressions_that_would_exhaust_memory_or_the_stack(pair, capsys, tmp_path, require):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[[rule]]\nmatch = '.'\nrequire = '''{require}'''\n")
    _exit2(capsys, "compare-dumps", *pair, "--rules", rules)


def test_rules_file_nested_deeply_or_huge_regex(pair, capsys, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    _exit2(capsys, "compare-dumps", *pair, "--rules", rules)
    rules.write_text("[[rule]]\nmatch = '(a{65535}){65535}{65535}'\nrequire = 'bitwise_equal'\n")
    _exit2(capsys, "compare-dumps", *pair, "--rules", rules)


def _with_timeout(fn, seconds: float = 20.0):
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hung"
    return box.get("r")


def test_a_fifo_inside_a_tree_is_skipped_with_a_warning_never_a_hang(pair, capsys):
    a, b = pair
    for root in (a, b):
        os.mkfifo(root / "actor" / "stray.safetensors")
        os.mkfifo(root / "actor" / "stray.index.json")
    code = _with_timeout(lambda: cli.main(["compare-dumps", str(a), str(b)]))
    out, err = capsys.readouterr()
    assert code == 0 and "not a regular file" in err and "skipped" in err
    code = _with_timeout(lambda: cli.main(["dump", str(a), "--format", "json"]))
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["skipped"] and "skipped" in err


def test_a_fifo_as_the_data_file_of_an_index_or_as_an_argument_is_exit_2(pair, capsys, tmp_path):
    a, b = pair
    (a / DATA).unlink()
    os.mkfifo(a / DATA)
    assert "not a regular file" in _with_timeout(lambda: _exit2(capsys, "compare-dumps", a, b))
    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    _with_timeout(lambda: _exit2(capsys, "compare-dumps", fifo, fifo))
    _with_timeout(lambda: _exit2(capsys, "dump", fifo))


def test_a_symlink_leaving_the_tree_is_refused_unless_follow_symlinks(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.manual_seed(0)
    from ftkit.tensors.st import write_safetensors_atomic

    write_safetensors_atomic(outside / "secret.safetensors", {"x": torch.randn(3)})
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "x.safetensors").symlink_to(outside / "secret.safetensors")
    err = _exit2(capsys, "compare-dumps", tmp_path / "a", tmp_path / "b")
    assert "outside" in err and "--follow-symlinks" in err
    _exit2(capsys, "dump", tmp_path / "a")
    code, _, _ = _cli(capsys, "compare-dumps", tmp_path / "a", tmp_path / "b", "--follow-symlinks")
    assert code == 0
    code, _, _ = _cli(capsys, "dump", tmp_path / "a", "--follow-symlinks")
    assert code == 0
    inside = tmp_path / "c"  # a symlink to a file inside the same tree is fine
    inside.mkdir()
    write_safetensors_atomic(inside / "real.safetensors", {"x": torch.randn(3)})
    (inside / "link.safetensors").symlink_to(inside / "real.safetensors")
    assert _cli(capsys, "dump", inside)[0] == 0


def test_nan_and_inf_mismatches_are_the_worst_difference_and_rank_first(tmp_path, capsys):
    nan, inf = float("nan"), float("inf")
    a = _tree(tmp_path / "a", {"big.output": torch.tensor([0.0, 0.0, 0.0]), "bad.output": torch.tensor([1, nan, inf])})
    b = _tree(tmp_path / "b", {"big.output": torch.tensor([0.0, 5.0, 0.0]), "bad.output": torch.tensor([1, 2, -inf])})
    result = compare_paths(a, b, CompareOptions("tolerance"))
    bad = next(p for p in result.pairs if p.name == "bad.output")
    m = bad.metrics
    assert m is not None and m.nonfinite_mismatch == 2 and m.max_abs == inf and m.dissimilarity == inf
    assert bad.status == "differ" and "max_abs=inf" in bad.message
    assert [p.name for p in worst(result, 2)] == ["bad.output", "big.output"]
    code, out, _ = _cli(capsys, "compare-dumps", a, b, "--exact")
    assert code == 1


def _run_dir(root: Path, micro_shards: int, values: dict[str, torch.Tensor]) -> Path:
    root.mkdir(parents=True)
    config = {"model": "tiny", "micro_shards": micro_shards, "samples_per_rollout": 64, "seed": 0, "cells": 2}
    (root / "run.json").write_text(json.dumps({"schema": "ftkit.run/1", "config": config}))
    _tree(root / "dumps", values)
    return root


def test_runs_that_differ_in_what_shapes_the_data_say_so_first(tmp_path, capsys):
    a = _run_dir(tmp_path / "a", 8, {"x.output": torch.ones(2, 4)})
    b = _run_dir(tmp_path / "b", 4, {"x.output": torch.ones(4, 4)})
    result = compare_paths(a, b, CompareOptions("tolerance"))
    assert result.findings[0].code == "CD012" and "micro_shards: 8 in A, 4 in B" in result.findings[0].message
    assert result.config_diff == {"micro_shards": (8, 4)}
    assert [f.code for f in result.findings[1:]] == ["CD002"]
    code, out, _ = _cli(capsys, "compare-dumps", a, b)
    assert code == 1 and out.index("micro_shards") < out.index("CD002")
    code, out, _ = _cli(capsys, "compare-dumps", a, b, "--format", "json")
    doc = json.loads(out)
    assert doc["config_diff"] == {"micro_shards": {"a": 8, "b": 4}}
    c = _run_dir(tmp_path / "c", 8, {"x.output": torch.ones(2, 4)})  # cells differ: not data-shaping
    doc = json.loads((c / "run.json").read_text())
    doc["config"]["cells"] = 1
    (c / "run.json").write_text(json.dumps(doc))
    assert compare_paths(a, c, CompareOptions("exact")).findings == []


def test_a_malformed_run_json_is_exit_2(tmp_path, capsys):
    a = _run_dir(tmp_path / "a", 8, {"x.output": torch.ones(2)})
    b = _run_dir(tmp_path / "b", 8, {"x.output": torch.ones(2)})
    (a / "run.json").write_text("[" * 100_000)
    _exit2(capsys, "compare-dumps", a, b)


def test_a_tensor_in_the_data_file_but_not_in_the_index(pair, capsys):
    """Issue 26 item 13: the data file holds one more tensor than its index lists (the index's
    ``file_bytes`` fixed up as a consistent forger would): exit 2 for compare-dumps and dump."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    a, b = pair
    data, index = a / DATA, a / INDEX
    tensors = load_file(str(data))
    save_file({**tensors, "hidden": np.zeros(3, dtype=np.float32)}, str(data))
    doc = json.loads(index.read_text())
    if "file_bytes" in doc:
        doc["file_bytes"] = data.stat().st_size
    index.write_text(json.dumps(doc))
    err = _exit2(capsys, "compare-dumps", "--exact", a, b)
    assert "does not list" in err and "hidden" in err
    _exit2(capsys, "compare-dumps", "--exact", b, a)
    _exit2(capsys, "dump", a)


@pytest.mark.parametrize("meta", [[], None, [1, 2], {"k": 5}])
def test_metadata_is_absent_or_an_object_of_strings(pair, capsys, meta):
    """Issue 26 item 13: one rule for ``__metadata__`` (``[]`` and ``null`` were taken as empty)."""
    a, b = pair
    _rewrite_header(a / DATA, lambda h: {**h, "__metadata__": meta})
    assert "__metadata__ must be absent or an object" in _exit2(capsys, "compare-dumps", a, b)


def test_a_record_without_model_digest_pairs_with_an_empty_one():
    from ftkit.dumps.sources import config_diff

    assert config_diff({"model": "tiny"}, {"model": "tiny", "model_digest": ""}) == {}
    assert config_diff({"model": "/m"}, {"model": "/m", "model_digest": "ab"}) == {"model_digest": ("", "ab")}
