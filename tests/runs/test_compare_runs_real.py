"""``ftkit compare-runs`` against real ``ftkit train`` runs (issue 39): 1 cell vs 2 vs 3 cells, a
faulted and healed run, a SIGKILLed and resumed run (all equal, exit 0); another lr (first
divergence at the first step, the cause named first), another seed; a log cut short (exit 2,
neither a false divergence nor a false pass). Also ``ftkit train --expect-equal``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from driver_log import driver_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    "--samples-per-rollout", "16", "--micro-shards", "4", "--group-size", "4", "--rollouts", "3",
    "--seed", "3", "--step-timeout", "60", "--dump-rollouts", "0",
)  # fmt: skip


def _ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def _train(run: Path, *args: str) -> Path:
    proc = _ftkit("train", "--out", str(run), "--overwrite", *CONFIG, *args, "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _compare(a: Path, b: Path, *args: str) -> tuple[int, dict, str]:
    proc = _ftkit("compare-runs", str(a), str(b), "--format", "json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compare_runs")
    _train(root / "c1", "--cells", "1")
    return root


def test_three_cells_equal_one_cell(runs: Path) -> None:
    b = _train(runs / "c3", "--cells", "3")
    code, doc, _ = _compare(runs / "c1", b)
    assert code == 0, doc
    assert doc["verdict"] == "pass" and doc["first_divergence"] is None
    assert doc["steps"]["common"] == 6 and doc["steps"]["differ"] == 0
    assert all(doc["kinds"][k]["compared"] > 0 for k in ("state", "witness", "metric", "weights", "canary"))
    assert [r["field"] for r in doc["config_diff"] if r["kind"] == "result"] == []


def test_faulted_and_healed_two_cells_equal_the_fault_free_run(runs: Path) -> None:
    b = _train(runs / "fault", "--cells", "2", "--inject", "kind=sigkill,point=during_reduce,cell=1,step=3")
    code, doc, _ = _compare(b, runs / "c1")
    assert code == 0, doc
    assert doc["runs"][0]["heals"] >= 1 or doc["runs"][0]["faults"] >= 1


def test_another_lr_diverges_at_the_first_step_and_names_lr_first(runs: Path, tmp_path: Path) -> None:
    b = _train(runs / "lr", "--cells", "1", "--lr", "0.01")
    code, doc, _ = _compare(runs / "c1", b)
    assert code == 1
    first = doc["first_divergence"]
    assert (first["step"], first["rollout"], first["what"]) == (0, 0, "state")
    assert first["tensor"]
    assert doc["config_diff"][0]["field"] == "lr" and doc["config_diff"][0]["kind"] == "result"
    human = _ftkit("compare-runs", str(runs / "c1"), str(b), "--html", str(tmp_path / "r.html"))
    assert human.returncode == 1
    assert human.stdout.splitlines()[0].startswith("the runs' configs differ in what determines the result: lr")
    page = (tmp_path / "r.html").read_text()
    assert "first divergence: step 0" in page


@pytest.mark.full
def test_another_seed_diverges(runs: Path) -> None:
    b = _train(runs / "seed", "--cells", "1", "--seed", "4")
    code, doc, _ = _compare(runs / "c1", b)
    assert code == 1
    assert doc["first_divergence"]["step"] == 0 and doc["config_diff"][0]["field"] == "seed"


def test_sigkilled_and_resumed_run_equals_the_uninterrupted_one(runs: Path) -> None:
    run = runs / "killed"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", "--out", str(run), "--overwrite", *CONFIG, "--cells", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and not any(s >= 2 for s in driver_steps(run)):
            assert time.monotonic() < deadline, "the run never reached step 2"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == -signal.SIGKILL, f"ftkit train exited {code} before the kill"
    resumed = _ftkit("train", "--resume", str(run), "--format", "json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    code, doc, err = _compare(runs / "c1", run)
    assert code == 0, (doc, err)
    assert doc["runs"][1]["sessions"] == 2 and doc["steps"]["common"] == 6


def test_a_log_cut_short_is_unusable_input(runs: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(runs / "c1" / "events", cut / "events")
    driver = cut / "events" / "driver-i0.jsonl"
    lines = driver.read_bytes().splitlines(keepends=True)
    driver.write_bytes(b"".join(lines[: len(lines) * 2 // 3]))
    for a, b in ((runs / "c1", cut), (cut, runs / "c1")):
        code, doc, err = _compare(a, b)
        assert code == 2 and doc == {}, err
        assert err.startswith("Error: ") and "cannot be compared: its log is damaged: FT111" in err
    # a prefix of the other (a complete, shorter run) is compared, not refused
    short = _train(tmp_path / "short", "--cells", "1", "--rollouts", "2")
    code, doc, _ = _compare(runs / "c1", short)
    assert code == 0 and doc["steps"]["only_a"] == 2
    assert [f["code"] for f in doc["findings"] if f["code"] == "CR006"] == ["CR006"]
    code, doc, _ = _compare(runs / "c1", short, "--require-same-length")
    assert code == 1


def test_train_expect_equal(runs: Path, tmp_path: Path) -> None:
    ok = _ftkit(
        "train", "--out", str(tmp_path / "e"), *CONFIG, "--cells", "2", "--expect-equal", str(runs / "c1"),
        "--format", "json",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert json.loads(ok.stdout)["expect_equal"]["verdict"] == "pass"
    bad = _ftkit(
        "train", "--out", str(tmp_path / "f"), *CONFIG, "--cells", "1", "--lr", "0.02",
        "--expect-equal", str(runs / "c1"), "--format", "json",
    )  # fmt: skip
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    assert doc["expect_equal"]["first_divergence"]["step"] == 0
