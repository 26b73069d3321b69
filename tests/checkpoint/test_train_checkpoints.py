"""``ftkit train`` publishes guarded checkpoints (slow: real Ray actors and megatron ranks).

One run, 4 rollouts x 2 steps, a boundary at the end of each rollout (steps 1, 3, 5, 7):

- step 1: cell 1's rank fails its preflight (injected): no rank serialises, rejected, training
  goes on;
- step 3: a ``nan-grad`` at step 2 taints the interval: rejected by the guard (never best), and
  the analyzer's FT110 stays clean;
- step 5: ENOSPC injected while the driver writes the payload: rejected, nothing half-published;
- step 7: published; ``verify-checkpoint`` on the run (event log included: the checkpoint's
  state fingerprint equals every rank's committed ``state_fingerprint``) exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    "--rollouts", "4", "--samples-per-rollout", "16", "--micro-shards", "4", "--group-size", "4",
    "--reward", "deterministic_random", "--dump-rollouts", "none", "--seed", "3",
    "--step-timeout", "60", "--keep-last", "2", "--keep-best", "1",
)  # fmt: skip


def _ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def _events(run: Path, type_: str) -> list[dict]:
    out = []
    for p in sorted((run / "events").glob("*.jsonl")):
        for line in p.read_text().splitlines():
            ev = json.loads(line)
            if ev["type"] == type_:
                out.append(ev)
    return sorted(out, key=lambda e: e["step"])


def test_train_publishes_rejects_and_verifies(tmp_path) -> None:
    run = tmp_path / "run"
    inject = [
        "kind=preflight-fail,point=publish_preflight,cell=1,step=1",
        "kind=nan-grad,point=mid_backward,cell=0,step=2",
        "kind=enospc,point=publish_write,step=5",
    ]
    args = ["train", "--out", str(run), "--cells", "2", *CONFIG, "--format", "json"]
    for spec in inject:
        args += ["--inject", spec]
    proc = _ftkit(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["verdict"] == "pass"  # FT110 (and every other rule) clean
    rejected = {e["step"]: e["reason"] for e in _events(run, "checkpoint_rejected")}
    assert sorted(rejected) == [1, 3, 5]
    assert "cell1-rank0: preflight failure injected" in rejected[1]
    assert "guard:" in rejected[3] and "step 2: reduced gradient" in rejected[3]
    assert "No space left on device" in rejected[5] and "publish_write" in rejected[5]
    published = _events(run, "checkpoint_published")
    assert [e["step"] for e in published] == [7]
    assert (published[0]["guard_from_step"], published[0]["guard_to_step"]) == (6, 7)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["journal.json", "latest", "retention.json", "step_000007"]
    verify = _ftkit("verify-checkpoint", str(run), "--format", "json")
    assert verify.returncode == 0, verify.stdout[-3000:]
    doc = json.loads(verify.stdout)
    assert doc["stats"]["events"] and {r["code"]: r["checked"] for r in doc["rules"]}["FT214"] == 1


@pytest.mark.parametrize("point", ["publish_manifest", pytest.param("publish_journal", marks=pytest.mark.full)])
def test_train_killed_while_publishing_leaves_nothing_partial(tmp_path, point) -> None:
    """``kind=sigkill`` at a publication phase kills ``ftkit train`` itself (the writer). After
    ``reconcile`` (what a resume does first) nothing partial is visible and everything
    published verifies against the event log."""
    import signal

    from ftkit.checkpoint.journal import reconcile

    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = ["train", "--out", str(run), "--cells", "1", *CONFIG, "--inject", f"kind=sigkill,point={point},step=3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its Ray processes share the session: removed below with it
    )
    try:
        assert proc.wait(timeout=900) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    ck = run / "checkpoints"
    assert [e["step"] for e in _events(run, "checkpoint_published")] == [1]
    reconcile(ck)
    assert sorted(p.name for p in ck.iterdir()) == ["journal.json", "latest", "retention.json", "step_000001"]
    verify = _ftkit("verify-checkpoint", str(ck), "--format", "json")
    assert verify.returncode == 0, verify.stdout[-3000:]
    events = _ftkit("verify-checkpoint", str(run), "--format", "json")  # with the event log
    assert events.returncode == 0, events.stdout[-3000:]


def test_the_writing_rank_killed_after_its_files_the_next_cell_writes_them_again(tmp_path) -> None:
    """The files of a checkpoint are written by rank 0 of the first live cell (the state never
    reaches the driver). ``kind=sigkill,point=publish_write,cell=0`` kills that rank, a real
    SIGKILL, once its files are in the staging directory and before it reports them: cell 0 is
    failed and later healed, cell 1 writes the same state again over them, the checkpoint is
    published and verifies against the event log, and the run passes (the fault recovered by
    the publication)."""
    run = tmp_path / "run"
    config = list(CONFIG)
    config[config.index("--rollouts") + 1] = "2"
    args = ["train", "--out", str(run), "--cells", "2", *config, "--format", "json"]
    proc = _ftkit(*args, "--inject", "kind=sigkill,point=publish_write,cell=0,step=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["verdict"] == "pass"
    assert [e["step"] for e in _events(run, "checkpoint_published")] == [1, 3]
    assert not _events(run, "checkpoint_rejected")
    lines = [json.loads(x) for p in sorted((run / "events").glob("*.jsonl")) for x in p.read_text().splitlines()]
    fired = [e for e in lines if e["type"] == "fault_injected"]
    assert [(e["point"], e["cell"], e["source"]["role"]) for e in fired] == [("publish_write", 0, "trainer")]
    moves = [(e["cell"], e["new"]) for e in lines if e["type"] == "cell_state"]
    assert (0, "failed") in moves and moves.index((0, "failed")) < len(moves) - 1 - moves[::-1].index((0, "alive"))
    verify = _ftkit("verify-checkpoint", str(run), "--format", "json")
    assert verify.returncode == 0, verify.stdout[-3000:]
    assert {r["code"]: r["checked"] for r in json.loads(verify.stdout)["rules"]}["FT214"] == 2


def test_best_metric_eval_reward_keeps_the_best_by_eval_reward(tmp_path) -> None:
    """``--best-metric eval_reward``: every boundary logs the held-out set's greedy reward as a
    ``metric`` event; each checkpoint carries that value (not the rollout's reward) in its
    manifest, event and retention record, and retention keeps the newest plus the best by it."""
    run = tmp_path / "run"
    config = list(CONFIG)
    config[config.index("--keep-last") + 1] = "1"
    config[config.index("--reward") + 1] = "task"
    proc = _ftkit("train", "--out", str(run), "--cells", "1", *config, "--best-metric", "eval_reward")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for p in sorted((run / "events").glob("*.jsonl")) for x in p.read_text().splitlines()]
    metrics = [e for e in lines if e["type"] == "metric" and e["step"] is None]
    evals = {e["rollout"]: e["values"]["eval_reward"] for e in metrics if "eval_reward" in e["values"]}
    rewards = {e["rollout"]: e["values"]["reward"] for e in metrics if "reward" in e["values"]}
    assert sorted(evals) == [0, 1, 2, 3] and all(0.0 <= v <= 1.0 for v in evals.values())
    published = _events(run, "checkpoint_published")
    assert [(e["step"], e["metric"]) for e in published] == [(2 * r + 1, evals[r]) for r in range(4)]
    assert [e["metric"] for e in published] != [rewards[r] for r in range(4)]  # not the rollout reward
    best = max(range(4), key=lambda r: (evals[r], r))  # ties go to the newer step
    ck = run / "checkpoints"
    kept = {f"step_{2 * best + 1:06d}", "step_000007"}
    assert {p.name for p in ck.glob("step_*")} == kept
    doc = json.loads((ck / "retention.json").read_text())
    assert doc["policy"]["best_metric"] == "eval_reward"
    roles = {r["name"]: r["roles"] for r in doc["records"]}
    assert "best" in roles[f"step_{2 * best + 1:06d}"] and "last" in roles["step_000007"]
    man = json.loads((ck / f"step_{2 * best + 1:06d}" / "MANIFEST.json").read_text())
    assert man["metric"] == {"name": "eval_reward", "value": evals[best]}
    verify = _ftkit("verify-checkpoint", str(run), "--format", "json")
    assert verify.returncode == 0, verify.stdout[-3000:]
