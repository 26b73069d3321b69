"""TrainConfig: defaults, one-line errors for bad combinations, dump selection."""

import pytest

from ftkit.errors import ConfigError, FtkitError
from ftkit.train.config import TrainConfig, load_config
from ftkit.train.plan.run_plan import build_plan


def test_defaults_are_the_documented_ones():
    c = TrainConfig()
    assert (
        c.cluster.cells,
        c.layout.tp,
        c.layout.pp,
        c.engine.count,
        c.schedule.rollouts,
        c.batch.steps_per_rollout,
        c.batch.samples_per_rollout,
        c.task.group_size,
        c.batch.micro_shards,
        c.model.preset,
        c.reduction.reduce,
        c.compute.device,
        c.compute.threads_per_rank,
    ) == (2, 1, 1, 1, 8, 2, 64, 8, 8, "tiny", "exact", "auto", 1)
    assert (c.batch.step_samples, c.batch.shard_samples) == (32, 4)
    assert c.objective.lr == 5e-3


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(micro_shards=3), "must be divisible by steps_per_rollout * micro_shards"),
        (dict(cells=9), "micro_shards (8) must be at least cells (9)"),
        (dict(tp=3), "tp (3) must divide"),
        (dict(group_size=5, samples_per_rollout=32), "divisible by group_size"),
        (dict(response_len=16), "response_len (16) must be below"),
        (dict(dump_rollouts="first,x"), "'x' is not 'first', 'last' or a rollout index"),
        (dict(bookkeeping=False), "bookkeeping=false needs reduce='float'"),
        (dict(pp=4), "pp (4) must divide the tiny model's 2 layers"),
        (dict(cells=0), "cells: Input should be greater than or equal to 1"),
        (dict(colour="red"), "colour: Extra inputs are not permitted"),
    ],
)
def test_bad_values_are_one_line_config_errors(values, message):
    with pytest.raises(ConfigError) as err:
        build_plan(load_config(values))
    assert message in err.value.message and "\n" not in err.value.message
    assert err.value.hint


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("first,last", [0, 4]),
        ("all", [0, 1, 2, 3, 4]),
        ("none", []),
        ("2, last", [2, 4]),
        ("first", [0]),
    ],
)
def test_dump_rollouts_selection(spec, expected):
    c = TrainConfig(rollouts=5, dump_rollouts=spec)
    assert [r for r in range(5) if c.dumps_rollout(r)] == expected


def test_config_round_trips_through_a_plain_dict():
    c = TrainConfig(cells=3, micro_shards=8, dump_what=("grads",))
    assert TrainConfig.model_validate(c.model_dump(mode="json")) == c


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(cells=True), "cells: expected an integer, got True (bool)"),
        (dict(cells="2"), "cells: expected an integer, got '2' (str)"),
        (dict(cells=2.0), "cells: expected an integer"),
        (dict(lr=float("inf")), "lr: expected a finite number, got inf"),
        (dict(lr=float("nan")), "lr: expected a finite number, got nan"),
        (dict(lr=-float("inf")), "lr: expected a finite number"),
        (dict(lr="0.1"), "lr: expected a number, got '0.1' (str)"),
        (dict(lr=True), "lr: expected a number"),
        (dict(overwrite=1), "overwrite: expected true or false"),
        (dict(model=1), "model: expected a string"),
        (dict(ray_address=5), "ray_address: expected a string"),
        (dict(out=["a"]), "out: expected a path"),
        (dict(dump_what="grads"), "dump_what: expected a list"),
        (dict(dump_what=[1]), "dump_what: in the list: expected a string"),
    ],
)
def test_values_are_strictly_typed_and_the_field_is_named(values, message):
    with pytest.raises(ConfigError) as err:
        load_config(values)
    assert message in err.value.message and "\n" not in err.value.message


def test_strict_types_accept_what_options_and_files_give():
    cfg = load_config({"cells": 2, "lr": 1, "out": "runs/x", "dump_what": ["grads"], "ray_address": None})
    assert cfg.objective.lr == 1.0 and cfg.dumps.what == ("grads",)
    assert TrainConfig.model_validate(cfg.model_dump()) == cfg  # what the workers receive


def test_lr_zero_is_allowed_and_negative_is_not():
    assert load_config({"lr": 0.0}).objective.lr == 0.0
    with pytest.raises(ConfigError, match="lr"):
        load_config({"lr": -1e-3})


def test_model_names_a_preset_or_an_existing_path(tmp_path):
    assert build_plan(load_config({"model": "small"})).config.model.digest == ""
    with pytest.raises(ConfigError, match="model_digest"):
        build_plan(load_config({"model": "tiny", "model_digest": "abc"}))
    with pytest.raises(FtkitError, match="neither a preset"):
        build_plan(load_config({"model": str(tmp_path / "absent")}))
