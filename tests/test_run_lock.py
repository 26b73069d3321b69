"""One ``ftkit train`` per run directory (issue 26 item 11): a second one is exit 2 naming the
owner, and a killed owner never leaves the lock stuck (``ftkit.run_lock``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ftkit.cli import main
from ftkit.errors import UsageError
from ftkit.run_lock import hold_run_dir, lock_path

REPO = Path(__file__).resolve().parents[1]
HOLDER = """import sys, time
from ftkit.run_lock import hold_run_dir
with hold_run_dir(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture()
def holder(tmp_path: Path):  # noqa: ANN201
    """A process that holds the lock of ``tmp_path / "run"`` until killed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_holder_is_refused_naming_the_owner(tmp_path: Path, holder: subprocess.Popen) -> None:
    with pytest.raises(UsageError) as err, hold_run_dir(tmp_path / "run"):
        pass
    assert f"pid {holder.pid} on {socket.gethostname()}" in err.value.message and "running" in err.value.message
    assert f"kill {holder.pid}" in (err.value.hint or "")


def test_a_killed_owner_leaves_no_stuck_lock(tmp_path: Path, holder: subprocess.Popen) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with hold_run_dir(tmp_path / "run"):
        owner = json.loads(lock_path(tmp_path / "run").read_text())
        assert owner["pid"] == os.getpid()
    with hold_run_dir(tmp_path / "run"):  # released on exit, taken again
        pass


def test_a_second_train_of_the_run_is_exit_2_naming_the_owner(
    tmp_path: Path, holder: subprocess.Popen, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before Ray starts or a file is touched: ``train --resume`` and ``train --overwrite`` of a
    run directory another process trains."""
    from ftkit.tasks.addition import AdditionTask
    from ftkit.train.config import TrainConfig
    from ftkit.train.control.rundir import write_run_json

    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(out=run)
    write_run_json(run, cfg, "cpu", AdditionTask(cfg.task.response_len))
    before = sorted(p.name for p in run.iterdir())
    for args in (["--resume", str(run)], ["--out", str(run), "--overwrite"]):
        assert main(["train", *args]) == 2
        err = capsys.readouterr().err
        assert f"Error: {run} is being trained by another ftkit train (pid {holder.pid}" in err, err
        assert "Hint: " in err and "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before
