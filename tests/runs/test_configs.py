"""compare-runs' config comparison: a field an older run did not record is compared as the value
runs had before it existed, and where the engines run does not decide the result."""

from __future__ import annotations

from ftkit.runs.configs import config_diff


def test_a_precision_an_older_run_did_not_record_is_fp32() -> None:
    assert config_diff({"seed": 0}, {"seed": 0, "precision": "fp32"}) == []
    rows = config_diff({"seed": 0}, {"seed": 0, "precision": "bf16"})
    assert rows == [{"field": "precision", "a": "fp32", "b": "bf16", "kind": "result"}]


def test_engine_placement_is_neutral() -> None:
    rows = config_diff({"engine_placement": "separate"}, {"engine_placement": "colocate"})
    assert [r["kind"] for r in rows] == ["neutral"]
