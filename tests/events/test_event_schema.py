"""The event schema: field names of the public contract, strict validation, the generated page."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ftkit.events.schema import EVENT_TYPES, parse_event
from ftkit.events.schema_doc import schema_markdown
from ftkit.events.validate import explain, is_valid
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

# The table of issue 2: these names are a public contract and must never change.
CONTRACT = {
    "run_started": {"config", "num_cells", "tp", "pp", "num_engines", "ftkit_version"},
    "run_finished": {"status", "reason"},
    "cell_state": {"cell", "old", "new", "reason"},
    "reconfigure": {"epoch", "alive_before", "alive_after", "reason"},
    "step_outcome": {"rollout", "step", "attempt", "epoch", "cell", "outcome", "micro_shards"},
    "state_fingerprint": {"rollout", "step", "attempt", "cell", "total", "params", "optimizer"},
    "witness_allocated": {"rollout", "attempt", "ids", "expected"},
    "witness_counts": {"rollout", "step", "attempt", "cell", "ids", "counts", "contributions"},
    "weights_sent": {"rollout", "version", "total", "params"},
    "engine_weights": {"rollout", "version", "engine", "total", "params"},
    "metric": {"rollout", "step", "values"},
    "fault_injected": {"kind", "point", "cell", "rank", "rollout", "step"},
    "heal": {"cell", "donor", "epoch", "bytes", "seconds", "total", "donor_total"},
    "grad_nonfinite": {"rollout", "step", "cell", "rank", "where"},
    "checkpoint_published": {"step", "path", "kind", "metric", "manifest_sha256", "guard_from_step", "guard_to_step"},
    "checkpoint_rejected": {"step", "kind", "reason"},
    "dump_written": {"rollout", "phase", "path", "tensors", "bytes"},
}
ENVELOPE = {"schema", "type", "run", "time", "source", "seq"}


@pytest.mark.parametrize("type_name", sorted(CONTRACT))
def test_contract_field_names(type_name):
    fields = {f.alias or n for n, f in EVENT_TYPES[type_name].model_fields.items()}
    assert CONTRACT[type_name] | ENVELOPE <= fields


def _lines(tmp_path):
    run = generate(
        tmp_path,
        SyntheticSpec(cells=2, tp=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, faults=1),
    )
    for path in sorted(run.events_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)


def test_every_written_event_validates_strictly_and_fast(tmp_path):
    types = set()
    for event in _lines(tmp_path):
        model = parse_event(event)
        assert is_valid(event)
        assert model.model_dump(by_alias=True)["schema"] == 2
        types.add(event["type"])
    assert {"run_started", "state_fingerprint", "heal", "fault_injected", "reconfigure"} <= types


def _metric(**over):
    event = {
        "schema": 1,
        "type": "metric",
        "run": "r",
        "time": 1.5,
        "seq": 0,
        "rollout": 0,
        "step": 2,
        "source": {"role": "driver", "cell": None, "rank": None, "incarnation": 0, "pid": 1, "host": "h"},
        "values": {"loss": float("nan"), "reward": None},
    }
    event.update(over)
    return event


def test_non_finite_and_null_metric_values_are_valid():
    assert is_valid(_metric()) and parse_event(_metric()).values["reward"] is None


@pytest.mark.parametrize(
    "bad", [{"step": "3"}, {"seq": -1}, {"schema": 3}, {"run": 5}, {"values": []}, {"source": {"role": "nobody"}}]
)
def test_invalid_events_are_rejected_with_a_message(bad):
    event = _metric(**bad)
    with pytest.raises(ValidationError):
        parse_event(event)
    assert explain(event)


def test_fast_check_agrees_with_pydantic_on_type_errors():
    for bad in (
        {"step": "3"},
        {"schema": 3},
        {"values": {"loss": {}}},
        {"time": 10**400},
        {"step": True},
        {"run": 5},
        {"values": []},
        {"time": "now"},
    ):
        assert not is_valid(_metric(**bad))
    missing = _metric()
    del missing["seq"]
    assert not is_valid(missing) and "seq" in explain(missing)


def test_extra_fields_are_allowed_for_forward_compatibility():
    assert is_valid(_metric(new_field=[1, 2])) and parse_event(_metric(new_field=1)).new_field == 1  # type: ignore[attr-defined]


def test_unknown_type_is_not_valid():
    assert not is_valid(_metric(type="from_the_future"))
    with pytest.raises(ValidationError):
        parse_event(_metric(type="from_the_future"))


def test_schema_markdown_is_deterministic_and_complete():
    page = schema_markdown()
    assert page == schema_markdown()
    for type_name, fields in CONTRACT.items():
        assert f"## `{type_name}`" in page
        for name in fields:
            assert f"| `{name}` |" in page
    assert "| `schema` |" in page and "| `incarnation` |" in page


def test_importing_the_analyzer_builds_no_validator():
    """The pydantic validators are built on first use (``defer_build``, a lazy adapter): the
    analyzer needs them only for lines its compiled checks reject, and building all of them cost
    a small log's analysis at every start."""
    import subprocess
    import sys

    code = (
        "import ftkit.analysis.engine, ftkit.events.schema as s\n"
        "print(sorted(n for n, m in s.EVENT_TYPES.items() if m.__pydantic_complete__))\n"
        "print(s._adapter.cache_info().currsize)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "0"]
    with pytest.raises(ValidationError):  # built on demand, with the same messages
        parse_event({"type": "step_outcome"})
    assert explain({"type": "log_closed", "lines": 1}).startswith("schema: Field required")
