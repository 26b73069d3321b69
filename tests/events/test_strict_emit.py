"""``FTKIT_STRICT_EVENTS=1`` (set for the test session by tests/conftest.py): ``emit`` checks
each event against the schema and raises at the call site; without it the writer never raises."""

from __future__ import annotations

import json
import re

import pytest

from ftkit.events.writer import EventSchemaError, EventWriter


def _lines(w: EventWriter) -> list[dict[str, object]]:
    return [json.loads(line) for line in w.path.read_text().splitlines()]


def test_the_test_session_is_strict() -> None:
    import os

    assert os.environ.get("FTKIT_STRICT_EVENTS") == "1"


def test_a_valid_event_is_written(tmp_path):
    w = EventWriter(tmp_path, run="r", role="driver")
    assert w.emit("metric", rollout=0, step=3, values={"loss": 1.5, "reward": None})
    assert [e["type"] for e in _lines(w)] == ["metric"]
    w.close()


@pytest.mark.parametrize(
    ("type_", "fields", "says"),
    [
        # a misspelt optional field would otherwise pass as a forward-compatible extra
        ("metric", {"rollout": 0, "step": 3, "values": {}, "valuez": {}}, "not in the schema: ['valuez']"),
        # a misspelt required field: the real one is missing
        ("metric", {"rollouts": 0, "step": 3, "values": {}}, "rollout: Field required"),
        ("metric", {"rollout": "0", "step": 3, "values": {}}, "rollout: Input should be a valid integer"),
        ("metrics", {"rollout": 0, "step": 3, "values": {}}, "does not match the schema"),
    ],
    ids=["unknown-field", "misspelt-required-field", "wrong-type", "unknown-type"],
)
def test_a_wrong_event_raises_at_the_call_site(tmp_path, type_, fields, says):
    w = EventWriter(tmp_path, run="r", role="driver")
    with pytest.raises(EventSchemaError, match=re.escape(says)):
        w.emit(type_, **fields)
    assert _lines(w) == [] and w.dropped == 0  # nothing written: the caller is wrong, not the disk
    w.close()


def test_outside_strict_mode_a_wrong_event_is_written_not_raised(tmp_path, monkeypatch):
    monkeypatch.delenv("FTKIT_STRICT_EVENTS")
    w = EventWriter(tmp_path, run="r", role="driver")
    assert w.emit("metric", rollout=0, step=3, values={}, valuez={})  # the analyzer reports it (FT111)
    assert [e["valuez"] for e in _lines(w)] == [{}]
    w.close()
