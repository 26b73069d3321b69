"""FtkitCallback on the Hugging Face Trainer: a tiny random-init Llama on CPU (tests/integrations/
hf_train.py), in one process and under a 2-process torchrun DDP with a planted divergence. Slow:
each case imports transformers and trains a few steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftkit import cli

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("hf_train.py")
pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def analyze(run: Path, capsys) -> dict:
    cli.main(["analyze-events", str(run / "events"), "--format", "json"])
    return json.loads(capsys.readouterr().out)


def test_one_callback_gives_a_run_that_analyzes_and_verifies(tmp_path, capsys):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = analyze(tmp_path, capsys)
    assert doc["verdict"] == "pass" and doc["findings"] == [], doc["findings"]
    assert doc["stats"]["steps_committed"] == 4 and doc["stats"]["not_covered"] == ["FT102", "FT114"]
    assert doc["stats"]["evidence_profile"] == {
        "state_fingerprint": 1,
        "witness_counts": 1,
        "metric": 1,
        "checkpoint": 2,
    }
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]
    assert cli.main(["verify-checkpoint", str(tmp_path)]) == 0  # ftkit's checkpoints against the logged fingerprints
    capsys.readouterr()


def test_a_nan_gradient_at_a_save_makes_the_guard_refuse_the_publication(tmp_path, capsys):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--plant-nan", "3"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(x) for x in (tmp_path / "events" / "driver-i0.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["type"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [3] and "guard" in rejected[0]["reason"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001"]
    trainer = [json.loads(x) for x in (tmp_path / "events" / "trainer-c0-r0-i0.jsonl").read_text().splitlines()]
    assert {e["step"] for e in trainer if e["type"] == "grad_nonfinite"} == {3}
    assert cli.main(["verify-checkpoint", str(tmp_path)]) == 0  # the one published before the NaN
    capsys.readouterr()
    doc = analyze(tmp_path, capsys)  # the Trainer stepped on the NaN: never a pass
    assert doc["verdict"] == "fail"
    assert [(f["code"], f["evidence"]["step"]) for f in doc["findings"]] == [("FT106", 3), ("FT109", 3)]


def test_a_nan_update_the_trainer_commits_fails_though_hf_logs_the_loss_as_finite(tmp_path, capsys):
    """Issue 38 item 1: from step 1 on the model is all-NaN, HF's ``logging_nan_inf_filter`` logs a
    finite loss, and the verdict was PASS."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--plant-nan", "1"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = analyze(tmp_path, capsys)
    assert doc["verdict"] == "fail"
    found = sorted((f["code"], f["evidence"]["step"]) for f in doc["findings"])
    assert found == [("FT106", 1), ("FT106", 2), ("FT106", 3), ("FT109", 1), ("FT109", 2), ("FT109", 3)], found


def test_a_planted_divergence_under_two_process_ddp_is_ft101_at_that_step(tmp_path, capsys):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    done = subprocess.run(
        [*cmd, "--out", str(tmp_path), "--plant-divergence", "1"], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = analyze(tmp_path, capsys)
    assert doc["stats"]["cells"] == 2
    codes = {f["code"] for f in doc["findings"] if f["severity"] == "error"}
    assert codes == {"FT101"}, doc["findings"]  # witnesses over 2 epochs and both ranks: exactly once
    first = min((f for f in doc["findings"] if f["code"] == "FT101"), key=lambda f: f["evidence"]["step"])
    assert first["evidence"]["step"] == 1 and first["evidence"]["cells"] == [1]
