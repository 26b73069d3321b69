"""``ftkit train --report-to`` (issue 40 item 3; ftkit/integrations/tracking.py, trackers.py): the
trackers get the driver's ``metric`` events exactly as logged, on the documented step axis, and
the run's config; a tracker that cannot start is exit 2 before Ray, one that fails mid-run only
warns. The real runs use TensorBoard (the ``tracking`` extra, installed by scripts/setup.sh);
wandb and mlflow are tested only where they are missing (CI does not install them)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from blocked_cli import ftkit_without

from ftkit.errors import InstallError
from ftkit.events.writer import EventWriter
from ftkit.integrations import trackers, tracking
from ftkit.integrations.tracking import TrackingFeed, check_report_to, scalars_of

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--samples-per-rollout", "8", "--group-size", "4", "--micro-shards", "2", "--cells", "1"]
SMALL += ["--steps-per-rollout", "2"]


class Recorder:
    name = "recorder"

    def __init__(self, fail_at: str | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[tuple[str, Any]] = []

    def _call(self, what: str, arg: Any = None) -> None:
        if what == self.fail_at:
            raise OSError("disk full")
        self.calls.append((what, arg))

    def start(self, config: Any, first_step: int, resumed: bool) -> None:
        self._call("start", (dict(config), first_step, resumed))

    def log(self, scalars: Any, step: int) -> None:
        self._call("log", (step, dict(scalars)))

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")


def _driver_log(run: Path) -> EventWriter:
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"seed": 7, "report_to": ["tensorboard"]}}))
    return EventWriter(run / "events", run=run.name, role="driver")


def test_scalars_of_puts_steps_and_rollouts_on_the_run_global_step_axis() -> None:
    step = {"rollout": 1, "step": 5, "values": {"loss": 0.5, "kl": None}, "phases": {"reduce": 0.1}}
    assert scalars_of(step, 4) == (5, {"time/reduce": 0.1, "train/loss": 0.5})
    rollout = {"rollout": 3, "step": None, "values": {"reward": 1.0, "eval_reward": 0.25}}
    assert scalars_of(rollout, 4) == (12, {"rollout/index": 3.0, "rollout/reward": 1.0, "rollout/eval_reward": 0.25})
    assert scalars_of({"values": {"x": 1.0}}, 4) is None


def test_the_feed_hands_on_the_drivers_metrics_and_a_failing_tracker_only_warns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    good, bad = Recorder(), Recorder(fail_at="log")
    warnings: list[str] = []
    feed = TrackingFeed([bad, good], run, steps_per_rollout=2, on_warning=warnings.append)
    feed.poll()  # nothing yet: no run directory
    log = _driver_log(run)
    log.emit("metric", rollout=0, step=None, values={"reward": 0.5})
    log.emit("metric", rollout=0, step=0, values={"loss": 1.0})
    EventWriter(run / "events", run="run", role="trainer", cell=0, rank=0).emit(
        "metric", rollout=0, step=0, values={"loss": 9.0}
    )  # not the driver's: not a run metric
    feed.poll()
    log.emit("metric", rollout=0, step=1, values={"loss": 2.0})
    feed.poll()
    log.emit("metric", rollout=0, step=None, values={"eval_reward": 0.75})  # after the last step
    feed.close()
    assert good.calls[0] == ("start", ({"seed": 7, "report_to": ["tensorboard"]}, 0, False))
    logged = [arg for what, arg in good.calls if what == "log"]
    assert logged == [
        (0, {"rollout/index": 0.0, "rollout/reward": 0.5}),
        (0, {"train/loss": 1.0}),
        (1, {"train/loss": 2.0}),
        (0, {"rollout/index": 0.0, "rollout/eval_reward": 0.75}),
    ]
    assert good.calls[-1] == ("close", None)
    assert len(warnings) == 1 and warnings[0].startswith("--report-to recorder: the tracker failed (log: OSError")
    assert bad.calls[0][0] == "start" and "close" not in [what for what, _ in bad.calls]


def test_a_resumed_feed_skips_the_earlier_sessions_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = _driver_log(run)
    log.emit("metric", rollout=0, step=0, values={"loss": 1.0})
    got = Recorder()
    feed = TrackingFeed([got], run, steps_per_rollout=2, resumed=True)
    log.emit("metric", rollout=1, step=None, values={"reward": 0.5})
    feed.close()
    assert got.calls[0][1][1:] == (2, True)
    assert [arg for what, arg in got.calls if what == "log"] == [(2, {"rollout/index": 1.0, "rollout/reward": 0.5})]


def test_a_tracker_whose_package_is_missing_is_an_install_error_naming_its_extra(monkeypatch) -> None:
    def missing(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(trackers.importlib, "import_module", missing)
    monkeypatch.setattr("ftkit.extras.installed", lambda module: True)
    for name, extra in tracking.EXTRA.items():
        with pytest.raises(InstallError) as err:
            check_report_to([name])
        assert err.value.hint == f"pip install 'ftkit[{extra}]'"
        assert str(err.value).startswith(f"--report-to {name} cannot start: importing ")


def _ftkit(cwd: Path, *args: str, blocked: str | None = None) -> subprocess.CompletedProcess[str]:
    if blocked:
        return ftkit_without(blocked, *args, cwd=cwd, timeout=600)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ftkit", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.parametrize(("blocked", "name", "extra"), [("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow")])
def test_report_to_a_missing_backend_is_exit_2_before_ray(tmp_path: Path, blocked: str, name: str, extra: str) -> None:
    res = _ftkit(tmp_path, "train", "--out", str(tmp_path / "run"), "--report-to", f"none,{name}", blocked=blocked)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    needs = f"needs ftkit's {extra!r} extra, which is not installed (missing: {name})"
    assert lines[0] == f"Error: --report-to {name} {needs}"
    assert lines[-1] == f"Hint: pip install 'ftkit[{extra}]'"
    assert not (tmp_path / "run").exists()


def test_report_to_an_unknown_tracker_is_exit_2(tmp_path: Path) -> None:
    res = _ftkit(tmp_path, "train", "--out", str(tmp_path / "run"), "--report-to", "tensorboard,comet")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith("Error:") and "report_to" in res.stderr and "Hint:" in res.stderr
    assert not (tmp_path / "run").exists()


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _driver_metrics(run: Path) -> list[dict[str, Any]]:
    events = [json.loads(x) for f in sorted((run / "events").glob("driver*.jsonl")) for x in f.read_text().splitlines()]
    return [e for e in events if e["type"] == "metric"]


@pytest.mark.slow
def test_a_real_run_reports_to_tensorboard_what_its_log_holds_and_a_resume_goes_on_there(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    res = _ftkit(tmp_path, "train", "--out", str(run), "--rollouts", "2", "--report-to", "tensorboard", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Warning" not in res.stderr, res.stderr[-3000:]
    # resumed from the last checkpoint: report_to is in run.json, so the run keeps reporting
    res = _ftkit(tmp_path, "train", "--resume", str(run), "--rollouts", "3")
    assert res.returncode == 0, res.stderr[-3000:]

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    expected: dict[str, dict[int, float]] = {}
    for event in _driver_metrics(run):
        found = scalars_of(event, 2)
        assert found is not None
        step, scalars = found
        for tag, value in scalars.items():
            expected.setdefault(tag, {})[step] = value  # a step logged again: its last value
    assert {e["step"] for e in _driver_metrics(run) if e["step"] is not None} == set(range(6))
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, by_step in expected.items():
        shown = {s.step: s.value for s in acc.Scalars(tag)}
        assert shown == {step: _f32(v) for step, v in by_step.items()}, tag
    assert [s.step for s in acc.Scalars("train/loss")] == list(range(6))
    assert [s.step for s in acc.Scalars("rollout/reward")] == [0, 2, 4]
    texts = acc.Tensors("config/text_summary")
    recorded = json.loads((run / "run.json").read_text())["config"]
    for text in texts:
        config = json.loads(text.tensor_proto.string_val[0].decode())
        assert config["report_to"] == ["tensorboard"] and config["seed"] == recorded["seed"]
    assert [t.step for t in texts] == [0, 4]  # each session's config at its first step
