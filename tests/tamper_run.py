"""A real ``ftkit train`` run to copy and tamper with, the way testers find fail-open bugs.

``real_train_run`` (session fixture): the run directory of one small real ``ftkit train`` run
(2 cells, 3 rollouts, checkpoints every step, dumps of the first and last rollout; Ray and
megatron-core started in a subprocess), made once per test session. ``FTKIT_TEST_RUN`` names an
existing run made by ``ftkit train`` to use instead (it is never modified). Tests take a copy
with ``copy_run`` and tamper with the copy; tests using it are marked slow.

``real_fault_run`` (session fixture): the same with a fault, so that it holds a later
incarnation's evidence: cell 1's rank is SIGKILLed in its first step's reduction, restarted and
healed, and its second incarnation (``trainer-c1-r0-i1.jsonl``) commits the later steps
(4 rollouts). ``FTKIT_TEST_FAULT_RUN`` names an existing one instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _train(out: Path, *args: str) -> Path:
    """A real ``ftkit train`` run into ``out`` (this checkout's ftkit, in a subprocess)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", *args, "--out", str(out), "--format", "json"],
        capture_output=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return out


@pytest.fixture(scope="session")
def real_train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reuse = os.environ.get("FTKIT_TEST_RUN")
    if reuse:
        return Path(reuse)
    return _train(tmp_path_factory.mktemp("real_train") / "run", "--rollouts", "3")


@pytest.fixture(scope="session")
def real_fault_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reuse = os.environ.get("FTKIT_TEST_FAULT_RUN")
    if reuse:
        return Path(reuse)
    kill = "kind=sigkill,point=during_reduce,cell=1,step=0"
    return _train(tmp_path_factory.mktemp("real_fault") / "run", "--rollouts", "4", "--inject", kill)


def copy_run(run: Path, dst: Path) -> Path:
    """A copy of ``run`` at ``dst`` (symlinks kept as symlinks)."""
    shutil.copytree(run, dst, symlinks=True)
    return dst


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_log(path: Path, events: list[dict[str, Any]], renumber: bool = False) -> None:
    """Write ``events`` back as JSONL; ``renumber`` rewrites ``seq`` from 0 without gaps (per
    source incarnation, as a forger hiding a removed line would)."""
    if renumber:
        counters: dict[str, int] = {}
        for e in events:
            key = json.dumps(e.get("source"), sort_keys=True)
            e["seq"] = counters.get(key, 0)
            counters[key] = e["seq"] + 1
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
