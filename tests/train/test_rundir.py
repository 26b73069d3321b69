"""The run directory: refused, replaced or created, never deleted when it is not a run."""

import json

import pytest

from ftkit.errors import UsageError
from ftkit.train.config import TrainConfig
from ftkit.train.rundir import RUN_SCHEMA, check_run_dir, make_run_dir, write_run_json
from ftkit.train.task import AdditionTask


def test_fresh_and_empty_directories_are_used(tmp_path):
    assert make_run_dir(tmp_path / "a" / "b", overwrite=False).is_dir()
    (tmp_path / "empty").mkdir()
    assert make_run_dir(tmp_path / "empty", overwrite=False) == tmp_path / "empty"


def test_an_existing_run_needs_overwrite(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "events").mkdir()
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
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError):
        check_run_dir(tmp_path / "file", overwrite=True)


def test_run_json_records_config_layout_and_seed(tmp_path):
    cfg = TrainConfig(
        cells=3, micro_shards=8, samples_per_rollout=32, group_size=4, seed=9, reward="deterministic_random"
    )
    write_run_json(tmp_path, cfg, "cpu", AdditionTask(cfg.response_len))
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
