"""compare-runs' config comparison: a field an older run did not record is compared as the value
runs had before it existed, and where the engines run does not decide the result."""

from __future__ import annotations

from ftkit.runs.configs import config_diff


def test_a_precision_an_older_run_did_not_record_is_fp32() -> None:
    assert config_diff({"seed": 0}, {"seed": 0, "precision": "fp32"}) == []
    rows = config_diff({"seed": 0}, {"seed": 0, "precision": "bf16"})
    assert rows == [{"field": "precision", "a": "fp32", "b": "bf16", "kind": "result"}]


def test_sampling_an_older_run_did_not_record_is_plain_sampling() -> None:
    """A run of 5d41eb0 (before --temperature existed) against the same run now: equal configs."""
    now = {"seed": 0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "stop": [], "ignore_eos": False}
    assert config_diff({"seed": 0}, now) == []
    rows = config_diff({"seed": 0}, {**now, "temperature": 0.7, "stop": ["\n"]})
    assert {(r["field"], r["kind"]) for r in rows} == {("temperature", "result"), ("stop", "result")}


def test_engine_placement_is_neutral() -> None:
    rows = config_diff({"engine_placement": "separate"}, {"engine_placement": "colocate"})
    assert [r["kind"] for r in rows] == ["neutral"]


def test_what_a_resumed_run_may_change_is_neutral_or_length() -> None:
    """A field ``ftkit train --resume`` lets change freely (timeouts, cells, cadences) cannot make
    two runs differ in their bits: compare-runs lists it as neutral (the run length as length)."""
    from ftkit.runs.configs import kind_of
    from ftkit.train.config.places import FREE_FIELDS

    kinds = {f: kind_of(f) for f in FREE_FIELDS}
    assert {f: k for f, k in kinds.items() if k == "result"} == {}
    assert kinds["rollouts"] == "length" and kinds["reward_timeout"] == "neutral"
