"""A layout change on resume (issue 26, item 12): ``--resume --tp 2`` is refused (exit 2)
unless ``--allow-layout-change`` asks for it; then the session logs it in ``run_resumed`` and
warns that the run is no longer bitwise the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftkit.cli import main
from ftkit.errors import ConfigError
from ftkit.train.config import TrainConfig
from ftkit.train.recovery.resume_plan import plan_resume, resume_config


def _run_dir(tmp_path: Path) -> Path:
    from ftkit.tasks.addition import AdditionTask
    from ftkit.train.control.rundir import write_run_json

    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(out=run, rollouts=2, seed=5)
    write_run_json(run, cfg, "cpu", AdditionTask(cfg.task.response_len))
    return run


@pytest.mark.parametrize("given", [{"tp": 2}, {"pp": 2}, {"tp": 2, "cells": 1}])
def test_a_layout_change_is_refused_unless_asked_for(tmp_path: Path, given: dict[str, int]) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match="a layout change") as err:
        resume_config(run, given)
    assert "--allow-layout-change" in (err.value.hint or "")
    cfg = resume_config(run, given, allow_layout_change=True)
    assert (cfg.layout.tp, cfg.layout.pp) == (given.get("tp", 1), given.get("pp", 1))
    assert resume_config(run, {"tp": 1}).layout.tp == 1  # the recorded layout, given again, is fine


def test_the_flag_allows_the_layout_only(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match="lr is 0.005 .* that would be another run"):
        resume_config(run, {"tp": 2, "lr": 0.1}, allow_layout_change=True)


def test_an_allowed_change_is_logged_and_warned(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    warnings: list[str] = []
    plan = plan_resume(run, resume_config(run, {"tp": 2}, allow_layout_change=True), warnings.append)
    assert plan.layout_change == {"tp": [1, 2]}
    assert plan.fields()["layout_change"] == {"tp": [1, 2]}
    assert len(warnings) == 1 and "layout change on resume (tp 1 -> 2" in warnings[0]
    same = plan_resume(run, resume_config(run, {}), warnings.append)
    assert "layout_change" not in same.fields() and len(warnings) == 1  # an unchanged layout says nothing


def test_the_command_line_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    assert main(["train", "--resume", str(run), "--tp", "2", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "Error: --resume: tp is 1" in err and "--allow-layout-change" in err and "Traceback" not in err
    assert main(["train", "--resume", str(run), "--tp", "2", "--allow-layout-change", "--print-config"]) == 0
    assert '"tp": 2' in capsys.readouterr().out
    assert main(["train", "--allow-layout-change", "--print-config"]) == 2  # only with --resume
    assert "goes with --resume" in capsys.readouterr().err
