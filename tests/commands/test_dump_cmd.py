"""``ftkit dump``: what a dump holds, statistics, filters, JSON, and malformed input."""

from __future__ import annotations

import json

import pytest
import torch

from ftkit import cli
from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import write_safetensors_atomic


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    write_safetensors_atomic(run / "rollouts" / "rollout_000000.safetensors", {"tokens": torch.arange(6).reshape(2, 3)})
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), -6.0]])
    for tp in range(2):
        dw = DumpWriter(
            run / "dumps", "actor", "fwd_bwd", 3, f"step000006-ms001-tp{tp}-pp0", meta={"cell": 1, "rank": tp}
        )
        dw.add(
            "decoder.layers.0.mlp.linear_fc1.output.0",
            x[:, tp : tp + 1].contiguous(),
            step=6,
            micro_shard=1,
            sharding=Sharding.split(1, tp, 2),
        )
        dw.add("decoder.layers.1.mlp.output.0", x, step=6, micro_shard=1)
        dw.write()
    crit = DumpWriter(run / "dumps", "critic", "fwd_only", 3, "step000006-ms001-tp0-pp0", meta={"cell": 1})
    crit.add("head.output", torch.arange(4, dtype=torch.int32), step=6, micro_shard=1)
    crit.write()
    return run


def _run(capsys, *args):
    code = cli.main(["dump", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lists_everything_with_statistics(run_dir, capsys):
    code, out, _ = _run(capsys, run_dir, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["schema_version"] == 1 and doc["kind"] == "run"
    assert doc["prefixes"] == ["actor", "critic"]
    assert sorted((w["prefix"], w["phase"], w["rollout"], w["writer"]) for w in doc["writers"]) == [
        ("actor", "fwd_bwd", 3, "step000006-ms001-tp0-pp0"),
        ("actor", "fwd_bwd", 3, "step000006-ms001-tp1-pp0"),
        ("critic", "fwd_only", 3, "step000006-ms001-tp0-pp0"),
    ]
    assert [f["path"] for f in doc["files"]] == ["rollouts/rollout_000000.safetensors"]
    rows = {(t["id"], t["origin"]): t for t in doc["tensors"]}
    full = rows[
        ("actor/fwd_bwd/rollout_000003/step000006/ms001:decoder.layers.1.mlp.output.0", "step000006-ms001-tp0-pp0")
    ]
    finite = torch.tensor([1.0, 2.0, 4.0, -6.0], dtype=torch.float64)
    assert full["stats"] == {
        "numel": 6,
        "min": -6.0,
        "max": 4.0,
        "mean": pytest.approx(float(finite.mean())),
        "std": pytest.approx(float(finite.std(unbiased=False))),
        "nan": 1,
        "inf": 1,
    }
    assert full["dtype"] == "float32" and full["shape"] == [2, 3] and len(full["fingerprint"]) == 32
    shard = rows[
        (
            "actor/fwd_bwd/rollout_000003/step000006/ms001:decoder.layers.0.mlp.linear_fc1.output.0",
            "step000006-ms001-tp1-pp0",
        )
    ]
    assert shard["sharding"] == {"kind": "split", "dim": 1, "tp_rank": 1, "tp_size": 2, "stride": 1}
    assert shard["stats"]["min"] == 2.0 and shard["stats"]["inf"] == 1
    tokens = rows[("rollouts/rollout_000000.safetensors:tokens", "rollouts/rollout_000000.safetensors")]
    assert tokens["stats"]["max"] == 5 and tokens["stats"]["mean"] == 2.5


def test_filter_and_no_stats(run_dir, capsys):
    code, out, _ = _run(capsys, run_dir / "dumps", "--filter", r"critic/.*head", "--no-stats", "-f", "json")
    doc = json.loads(out)
    assert code == 0 and doc["kind"] == "dumps"
    assert [t["name"] for t in doc["tensors"]] == ["head.output"] and "stats" not in doc["tensors"][0]
    assert [w["prefix"] for w in doc["writers"]] == ["critic"]


def test_human_output(run_dir, capsys):
    code, out, err = _run(capsys, run_dir / "dumps" / "actor" / "fwd_bwd" / "rollout_000003")
    assert code == 0 and "Dump writers" in out and "step000006-ms001-tp1-pp0" in out
    assert "split d1 1/2" in out and "Tensors (4)" in out


def test_bad_filter_and_corrupt_input_exit_2(run_dir, capsys):
    code, out, err = _run(capsys, run_dir, "--filter", "(")
    assert code == 2 and err.startswith("Error: --filter '(' is not a valid regex")
    data = run_dir / "rollouts" / "rollout_000000.safetensors"
    data.write_bytes(data.read_bytes()[:-3])
    code, out, err = _run(capsys, run_dir)
    assert code == 2 and out == "" and "malformed safetensors file" in err and "Traceback" not in err
    code, _, err = _run(capsys, run_dir / "missing")
    assert code == 2 and "does not exist" in err


def test_a_place_without_dumps_is_exit_2(tmp_path, capsys):
    from ftkit.cli import main

    (tmp_path / "notes.txt").write_text("no tensors here")
    assert main(["dump", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("Error: nothing to inspect: no dumps or safetensors files in")


def test_offline_options_without_from_checkpoint_are_worded_for_one(tmp_path, capsys):
    from ftkit import cli

    code = cli.main(["dump", str(tmp_path), "--rollout", "3"])
    _, err = capsys.readouterr()
    assert code == 2 and "Error: --rollout applies only with --from-checkpoint" in err and "drop it" in err


def test_non_finite_and_overflowing_tensors_print_no_numpy_warnings(tmp_path):
    """Issue 24 item 10: NaN, Inf and sums beyond float64 are values in the table, not
    RuntimeWarnings naming ftkit's source files on stderr (run with warnings shown)."""
    import subprocess
    import sys

    path = tmp_path / "x.safetensors"
    big = torch.tensor([1e308, 1e308, -1e308, float("nan")], dtype=torch.float64)
    write_safetensors_atomic(path, {"big": big, "bad": torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])})
    argv = [sys.executable, "-W", "always::RuntimeWarning", "-m", "ftkit", "dump", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0 and "big" in done.stdout
    assert "Warning" not in done.stderr, done.stderr


def test_finite_values_whose_sums_overflow_get_a_finite_mean_and_std():
    """1e308, 1e308, -1e308 are finite: their mean and std are numbers (measured again scaled by
    a power of two), not the inf / nan an overflowing float64 sum gives."""
    import numpy as np

    from ftkit.dumps.stats import tensor_stats

    a = np.array([1e308, 1e308, -1e308, np.nan])
    got = tensor_stats(a)
    want = a[:3] / 1e300
    assert got["nan"] == 1 and got["inf"] == 0 and (got["min"], got["max"]) == (-1e308, 1e308)
    assert abs(got["mean"] - float(np.mean(want)) * 1e300) <= 1e-12 * 1e308
    assert abs(got["std"] - float(np.std(want)) * 1e300) <= 1e-12 * 1e308
    assert tensor_stats(np.array([1.0, 2.0, 3.0])) == {
        "numel": 3, "min": 1.0, "max": 3.0, "mean": 2.0, "std": float(np.std([1.0, 2.0, 3.0])), "nan": 0, "inf": 0,
    }  # fmt: skip
