"""``ftkit train --resume``: a run stopped at any moment and resumed ends bitwise identical to
the same run uninterrupted (slow: real ``ftkit train`` processes, Ray actors, megatron ranks).

A is the uninterrupted reference (4 rollouts x 2 steps, 2 cells, a checkpoint at the end of
every rollout, rollouts 0 and 3 dumped). Each test stops a run B somehow, resumes it with
``ftkit train --resume B`` and then requires ``compare-dumps --exact A B`` (final state,
rollouts, dumps), ``analyze-events B`` (the combined log of both sessions) and
``verify-checkpoint B`` (every checkpoint, cross-checked with the log) to exit 0:

- B trained 2 rollouts with two pipeline stages per cell (``--pp 2``), its newest checkpoint
  corrupted, the directory moved, resumed with ``--rollouts 4 --pp 1``: the resume keeps the
  run's recorded name (one run in the log), warns and falls back to the older
  checkpoint, each rank slices its shard of the layout-free state, and the run still equals A
  (pipeline stages do not change the arithmetic); the first session's event files are
  untouched (new incarnations only);
- B SIGKILLed from outside at a random moment (its whole process group: Ray included),
  resumed with one cell instead of two;
- B killed by an injected ``sigkill`` inside a publication phase (``publish_rename`` here, all
  seven in the full suite; at ``publish_preflight`` a rank dies instead and the
  resume finds the run complete).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from driver_log import driver_steps
from suite import FULL

from ftkit.checkpoint.layout import FAULT_POINTS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    "--cells", "2", "--samples-per-rollout", "16", "--micro-shards", "4", "--group-size", "4",
    "--reward", "deterministic_random", "--dump-rollouts", "0,3", "--seed", "3", "--step-timeout", "60",
)  # fmt: skip
PHASES = list(FAULT_POINTS) if FULL else ["publish_rename"]


def _ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def _start(*args: str) -> subprocess.Popen[bytes]:
    """``ftkit train`` in its own session: its local Ray's processes share it (killed with it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc``, then kill whatever is left of its session (its Ray)."""
    try:
        return proc.wait(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _events(run: Path, type_: str) -> list[dict]:
    out = []
    for p in sorted((run / "events").glob("*.jsonl")):
        out += [e for e in map(json.loads, p.read_text().splitlines()) if e["type"] == type_]
    return out


def _assert_same_run(a: Path, b: Path, context: str = "") -> None:
    """compare-dumps --exact, analyze-events and verify-checkpoint (in this process) exit 0."""
    from ftkit.cli import main

    for args in (
        ["compare-dumps", "--exact", str(a), str(b)],
        ["analyze-events", str(b)],
        ["verify-checkpoint", str(b)],
    ):
        code = main([*args, "--format", "json"])
        assert code == 0, f"{context}{' '.join(args[:1])} exited {code}"
    status = json.loads((b / "status.json").read_text())
    assert (status["status"], status["steps_committed"], status["steps_total"]) == ("completed", 8, 8)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("resume") / "A"
    proc = _ftkit("train", "--out", str(run), "--rollouts", "4", *CONFIG, "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def test_resume_falls_back_from_a_corrupt_checkpoint_and_equals_the_uninterrupted_run(
    uninterrupted: Path, tmp_path: Path
) -> None:
    run = tmp_path / "B"
    first = _ftkit("train", "--out", str(run), "--rollouts", "2", *CONFIG, "--pp", "2", "--format", "json")
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in (run / "events").iterdir()}
    newest = run / "checkpoints" / "step_000003" / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor: the manifest's sha256 no longer matches
    newest.write_bytes(bytes(data))
    run = run.rename(tmp_path / "moved")  # a run directory moved before its resume keeps its name

    refused = _ftkit("train", "--resume", str(run), "--rollouts", "4", "--pp", "1", "--format", "json")
    assert refused.returncode == 2 and "--allow-layout-change" in refused.stderr  # a layout change is asked for
    resumed = _ftkit(
        "train", "--resume", str(run), "--rollouts", "4", "--pp", "1", "--allow-layout-change", "--format", "json"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "layout change on resume (pp 2 -> 1" in resumed.stderr
    assert "Warning:" in resumed.stderr and "step_000003 does not verify" in resumed.stderr
    (event,) = _events(run, "run_resumed")
    assert (event["checkpoint"], event["checkpoint_step"], event["checkpoint_rollout"]) == ("step_000001", 1, 0)
    assert event["layout_change"] == {"pp": [2, 1]}
    assert any("step_000003" in s for s in event["skipped"])
    # the first session's files are as it left them; the second wrote new incarnations
    assert {name: (run / "events" / name).read_bytes() for name in before} == before
    assert {"driver-i1.jsonl", "trainer-c0-r0-i1.jsonl", "trainer-c1-r0-i1.jsonl"} <= {
        p.name for p in (run / "events").iterdir()
    }
    run_json = json.loads((run / "run.json").read_text())
    assert (run_json["config"]["rollouts"], run_json["config"]["pp"]) == (4, 1)
    assert run_json["run"] == "B" and {e["run"] for e in _events(run, "run_resumed")} == {"B"}
    # the corrupt checkpoint was retired by retention; what is left verifies
    _assert_same_run(uninterrupted, run)


@pytest.mark.full
def test_sigkill_from_outside_at_a_random_moment_then_resume(uninterrupted: Path, tmp_path: Path) -> None:
    seed = int(os.environ.get("FTKIT_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    step, delay = rng.randrange(0, 7), rng.uniform(0.0, 1.5)
    context = f"(FTKIT_TEST_SEED={seed}: killed {delay:.2f}s after step {step}) "
    run = tmp_path / "B"
    proc = _start("--out", str(run), "--rollouts", "4", *CONFIG)
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and not any(s >= step for s in driver_steps(run)):
            assert time.monotonic() < deadline, context + "the run never reached the step"
            time.sleep(0.05)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        code = _reap(proc)
    assert code == -signal.SIGKILL, context + f"ftkit train exited {code} before the kill"

    resumed = _ftkit("train", "--resume", str(run), "--cells", "1", "--format", "json")
    assert resumed.returncode == 0, context + resumed.stderr[-3000:]
    _assert_same_run(uninterrupted, run, context)


@pytest.mark.full
def test_a_completed_run_extended_by_resume_equals_the_uninterrupted_run(
    uninterrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A completes 4 rollouts; B completes 2 (dumping its first and last: 0 and 1), then
    ``--resume --rollouts 4`` extends it (dumping 3). B's rollout-1 dump is in neither run's final
    dump set: CD013, a warning, and ``--exact`` passes; rollout 3 missing in B would be CD006."""
    from ftkit.cli import main

    run = tmp_path / "B"
    first = _ftkit("train", "--out", str(run), "--rollouts", "2", *CONFIG, "--dump-rollouts", "first,last")
    assert first.returncode == 0, first.stderr[-3000:]
    extended = _ftkit("train", "--resume", str(run), "--rollouts", "4", "--format", "json")
    assert extended.returncode == 0, extended.stderr[-3000:]
    _assert_same_run(uninterrupted, run)
    capsys.readouterr()
    assert main(["compare-dumps", "--exact", str(uninterrupted), str(run), "--format", "json"]) == 0
    found = [(f["code"], f["evidence"]["rollout"]) for f in json.loads(capsys.readouterr().out)["findings"]]
    assert ("CD013", "actor/fwd_bwd/rollout_000001") in found and not [c for c, _ in found if c == "CD006"]
    last = run / "dumps" / "actor" / "fwd_bwd" / "rollout_000003"
    last.rename(tmp_path / "gone")  # a dump the final config asks for, gone
    assert main(["compare-dumps", "--exact", str(uninterrupted), str(run), "--format", "json"]) == 1
    assert "CD006" in {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}


@pytest.mark.full
@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_in_a_publication_phase_then_resume(uninterrupted: Path, tmp_path: Path, phase: str) -> None:
    """The driver-side phases kill ``ftkit train`` itself. ``publish_preflight`` runs in the
    ranks: there a rank dies, the run heals and completes (step 3 rejected), and the resume
    starts from the final checkpoint with nothing left to train. Killed in ``publish_cleanup``,
    after the commit point and its ``checkpoint_published`` line, step 3 is published: the
    resume rolls its cleanup forward and starts from it."""
    run = tmp_path / "B"
    cell = "cell=0," if phase == "publish_preflight" else ""
    proc = _start("--out", str(run), "--rollouts", "4", *CONFIG, "--inject", f"kind=sigkill,point={phase},{cell}step=3")
    code = _reap(proc)
    published = {e["step"] for e in _events(run, "checkpoint_published")}
    if phase == "publish_preflight":
        assert code == 0 and published == {1, 5, 7}
        expected = 7
    elif phase == "publish_cleanup":  # after the commit point: published, its cleanup rolled forward
        assert code == -signal.SIGKILL and published == {1, 3}
        expected = 3
    else:
        assert code == -signal.SIGKILL and published == {1}  # step 3's publication never committed
        expected = 1

    resumed = _ftkit("train", "--resume", str(run), "--format", "json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (event,) = _events(run, "run_resumed")
    assert event["checkpoint_step"] == expected
    assert not event["config"]["inject"]  # the injection is not carried into the resumed session
    _assert_same_run(uninterrupted, run, f"({phase}) ")
