"""``ftkit train --reward-timeout`` with real processes (issue 40 item 5): a plug-in that never
returns is refused before Ray when the start-up check meets it, and fails a real run (exit 2, one
line naming the plug-in, the sample and its prompt) with the run's end recorded as for any other
failure: ``status.json``, ``run_finished`` and an event log ``analyze-events`` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = """
import time
def never(**kwargs):
    time.sleep(3600)
def never_when_wrong(response, label, **kwargs):
    if response.lstrip("0") != label:  # the start-up check scores right answers only
        while True:
            time.sleep(3600)
    return 1.0
"""


def _ftkit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "ftkit", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def test_a_plug_in_that_never_returns_is_refused_before_ray(tmp_path: Path) -> None:
    (tmp_path / "rw_never.py").write_text(PLUGIN)
    start = time.monotonic()
    res = _ftkit(
        tmp_path, "train", "--out", str(tmp_path / "run"), "--reward", "rw_never:never", "--reward-timeout", "1"
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith(
        "Error: reward 'rw_never:never' did not return within 1 s (--reward-timeout) on sample 0 (prompt '"
    ), res.stderr
    assert "--reward-timeout SECONDS" in res.stderr
    assert not (tmp_path / "run").exists() and time.monotonic() - start < 60


@pytest.mark.slow
def test_a_reward_call_past_the_limit_fails_the_run_with_its_end_recorded(tmp_path: Path) -> None:
    (tmp_path / "rw_never.py").write_text(PLUGIN)
    run = tmp_path / "run"
    small = ["--samples-per-rollout", "8", "--group-size", "4", "--micro-shards", "2", "--cells", "1"]
    args = ["--rollouts", "1", "--reward", "rw_never:never_when_wrong", "--reward-timeout", "2", *small]
    res = _ftkit(tmp_path, "train", "--out", str(run), *args)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if x.startswith("Error:"))
    assert line.startswith(
        "Error: reward 'rw_never:never_when_wrong' did not return within 2 s (--reward-timeout) on sample "
    )
    assert "(prompt '" in line, line
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 2, status
    assert status["reason"] == line.removeprefix("Error: "), status
    ended = _ftkit(tmp_path, "analyze-events", str(run / "events"), "--format", "json")
    assert ended.returncode in (0, 1) and "Traceback" not in ended.stderr, ended.stderr[-2000:]
    assert json.loads(ended.stdout)["schema_version"]
    finished = [
        json.loads(x)
        for f in (run / "events").glob("*.jsonl")
        for x in f.read_text().splitlines()
        if '"run_finished"' in x
    ]
    assert [e["status"] for e in finished] == ["failed"], finished
