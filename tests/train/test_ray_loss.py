"""Ray's GCS SIGKILLed by pid from outside under a real ``ftkit train``: actors keep answering,
so without a watch the driver trained on until Ray's client ended it a minute later with
nothing logged (and, once ended by ftkit without ``ray.shutdown``, Ray crashed at interpreter
exit). Now the run ends with exit 1, one ``Error:`` line, ``run_finished`` ``failed`` and
``status.json``. (The raylet killed is not tested here: Ray's client usually ends the driver at
once, before any Python runs; ``test_run_end`` covers the other outcome, a placement group
removed under the cells' restart.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from driver_log import driver_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int, name: str) -> list[int]:
    """Pids of the direct children of ``pid`` whose command name is ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
            if comm == name and int(rest[1]) == pid:
                found.append(int(entry.name))
    return found


def _first_step(run: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if 1 in driver_steps(run):
            return
        time.sleep(0.2)
    pytest.fail(f"the run never reached step 1 (exit {proc.poll()})")


def test_the_gcs_killed_under_the_run_ends_it_cleanly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", "--out", str(run), "--rollouts", "400", "--cells", "2"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its local Ray shares the session: killed with it at the end
    )
    try:
        _first_step(run, proc)
        (pid,) = _children(proc.pid, "gcs_server")
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    text = err.decode(errors="replace")
    assert proc.returncode == 1, (proc.returncode, text[-3000:])
    errors = [line for line in text.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Ray's GCS" in errors[0], text[-3000:]
    assert "bug in ftkit" not in text and "Traceback" not in text
    status = json.loads((run / "status.json").read_text())
    assert (status["status"], status["exit_code"]) == ("failed", 1)
    driver = [json.loads(line) for line in (run / "events" / "driver-i0.jsonl").read_text().splitlines()]
    assert [e["type"] for e in driver[-2:]] == ["run_finished", "log_closed"]
    # Ray's own end of a driver without its GCS left neither run_finished nor status.json
    assert driver[-2]["status"] == "failed" and driver[-2]["reason"] == status["reason"]
