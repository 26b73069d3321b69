"""``ftkit compare-runs`` on logs of the evidence API (issue 39, item 5): examples/ddp_train.py under
``torchrun --nproc-per-node 2`` twice with the same seed compares equal; a run with one weight moved
by one ulp on every rank after step 2 (replicas still identical: analyze-events passes it) diverges
at step 2, in the state, naming the tensor. Slow: each run starts two torch processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftkit import cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ddp_train.py"
pytestmark = pytest.mark.slow
SMALL = ["--epochs", "2", "--samples", "16", "--batch", "2", "--checkpoint-every", "4"]  # 8 steps


def torchrun(out: Path, *flags: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE)]
    done = subprocess.run(
        [*cmd, "--out", str(out), *SMALL, *flags], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = cli.main(["compare-runs", str(a), str(b), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_same_seed_equal_and_a_one_ulp_change_diverges_at_its_step(tmp_path: Path, capsys) -> None:
    a = torchrun(tmp_path / "a")
    b = torchrun(tmp_path / "b")
    code, doc = compare(a, b, capsys)
    assert code == 0 and doc["first_divergence"] is None, doc["findings"]
    assert doc["steps"]["common"] == 8 and doc["kinds"]["state"]["compared"] == 8
    assert doc["kinds"]["witness"]["compared"] == 8 and doc["kinds"]["metric"]["compared"] > 0
    ulp = torchrun(tmp_path / "ulp", "--plant-ulp", "2")
    assert cli.main(["analyze-events", str(ulp), "--format", "json"]) == 0  # a consistent run on its own
    capsys.readouterr()
    code, doc = compare(a, ulp, capsys)
    assert code == 1
    first = doc["first_divergence"]
    assert (first["step"], first["rollout"], first["what"]) == (2, 0, "state")
    assert first["tensor"] == "0.weight"
    assert first["differing_steps"] == 6 and first["also"] == []
    assert [r for r in doc["config_diff"] if r["kind"] == "result"][0]["field"] == "plant_ulp"
