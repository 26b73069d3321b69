"""Fault tolerance of ``ftkit train`` with real faults on real processes (docs/faults.md).

A fault-free run and faulted runs of the same seed: the test itself sends ``SIGKILL`` or
``SIGSTOP`` to a rank actor's process (its pid from the rank's own events) in the middle of
the run, and ``SIGTERM`` to an ``ftkit train`` subprocess. Artefacts are checked: the run
commits every step, the analyzer passes, ``ftkit compare-dumps --exact`` against the
fault-free run exits 0 (final state, rollouts, dumps), the engines were sent the same
weights, and the log holds the detection (``cell_state`` -> ``failed`` with the cause) and
the heal (fingerprints equal). Runs are tiny (3 rollouts of 2 steps, 16 samples).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import Trigger, all_events

from ftkit.cli import main
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan

BASE = dict(
    rollouts=4,
    steps_per_rollout=2,
    samples_per_rollout=16,
    micro_shards=4,
    group_size=4,
    seed=23,
    cells=2,
    collective_timeout=5.0,
    step_timeout=40.0,
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def baseline(ray_session, tmp_path_factory):
    return run_training(build_plan(TrainConfig(**BASE, out=tmp_path_factory.mktemp("ft") / "base")))


def weights_sent(run_dir: Path) -> dict[int, str]:
    return {e["version"]: e["total"] for e in all_events(run_dir, "weights_sent")}


def check_equal_to_baseline(result, baseline) -> None:
    assert result.steps_committed == result.steps_total
    assert result.analysis.verdict("error") == "pass", result.analysis.findings
    assert main(["compare-dumps", "--exact", str(result.run_dir), str(baseline.run_dir)]) == 0
    assert weights_sent(result.run_dir) == weights_sent(baseline.run_dir)
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "completed"


def failures(run_dir: Path) -> list[dict]:
    return [e for e in all_events(run_dir, "cell_state") if e["new"] == "failed"]


def test_sigkill_of_a_rank_is_survived_healed_and_bitwise_equal(baseline, tmp_path):
    out = tmp_path / "kill"
    trigger = Trigger(out, cell=1, step=0, action=lambda pid: os.kill(pid, signal.SIGKILL))
    trigger.start()
    result = run_training(build_plan(TrainConfig(**BASE, out=out)))
    assert trigger.fired is not None
    check_equal_to_baseline(result, baseline)
    (fail,) = failures(out)
    assert fail["cell"] == 1 and "died" in fail["reason"]
    heals = all_events(out, "heal")
    states = [(e["cell"], e["new"], e["reason"]) for e in all_events(out, "cell_state")]
    assert [(h["cell"], h["donor"]) for h in heals] == [(1, 0)], states
    assert heals[0]["total"] == heals[0]["donor_total"] and heals[0]["bytes"] > 0
    # the healed incarnation committed steps, with the fingerprints of its peer
    healed = {(e["step"], e["total"]) for e in all_events(out, "state_fingerprint") if e["source"]["incarnation"] == 1}
    assert healed and healed <= {(e["step"], e["total"]) for e in all_events(baseline.run_dir, "state_fingerprint")}
    discarded = [e for e in all_events(out, "step_outcome") if e["outcome"] == "discarded"]
    assert all(e["cell"] == 0 for e in discarded)
    # nobody injected the kill: the detected failure is the recovery table's row, recovered and healed
    (row,) = result.analysis.recovery
    assert (row["injected"], row["kind"], row["cell"]) == (False, "detected", 1), row
    assert row["recovered_by"] == "reconfigure" and row["heal_s"] is not None and row["samples_lost"] == 0, row


def test_sigstopped_rank_is_detected_by_deadline_killed_and_replaced(baseline, tmp_path):
    out = tmp_path / "stop"
    trigger = Trigger(out, cell=1, step=1, action=lambda pid: os.kill(pid, signal.SIGSTOP))
    trigger.start()
    result = run_training(build_plan(TrainConfig(**BASE, out=out)))
    assert trigger.fired is not None
    check_equal_to_baseline(result, baseline)
    (fail,) = failures(out)
    assert fail["cell"] == 1 and "hung" in fail["reason"]
    with pytest.raises(ProcessLookupError):  # killed, not left stopped
        for _ in range(100):
            os.kill(trigger.fired, 0)
            time.sleep(0.1)


def _ftkit(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen(
        [sys.executable, "-m", "ftkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _args(out: Path, **kw: object) -> list[str]:
    cfg = {**BASE, **kw}
    args = ["train", "--out", str(out)]
    for key, value in cfg.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process, from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                out[int(entry.name)] = int(fields[1])
    return out


def _descendants(pid: int) -> list[int]:
    parents, found, frontier = _parents(), [], {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        found += sorted(frontier)
    return found


def _gone(pids: list[int], within_s: float = 30.0) -> list[int]:
    """The pids of ``pids`` still alive after ``within_s`` seconds."""
    end = time.monotonic() + within_s
    left = pids
    while left and time.monotonic() < end:
        alive = _parents()
        left = [p for p in left if p in alive]
        time.sleep(0.2)
    return left


def test_sigterm_stops_the_run_cleanly_with_exit_143(tmp_path):
    out = tmp_path / "term"
    proc = _ftkit(*_args(out, rollouts=6))
    pids: list[int] = []
    trigger = Trigger(out, cell=0, step=0, action=lambda pid: (pids.extend(_descendants(proc.pid)), proc.terminate()))
    trigger.start()
    stdout, stderr = proc.communicate(timeout=600)
    assert trigger.fired is not None
    assert proc.returncode == 143, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "Traceback" not in stderr and "bug" not in stderr
    assert stdout == ""
    finished = all_events(out, "run_finished")
    assert [e["status"] for e in finished] == ["interrupted"]
    assert json.loads((out / "status.json").read_text())["status"] == "interrupted"
    assert trigger.fired in pids and not _gone(pids)  # every actor and the local Ray are gone


def test_last_cell_dying_fails_cleanly_with_exit_1(tmp_path):
    out = tmp_path / "last"
    proc = _ftkit(*_args(out, cells=1), "--no-heal")
    trigger = Trigger(out, cell=0, step=1, action=lambda pid: os.kill(pid, signal.SIGKILL))
    trigger.start()
    stdout, stderr = proc.communicate(timeout=600)
    assert trigger.fired is not None
    assert proc.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "min-cells" in lines[0] and "Traceback" not in stderr and "bug" not in stderr
    (finished,) = all_events(out, "run_finished")
    assert finished["status"] == "failed" and "min-cells" in finished["reason"]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 1
