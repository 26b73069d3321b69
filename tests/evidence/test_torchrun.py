"""examples/ddp_train.py under a real ``torchrun --nproc-per-node 2`` (gloo, CPU): the clean run
analyzes clean and its checkpoints verify (a tampered one does not); each planted fault is found
where it was planted. Slow: each case starts two torch processes."""

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
SMALL = ["--epochs", "1", "--samples", "16", "--batch", "2", "--checkpoint-every", "2"]  # 4 steps


def torchrun(out: Path, *flags: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE)]
    done = subprocess.run(
        [*cmd, "--out", str(out), *SMALL, *flags], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def analyze(run: Path, capsys) -> dict:
    code = cli.main(["analyze-events", str(run / "events"), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == (1 if doc["findings"] else 0)
    return doc


def errors(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in doc["findings"]:
        if f["severity"] == "error":
            out.setdefault(f["code"], []).append(f)
    return out


def test_clean_run_analyzes_clean_and_its_checkpoints_verify(tmp_path, capsys):
    run = torchrun(tmp_path / "clean")
    doc = analyze(run, capsys)
    assert doc["verdict"] == "pass" and doc["stats"]["cells"] == 2 and doc["stats"]["steps_committed"] == 4
    assert sorted(p.name for p in (run / "events").iterdir()) == [
        "driver-i0.jsonl",
        "trainer-c0-r0-i0.jsonl",
        "trainer-c1-r0-i0.jsonl",
    ]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]
    assert cli.main(["verify-checkpoint", str(run)]) == 0  # cross-checked with the event log
    model = run / "checkpoints" / "step_000003" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    model.write_bytes(bytes(data))
    assert cli.main(["verify-checkpoint", str(run / "checkpoints" / "step_000003")]) == 1
    capsys.readouterr()


def test_one_ranks_weights_perturbed_once_is_ft101_at_that_step(tmp_path, capsys):
    run = torchrun(tmp_path / "div", "--plant-divergence", "2")
    doc = analyze(run, capsys)
    found = errors(doc)
    assert set(found) == {"FT101"}
    first = found["FT101"][0]
    assert first["evidence"]["step"] == 2 and first["evidence"]["cells"] == [1]
    # Issue 38 item 2: the checkpoint after the divergence is refused, not rank 0's state published.
    driver = [json.loads(x) for x in (run / "events" / "driver-i0.jsonl").read_text().splitlines()]
    rejected = [e for e in driver if e["type"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [3] and "replicas diverged at step 3" in rejected[0]["reason"]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]


def test_a_dropped_and_a_duplicated_sample_are_ft103_and_ft104(tmp_path, capsys):
    doc = analyze(torchrun(tmp_path / "wit", "--plant-drop", "5", "--plant-duplicate", "9"), capsys)
    found = errors(doc)
    assert set(found) == {"FT103", "FT104"}
    assert [i["id"] for i in found["FT103"][0]["evidence"]["ids"]] == [5]
    assert [(i["id"], i["counted"]) for i in found["FT104"][0]["evidence"]["ids"]] == [(9, 2)]
    # the hints speak of a DDP job's data loading, not of ftkit train's micro-shards (issue 38 item 16)
    assert all("micro-shard" not in fs[0]["fix"] and "sampler" in fs[0]["fix"] for fs in found.values())


def test_a_nan_gradient_at_a_save_makes_the_guard_refuse_the_publication(tmp_path, capsys):
    run = torchrun(tmp_path / "nan", "--plant-nan", "3")
    events = [json.loads(x) for x in (run / "events" / "driver-i0.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["type"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [3] and "guard" in rejected[0]["reason"]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]
    doc = analyze(run, capsys)  # discarded on every rank and retried: nothing lost, nothing untrusted
    assert doc["verdict"] == "pass", doc["findings"]
    assert cli.main(["verify-checkpoint", str(run)]) == 0
    capsys.readouterr()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_worker_killed_by_sigkill_is_restarted_by_torchrun_and_resumes_from_its_checkpoint(tmp_path, capsys):
    """torchrun --max-restarts 1; rank 1 waits after step 5 (epoch 1 of 3, 4 steps each; a checkpoint
    at every epoch's last step) and is killed from here with SIGKILL by the pid its log records.
    torchrun's second attempt resumes from step_000003 (the end of epoch 0), not from step 0."""
    import signal
    import time

    run = tmp_path / "elastic"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "1"]
    flags = ["--epochs", "3", "--samples", "16", "--batch", "2", "--checkpoint-every", "4", "--plant-stall", "5"]
    job = subprocess.Popen([*cmd, str(EXAMPLE), "--out", str(run), *flags], env=env, stderr=subprocess.PIPE, text=True)
    killed = run / "events" / "trainer-c1-r0-i0.jsonl"
    pid = None
    while pid is None and job.poll() is None:  # until rank 1 has logged step 5 whole (then it waits)
        time.sleep(0.2)
        lines = _lines(killed) if killed.exists() else []
        pid = next((e["source"]["pid"] for e in lines if e["type"] == "state_fingerprint" and e["step"] == 5), None)
    assert pid is not None, job.communicate()[1][-3000:]
    os.kill(pid, signal.SIGKILL)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-3000:]
    assert "exitcode: -9" in err  # torchrun saw the kill and restarted the workers

    events = run / "events"
    assert sorted(p.name for p in events.iterdir()) == [
        "driver-i0.jsonl",
        "driver-i1.jsonl",
        "trainer-c0-r0-i0.jsonl",
        "trainer-c0-r0-i1.jsonl",
        "trainer-c1-r0-i0.jsonl",
        "trainer-c1-r0-i1.jsonl",
    ]
    resumed = _lines(events / "driver-i1.jsonl")
    assert resumed[0]["type"] == "run_resumed" and "run_started" not in {e["type"] for e in resumed}
    assert (resumed[0]["checkpoint"], resumed[0]["checkpoint_step"], resumed[0]["checkpoint_rollout"]) == (
        "step_000003",
        3,
        0,
    )
    assert _lines(killed)[-1]["type"] != "log_closed"  # the killed incarnation's log just ends
    for cell in (0, 1):
        steps = [e["step"] for e in _lines(events / f"trainer-c{cell}-r0-i1.jsonl") if e["type"] == "step_outcome"]
        assert steps == list(range(4, 12))  # epochs 1 and 2 again, from the checkpoint's state
    doc = analyze(run, capsys)
    assert doc["verdict"] == "pass", doc["findings"]
    rules = {r["code"]: r for r in doc["rules"]}
    assert all(rules[c]["checked"] > 0 for c in ("FT101", "FT103", "FT104"))
    assert cli.main(["verify-checkpoint", str(run)]) == 0
    capsys.readouterr()
