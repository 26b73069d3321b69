"""A publishing process killed with SIGKILL at every phase, and at a random moment from outside:
after ``reconcile`` nothing partial is visible, everything published verifies, and a checkpoint
is published exactly when its journal reached the commit point."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftkit.checkpoint import journal
from ftkit.checkpoint.layout import FAULT_POINTS
from ftkit.checkpoint.retention import load_records
from ftkit.checkpoint.verify import verify_path

HELPER = Path(__file__).with_name("ckpt_helpers.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}


def _assert_consistent(ck: Path) -> list[str]:
    """Before reconcile, what the records and ``latest`` publish is complete; after it: no hidden
    leftovers, every step_* recorded and verified, ``latest`` the newest."""
    records, _ = load_records(ck)
    for r in records:
        assert verify_path(ck / r.name).findings == [], r.name
    if (ck / "latest").is_symlink():  # may lag the records while a journal is pending, never dangle
        assert verify_path(ck / os.readlink(ck / "latest")).findings == []
    journal.reconcile(ck)
    assert [p.name for p in ck.iterdir() if p.name.startswith(".")] == []
    result = verify_path(ck)
    assert result.findings == [], [f.message for f in result.findings]
    records, latest = load_records(ck)
    names = sorted(p.name for p in ck.glob("step_*"))
    assert names == sorted(r.name for r in records)
    assert latest == max(records, key=lambda r: r.step).name == os.readlink(ck / "latest")
    return names


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_each_phase(tmp_path, point) -> None:
    ck = tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, str(HELPER), str(ck), point, "3"], env=ENV, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    names = _assert_consistent(ck)
    killed = "step_000012"
    # the commit point is the pending journal: killed before it -> gone; at cleanup -> published
    assert (killed in names) == (point == "publish_cleanup")


def test_sigkill_from_outside_at_random_moments(tmp_path) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    ck = tmp_path / "checkpoints"
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), str(ck), "loop", "1"], env=ENV, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            delay = rng.uniform(0.05, 1.5)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        names = _assert_consistent(ck)
        assert names, f"seed {seed}, attempt {attempt}: nothing published"
