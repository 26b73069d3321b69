"""``--resume`` without training: the config it resumes with, what it refuses (exit 2), the
plan it starts from (checkpoint, epoch, incarnation) and the analyzer's ``run_resumed``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftkit.cli import main
from ftkit.errors import ConfigError, UsageError
from ftkit.events.writer import EventWriter
from ftkit.evidence.record import last_epoch
from ftkit.train.config import TrainConfig
from ftkit.train.recovery.resume_plan import next_incarnation, plan_resume, resume_config


def _run_dir(tmp_path: Path, **kw: object) -> Path:
    from ftkit.tasks.addition import AdditionTask
    from ftkit.train.control.rundir import write_run_json

    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(out=run, rollouts=2, seed=5, inject=("kind=exit,point=before_forward,cell=0,step=1",), **kw)
    write_run_json(run, cfg, "cpu", AdditionTask(cfg.task.response_len))
    return run


def test_resume_config_keeps_the_recorded_run_and_takes_free_options(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    cfg = resume_config(run, {"rollouts": 6, "cells": 1, "engines": 2, "step_timeout": 30.0})
    flat = cfg.model_dump()
    assert [flat[k] for k in ("seed", "rollouts", "cells", "engines", "step_timeout")] == [5, 6, 1, 2, 30.0]
    assert cfg.faults.inject == () and cfg.faults.chaos is None  # the earlier session's faults are not replayed
    assert cfg.output.out == run and not cfg.output.overwrite
    assert resume_config(run, {"seed": 5}).rng.seed == 5  # the recorded value, given again, is fine


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"seed": 6}, "seed is 5"),
        ({"model": "small"}, "model is 'tiny'"),
        ({"lr": 1e-4}, "lr is"),
        ({"rollouts": 1}, "fewer than the 2 recorded"),
    ],
)
def test_resume_config_refuses_what_would_make_another_run(tmp_path: Path, given: dict, message: str) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        resume_config(run, given)


def test_cli_resume_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    assert main(["train", "--resume", str(run), "--rollouts", "3", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["rollouts"] == 3
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    (tmp_path / "link").symlink_to(run)
    for args, text in (
        (["--resume", str(run), "--seed", "1"], "seed is 5"),
        (["--resume", str(run), "--out", str(tmp_path / "x")], "--resume does not take --out"),
        (["--resume", str(run), "--overwrite"], "--resume does not take --overwrite"),
        (["--resume", str(tmp_path / "nope")], "no such run directory"),
        (["--resume", str(tmp_path / "plain")], "not an ftkit run directory"),
        (["--resume", str(tmp_path / "link")], f"is a symbolic link (to {run})"),
    ):
        assert main(["train", *args]) == 2, args
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.startswith("Error: ")]
        assert captured.out == "" and len(errors) == 1 and text in errors[0], captured.err
        assert "Hint: " in captured.err and "Traceback" not in captured.err


def test_plan_without_checkpoints_starts_from_the_seed_after_the_earlier_sessions(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    events = run / "events"
    driver = EventWriter(events, run="run", role="driver")
    for epoch in (0, 1, 2):
        driver.emit("reconfigure", epoch=epoch, alive_before=[], alive_after=[0], reason="x")
    driver.close()
    for cell, inc in ((0, 0), (0, 1), (1, 0)):
        EventWriter(events, run="run", role="trainer", cell=cell, rank=0, incarnation=inc).close()
    with open(events / "driver-i0.jsonl", "ab") as f:
        f.write(b'{"type": "reconfigure", "epoch": 9')  # a killed driver's torn last line is skipped
    warnings: list[str] = []
    plan = plan_resume(run, TrainConfig(out=run), warnings.append)
    assert plan.checkpoint is None and plan.skipped == [] == warnings
    assert (plan.last_epoch, plan.incarnation) == (2, 2) == (last_epoch(events), next_incarnation(events))
    assert plan.fields() == {"checkpoint": None, "checkpoint_step": -1, "checkpoint_rollout": -1, "skipped": []}
    assert plan_resume(run, TrainConfig(out=run, tp=2), warnings.append).checkpoint is None  # any layout


def test_resume_dir_must_be_a_run(tmp_path: Path) -> None:
    from ftkit.train.recovery.resume_plan import check_resume_dir

    with pytest.raises(UsageError, match="no such run directory"):
        check_resume_dir(tmp_path / "missing")


def test_analyzer_wants_the_earlier_sessions_before_run_resumed(tmp_path: Path) -> None:
    from ftkit.analysis.engine import analyze_paths

    cfg = TrainConfig().model_dump(mode="json")
    driver = EventWriter(tmp_path / "events", run="run", role="driver")
    driver.emit(
        "run_resumed",
        config=cfg,
        num_cells=2,
        tp=1,
        pp=1,
        num_engines=1,
        ftkit_version="0",
        checkpoint=None,
        checkpoint_step=-1,
        checkpoint_rollout=-1,
        skipped=[],
    )
    driver.emit("run_finished", status="completed", reason=None)
    driver.close()
    result = analyze_paths([tmp_path / "events"])
    assert any(f.code == "FT111" and "earlier sessions' log is missing" in f.message for f in result.findings)


def test_plan_falls_back_and_retires_the_newer_checkpoints(tmp_path: Path) -> None:
    """The newest checkpoint does not verify: the plan takes the older one, warns, and retires
    the newer through the journal, so what is left verifies and the resumed session can publish
    that step again (the corrupt one was the best by metric: retention alone would keep it)."""
    from ckpt_helpers import log_fingerprints, publish

    from ftkit.checkpoint.publish import Publisher
    from ftkit.checkpoint.retention import RetentionPolicy, load_records
    from ftkit.checkpoint.verify import verify_path

    run = _run_dir(tmp_path)
    ck = run / "checkpoints"
    publisher = Publisher(ck, RetentionPolicy(keep_last=2, keep_best=1))
    assert publish(publisher, 3, metric=0.5).published and publish(publisher, 7, metric=0.9).published
    log_fingerprints(run)
    model = ck / "step_000007" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))
    warnings: list[str] = []
    plan = plan_resume(run, TrainConfig(out=run), warnings.append)
    assert plan.checkpoint is not None and (plan.checkpoint.step, plan.checkpoint.rollout) == (3, 0)
    assert "step_000007 does not verify" in warnings[0] and warnings[1].startswith("retired step_000007")
    assert plan.skipped == warnings and plan.fields()["checkpoint"] == "step_000003"
    assert [r.name for r in load_records(ck)[0]] == ["step_000003"] and not (ck / "step_000007").exists()
    assert not [f for f in verify_path(ck).findings if f.severity.value == "error"]


def test_plan_verifies_the_checkpoint_it_resumes_from_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--resume`` hashes the checkpoint once: ``newest_trusted`` verifies the run (as
    ``verify-checkpoint RUN`` does), loading the checkpoint then does not verify it again."""
    from ckpt_helpers import log_fingerprints, publish

    import ftkit.checkpoint.verify as verify
    from ftkit.checkpoint.publish import Publisher
    from ftkit.checkpoint.retention import RetentionPolicy

    run = _run_dir(tmp_path)
    assert publish(Publisher(run / "checkpoints", RetentionPolicy()), 3, metric=0.5).published
    log_fingerprints(run)
    seen: list[str] = []
    real = verify.verify_path

    def counted(path: Path, *args: object, **kw: object) -> object:
        seen.append(Path(path).name)
        return real(path, *args, **kw)

    monkeypatch.setattr(verify, "verify_path", counted)
    plan = plan_resume(run, TrainConfig(out=run), lambda message: None)
    assert plan.checkpoint is not None and plan.checkpoint.step == 3 and plan.checkpoint.files
    assert seen == ["run"]


def _published_run(tmp_path: Path, steps: tuple[int, ...] = (3, 7), **update: object) -> Path:
    """A run directory (``_run_dir``) with checkpoints of ``steps`` written with its config
    changed by ``update`` (as ``RunCheckpoints`` writes it into meta.json) and their
    fingerprints in the event log."""
    from ckpt_helpers import log_fingerprints, payload, publish

    from ftkit.checkpoint.publish import Publisher
    from ftkit.checkpoint.retention import RetentionPolicy

    tmp_path.mkdir(parents=True, exist_ok=True)
    run = _run_dir(tmp_path)
    from ftkit.train.config import load_config

    cfg = load_config({**resume_config(run, {}).model_dump(mode="json"), **update})
    pub = Publisher(run / "checkpoints", RetentionPolicy(keep_last=3, keep_best=1))
    for step in steps:
        p = payload(step, scale=1 + ("lr" in update))  # other weights, as another lr trains
        flat = cfg.model_dump(mode="json")
        p.meta.update(seed=flat["seed"], model=flat["model"], config=flat)
        assert publish(pub, step, payload=p).published
    log_fingerprints(run)
    return run


def test_resume_skips_a_checkpoint_of_another_config_copied_in_as_the_newest(tmp_path: Path) -> None:
    """Issue 26 item 9: a same-seed run's checkpoint with another lr copied in place of the newest
    fails ``verify-checkpoint RUN`` (FT211: not the recorded manifest; FT214: not the logged
    state); resume skips it with a warning and falls back to the older one that passes."""
    import shutil

    from ftkit.checkpoint.verify import verify_path

    run = _published_run(tmp_path)
    other = _published_run(tmp_path / "other", steps=(7,), lr=resume_config(run, {}).objective.lr * 2)
    new = run / "checkpoints" / "step_000007"
    shutil.rmtree(new)
    shutil.copytree(other / "checkpoints" / "step_000007", new)
    assert {f.code for f in verify_path(run).findings} >= {"FT211", "FT214"}
    warnings: list[str] = []
    plan = plan_resume(run, resume_config(run, {}), warnings.append)
    assert plan.checkpoint is not None and plan.checkpoint.step == 3
    assert "step_000007 does not verify (FT21" in warnings[0]


def test_resume_skips_a_checkpoint_whose_config_is_not_this_runs(tmp_path: Path) -> None:
    """Issue 26 item 9, the config part: checkpoints that verify, recorded and logged, but were
    written with another result-determining value (lr) are skipped."""
    run = _published_run(tmp_path, lr=TrainConfig().objective.lr * 2)
    warnings: list[str] = []
    plan = plan_resume(run, resume_config(run, {}), warnings.append)
    assert plan.checkpoint is None
    assert "step_000007 does not verify (written with lr" in warnings[0]
    assert "no checkpoint verifies" in " ".join(warnings)


def test_resume_skips_a_checkpoint_that_verifies_alone_but_not_within_the_run(tmp_path: Path) -> None:
    """Issue 26 item 10: MANIFEST ``rollout`` edited (7 -> 6 in the issue): the checkpoint still
    verifies alone, not within the run (its retention record holds another manifest sha256);
    resume takes the older one instead of failing on every try."""
    from ftkit.checkpoint.verify import verify_path

    run = _published_run(tmp_path)
    path = run / "checkpoints" / "step_000007" / "MANIFEST.json"
    doc = json.loads(path.read_text())
    doc["rollout"] -= 1
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    assert [f.code for f in verify_path(path.parent).findings if f.severity.value == "error"] == []
    assert "FT211" in {f.code for f in verify_path(run).findings}
    warnings: list[str] = []
    plan = plan_resume(run, resume_config(run, {}), warnings.append)
    assert plan.checkpoint is not None and plan.checkpoint.step == 3
    assert "step_000007 does not verify (FT211" in warnings[0]


def test_resume_refuses_checkpoints_without_the_runs_event_log(tmp_path: Path) -> None:
    """The run's log is part of the verification: without it, nothing can be trusted (exit 2)."""
    import shutil

    run = _published_run(tmp_path)
    shutil.rmtree(run / "events")
    with pytest.raises(ConfigError, match="no event log"):
        plan_resume(run, resume_config(run, {}), lambda message: None)


def test_resume_with_the_checkpoints_deleted_warns(tmp_path: Path) -> None:
    """Issue 26 item 13: ``checkpoints/`` deleted after the log recorded publications: the plan
    starts from the seed, and says so."""
    import shutil

    from ftkit.checkpoint.publish import Publisher
    from ftkit.checkpoint.retention import RetentionPolicy

    run = _run_dir(tmp_path)
    from ckpt_helpers import publish

    with EventWriter(run / "events", run="run", role="driver") as driver:
        pub = Publisher(run / "checkpoints", RetentionPolicy(), on_event=lambda t, f: driver.emit(t, **f))
        assert publish(pub, 3).published
    shutil.rmtree(run / "checkpoints")
    warnings: list[str] = []
    plan = plan_resume(run, resume_config(run, {}), warnings.append)
    assert plan.checkpoint is None
    assert warnings == [f"{run / 'checkpoints'} holds none of the 1 checkpoint(s) the log records as published "
                        "(newest step_000003): training again from the seed's initial state"]  # fmt: skip


def test_a_run_of_another_fingerprint_scheme_is_not_resumed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run begun before ftkit-fp2 (its run.json has no ``fingerprint_scheme``) logged ftkit-fp1
    fingerprints: a session of this version could not be checked against them, so --resume is
    exit 2 with one line that says so; the same run.json with the field resumes."""
    run = _run_dir(tmp_path)
    doc = json.loads((run / "run.json").read_text())
    assert doc["fingerprint_scheme"] == "ftkit-fp2"
    del doc["fingerprint_scheme"]
    (run / "run.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="fingerprints its state as ftkit-fp1, this ftkit as ftkit-fp2"):
        resume_config(run, {})
    assert main(["train", "--resume", str(run), "--print-config"]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "ftkit-fp1" in errors[0] and "Traceback" not in captured.err
    doc["fingerprint_scheme"] = "ftkit-fp2"
    (run / "run.json").write_text(json.dumps(doc))
    assert resume_config(run, {}).rng.seed == 5
