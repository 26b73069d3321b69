"""Shared fixtures of the event tests.

``real_run``: the events/ directory of one small real ``ftkit train`` run (2 cells, 2 rollouts;
Ray and megatron-core started in a subprocess), made once per test session. Tests using it are
marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "run"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--rollouts", "2", "--out", str(out), "--format", "json"],
        capture_output=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return out / "events"
