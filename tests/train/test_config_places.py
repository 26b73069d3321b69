"""The config's structure is what gives each field its meaning: every field sits in a section
with a place, the derived lists (resume, dump pairing, command line) follow from it, and both
the flat record (run.json, older runs) and the nested form read back to the same config."""

import inspect

import pytest

from ftkit.errors import ConfigError
from ftkit.train.config import TrainConfig, load_config
from ftkit.train.config.places import (
    CLI_FIELDS,
    DATA_SHAPING,
    FIXED_FIELDS,
    FREE_FIELDS,
    LAYOUT_FIELDS,
    PRECISION_FIELDS,
)
from ftkit.train.config.run import leaves
from ftkit.train.config.sections import Place, Section


def test_every_field_has_a_place_in_a_section():
    """A field added straight to TrainConfig, or to a section without a place, fails here."""
    for name, info in TrainConfig.model_fields.items():
        cls = info.annotation
        assert isinstance(cls, type) and issubclass(cls, Section), f"TrainConfig.{name} is not a section"
        assert isinstance(cls.__dict__.get("PLACE"), Place), f"{cls.__name__} states no PLACE of its own"
    total = sum(len(info.annotation.model_fields) for info in TrainConfig.model_fields.values())
    assert len(leaves()) == total  # flat names are unique across sections
    places = (FREE_FIELDS, LAYOUT_FIELDS, PRECISION_FIELDS, FIXED_FIELDS)
    assert set(leaves()) == set().union(*places)
    assert sum(map(len, places)) == len(leaves())  # each field in one place only


def test_the_derived_lists_are_the_runs_meaning():
    # what a resumed session may change (tp/pp only with --allow-layout-change)
    assert {"tp", "pp"} == LAYOUT_FIELDS
    assert {"precision"} == PRECISION_FIELDS  # only with --allow-precision-change
    assert {"lr", "seed", "model", "micro_shards", "reduce", "device", "best_metric"} <= FIXED_FIELDS
    assert {"cells", "engines", "rollouts", "inject", "dump_what", "keep_last", "out"} <= FREE_FIELDS
    # what decides whether two runs' dumps pair tensor for tensor (I3: not cells, layout, reduction)
    assert set(DATA_SHAPING) >= {"model", "seed", "micro_shards", "rollouts", "reward"}
    assert not set(DATA_SHAPING) & {"cells", "tp", "pp", "reduce", "lr", "dump_what"}


def test_dumps_layer_copy_of_data_shaping_is_the_derived_one():
    from ftkit.dumps.sources import DATA_SHAPING as DUMPS_COPY

    assert DUMPS_COPY == DATA_SHAPING


def test_every_command_line_field_is_an_option_of_train_and_no_other_is():
    import typer

    from ftkit.commands.train import register

    app = typer.Typer()
    register(app)
    train = next(c for c in app.registered_commands if c.name == "train").callback
    params = set(inspect.signature(train).parameters)
    assert set(CLI_FIELDS) <= params
    assert not (set(leaves()) - set(CLI_FIELDS)) & params  # file-only fields have no option
    assert set(leaves()) - set(CLI_FIELDS) == {
        "threads_per_rank",
        "bookkeeping",
        "model_digest",
        "prompts_digest",
        "eval_prompts_digest",
    }


def test_flat_record_and_nested_form_read_back_the_same():
    cfg = load_config({"tp": 2, "cells": 3, "lr": 0.01, "dump_what": ["grads"], "model": "tiny"})
    flat = cfg.model_dump(mode="json")
    assert list(flat) == list(leaves())  # the record: one key per field, its flat name
    assert flat["tp"] == 2 and flat["engines"] == 1 and flat["dump_what"] == ["grads"]
    assert TrainConfig.model_validate(flat) == cfg  # an older run's flat run.json reads as it is
    nested = {"layout": {"tp": 2}, "cluster": {"cells": 3}, "objective": {"lr": 0.01}, "dumps": {"what": ["grads"]}}
    assert load_config(nested) == cfg
    assert load_config({"engine": {"engines": 2}}).engine.count == 2  # a section by flat names too
    assert load_config({"layout": {"tp": 1}, "tp": 2}).layout.tp == 2  # a flat name wins


@pytest.mark.parametrize(
    "values, message",
    [
        ({"layout": {"tp": 0}}, "tp: Input should be greater than or equal to 1"),
        ({"layout": {"tp": "2"}}, "tp: expected an integer"),
        ({"layout": {"colour": 1}}, "layout.colour: Extra inputs are not permitted"),
        ({"engine": {"count": 99}}, "engines: Input should be less than or equal to 16"),
    ],
)
def test_nested_errors_name_the_flat_field(values, message):
    with pytest.raises(ConfigError) as err:
        load_config(values)
    assert message in err.value.message


def test_sections_leave_places_for_what_comes_next():
    # model: a preset or a Hugging Face path, with its digest; engine: a count (a kind later)
    assert set(TrainConfig.model_fields) >= {"model", "task", "objective", "engine", "layout"}
    assert leaves()["model"].info.annotation is str and leaves()["model_digest"].section == "model"
