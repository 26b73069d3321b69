"""The run directory: refused, replaced or created, never deleted when it is not a run, and
checked (links, names, writability) before anything starts."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftkit.errors import UsageError
from ftkit.evidence.record import RUN_SCHEMA
from ftkit.tasks.addition import AdditionTask
from ftkit.train.config import TrainConfig
from ftkit.train.control.rundir import check_run_dir, make_run_dir, write_run_json


def test_fresh_and_empty_directories_are_used(tmp_path):
    assert make_run_dir(tmp_path / "a" / "b", overwrite=False).is_dir()
    (tmp_path / "empty").mkdir()
    assert make_run_dir(tmp_path / "empty", overwrite=False) == tmp_path / "empty"


def _a_run(path: Path) -> Path:
    """A run directory as ftkit leaves it (run.json and every area, temporaries included)."""
    path.mkdir(parents=True)
    cfg = TrainConfig()
    write_run_json(path, cfg, "cpu", AdditionTask(cfg.task.response_len))
    for rel in (
        "events/driver-i0.jsonl",
        "events/rank-c0-r0-i0.jsonl.gz",
        "rollouts/rollout_000000.safetensors",
        "rollouts/.rollout_000001.safetensors.tmp-host-1-abcd",
        "final/tp0-pp0.safetensors",
        "dumps/actor/fwd_bwd/rollout_000000/cell0-tp0-pp0.safetensors",
        "dumps/actor/fwd_bwd/rollout_000000/index.json",
        "checkpoints/step_000002/model.safetensors",
        "checkpoints/step_000002/MANIFEST.json",
        "checkpoints/retention.json",
        "checkpoints/.step_000004.tmp-x/model.safetensors",
        "logs/vllm-engine-0.log",
        "status.json",
    ):
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(b"x")
    (path / "checkpoints" / "latest").symlink_to("step_000002")
    return path


def test_an_existing_run_needs_overwrite(tmp_path):
    run = _a_run(tmp_path / "run")
    with pytest.raises(UsageError, match="already exists") as err:
        check_run_dir(run, overwrite=False)
    assert "--overwrite" in err.value.hint
    assert (run / "events").is_dir()
    make_run_dir(run, overwrite=True)
    assert run.is_dir() and list(run.iterdir()) == []


def test_a_directory_that_is_not_a_run_is_never_replaced(tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("...")
    with pytest.raises(UsageError, match="not an ftkit run directory"):
        make_run_dir(precious, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "..."
    (precious / "run.json").write_text("{}")  # the case: a run.json that ftkit did not write
    with pytest.raises(UsageError, match=r"run.json was not written by ftkit"):
        make_run_dir(precious, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "..."
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError):
        check_run_dir(tmp_path / "file", overwrite=True)


def test_run_json_records_config_layout_and_seed(tmp_path):
    cfg = TrainConfig(
        cells=3, micro_shards=8, samples_per_rollout=32, group_size=4, seed=9, reward="deterministic_random"
    )
    write_run_json(tmp_path, cfg, "cpu", AdditionTask(cfg.task.response_len))
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema"] == RUN_SCHEMA and doc["seed"] == 9 and doc["run"] == tmp_path.name
    assert TrainConfig.model_validate(doc["config"]) == cfg  # the config round-trips
    assert doc["layout"] == {
        "cells": 3,
        "tp": 1,
        "pp": 1,
        "engines": 1,
        "device": "cpu",
        "micro_shards": 8,
        "samples_per_step": 16,
        "samples_per_micro_shard": 2,
    }
    assert doc["task"]["reward"] == "deterministic_random" and doc["task"]["prompt_len"] == 5


@pytest.mark.parametrize(
    "stray",
    ["notes.txt", "events/thesis.tex", "dumps/actor/photo.jpg", "final/.bashrc", "src/main.py", "run.json.bak"],
)
def test_a_run_with_anything_ftkit_does_not_write_is_not_replaced(tmp_path, stray):
    run = _a_run(tmp_path / "run")
    (run / stray).parent.mkdir(parents=True, exist_ok=True)
    (run / stray).write_text("mine")
    with pytest.raises(UsageError, match="not an ftkit run directory"):
        make_run_dir(run, overwrite=True)
    assert (run / stray).read_text() == "mine" and (run / "events" / "driver-i0.jsonl").is_file()


def test_a_symlink_inside_a_run_is_not_replaced(tmp_path):
    run = _a_run(tmp_path / "run")
    home = tmp_path / "home"
    home.mkdir()
    (home / "keep.txt").write_text("keep")
    (run / "events" / "linked").symlink_to(home)
    with pytest.raises(UsageError, match="not an ftkit run directory"):
        make_run_dir(run, overwrite=True)
    assert (home / "keep.txt").read_text() == "keep"


def test_out_that_is_a_symlink_is_refused(tmp_path):
    target = _a_run(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(target)
    for overwrite in (False, True):
        with pytest.raises(UsageError, match="symbolic link"):
            make_run_dir(link, overwrite=overwrite)
    assert (target / "run.json").is_file()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="symbolic link"):
        check_run_dir(dangling, overwrite=False)


@pytest.mark.parametrize(
    "out,why",
    [
        ("/proc/ftkit-run", "not writable"),
        ("/proc/self/ftkit-run/x", "not writable"),
        ("/dev/null/run", "not a directory"),
    ],
)
def test_out_that_cannot_be_created_is_refused_before_anything(out, why):
    with pytest.raises(UsageError, match=why):
        check_run_dir(Path(out), overwrite=False)


def test_out_with_a_name_too_long_is_refused(tmp_path):
    with pytest.raises(UsageError, match="longer than"):
        check_run_dir(tmp_path / ("r" * 300), overwrite=False)
    with pytest.raises(UsageError, match="longer than"):
        check_run_dir(tmp_path.joinpath(*["d" * 200] * 25), overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_out_on_a_read_only_file_system_is_refused(tmp_path):
    """A real read-only mount, in a private user and mount namespace (``unshare -rm``)."""
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed for the read-only mount"
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", {str(tmp_path)!r}], check=True)
        from pathlib import Path
        from ftkit.errors import UsageError
        from ftkit.train.control.rundir import check_run_dir
        try:
            check_run_dir(Path({str(tmp_path / "run")!r}), overwrite=False)
        except UsageError as exc:
            print(exc.message)
        """
    )
    proc = subprocess.run(
        [unshare, "-rm", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, proc.stderr
    assert "read-only file system" in proc.stdout


def test_train_refuses_unusable_out_with_exit_2_before_starting(tmp_path, capsys):
    from ftkit.cli import main

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "run.json").write_text("{}")
    (tmp_path / "user" / "data.csv").write_text("1,2")
    (tmp_path / "link").symlink_to(tmp_path / "user")
    for out, message in (
        (tmp_path / "user", "not an ftkit run directory"),
        (tmp_path / "link", "symbolic link"),
        (Path("/proc/ftkit-run"), "not writable"),
    ):
        code = main(["train", "--out", str(out), "--overwrite", "--device", "cpu"])
        err = capsys.readouterr().err
        error = [line for line in err.splitlines() if line.startswith("Error: ")]
        assert code == 2 and len(error) == 1 and message in error[0] and "Hint: " in err, err
    assert (tmp_path / "user" / "data.csv").read_text() == "1,2"
