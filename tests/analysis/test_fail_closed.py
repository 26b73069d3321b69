"""analyze-events fails closed (issue 9, section 1): each named case has its own test.

Lost evidence is exit 1 however it was lost; bad fields are FT111 findings, never exit 3; a
line nested 100,000 deep is a malformed line, never a crash; a FIFO is exit 2, never a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftkit import cli
from ftkit.analysis.engine import analyze_paths
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

REPO = Path(__file__).resolve().parents[2]  # the tree under test, for subprocesses

SPEC = SyntheticSpec(
    cells=2, tp=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=6, faults=0
)


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    generate(tmp_path, SPEC)
    return tmp_path / "events"


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def _errors(result: Any) -> set[str]:
    return {f.code for f in result.findings if f.severity.value == "error"}


def test_the_base_run_is_clean_and_every_writer_closed(run):
    assert analyze_paths([run]).verdict() == "pass"
    assert all(_events(p)[-1]["type"] == "log_closed" for p in run.glob("*.jsonl"))


@pytest.mark.parametrize("keep", [-1, -2, -5])
def test_a_rank_log_cut_at_a_line_boundary_fails(run, keep):
    path = run / "trainer-c1-r1-i0.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:keep]))
    result = analyze_paths([run])
    assert result.verdict() == "fail"
    assert any("without log_closed" in f.message for f in result.findings)


def test_dropping_one_cells_last_step_fails_even_with_seq_renumbered(run):
    path = run / "trainer-c1-r0-i0.jsonl"
    events = _events(path)
    last = max(e["step"] for e in events if "step" in e and e["type"] == "step_outcome")
    kept = [e for e in events if e.get("step") != last or e["type"] in ("dump_written", "log_closed")]
    for seq, e in enumerate(kept):  # a forger hides the gap and fixes the count
        e["seq"] = seq
    kept[-1]["lines"] = kept[-1]["seq"]
    _write(path, kept)
    result = analyze_paths([run])
    assert result.verdict() == "fail" and _errors(result) & {"FT106", "FT112"}


def test_a_schema_1_log_cut_at_the_end_of_one_cell_fails(run):
    """Old logs have no log_closed: the driver's declarations (alive sets, completed run) still
    demand the cut cell's evidence."""
    for path in run.glob("*.jsonl"):
        events = [{**e, "schema": 1} for e in _events(path) if e["type"] != "log_closed"]
        if path.name.startswith("trainer-c1-"):
            last = max(e["step"] for e in events if e["type"] == "step_outcome")
            events = [e for e in events if e.get("step", -1) < last]
        _write(path, events)
    result = analyze_paths([run])
    assert result.verdict() == "fail" and _errors(result) & {"FT106", "FT112"}


def test_a_step_the_driver_declared_that_no_rank_logged_fails(run):
    for path in run.glob("trainer-*.jsonl"):
        events = _events(path)
        last = max(e["step"] for e in events if e["type"] == "step_outcome")
        kept = [e for e in events if e.get("step") != last]
        for seq, e in enumerate(kept):
            e["seq"] = seq
        kept[-1]["lines"] = kept[-1]["seq"]
        _write(path, kept)
    result = analyze_paths([run])
    assert any("no rank logged anything" in f.message for f in result.findings) and result.verdict() == "fail"


def test_a_killed_rank_declared_dead_by_the_driver_is_not_a_cut(tmp_path):
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "cells": 3, "faults": 1}))
    unclosed = [p for p in (tmp_path / "events").glob("trainer-*.jsonl") if _events(p)[-1]["type"] != "log_closed"]
    assert unclosed  # the killed rank's files end without log_closed
    assert analyze_paths([tmp_path / "events"]).verdict() == "pass"


def test_a_wrong_log_closed_count_fails(run):
    path = run / "engine-r0-i0.jsonl"
    events = _events(path)
    events[-1]["lines"] += 1
    _write(path, events)
    assert "FT111" in _errors(analyze_paths([run]))


@pytest.mark.parametrize(
    "field, value",
    [
        ("type", ["metric"]),
        ("type", {"a": 1}),
        ("type", None),
        ("time", 10**400),
        ("seq", 10**400),
        ("step", 1.5),
        ("values", {"loss": {"x": 1}}),
        ("values", {"loss": [1]}),
        ("source", [1, 2]),
        ("rollout", True),
    ],
)
def test_bad_fields_are_invalid_events_never_exit_3(run, capsys, field, value):
    path = run / "driver-i0.jsonl"
    events = _events(path)
    metric = next(i for i, e in enumerate(events) if e["type"] == "metric" and e["step"] is not None)
    events[metric][field] = value
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert cli.main(["analyze", str(run), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any(f["code"] == "FT111" and f["severity"] == "error" for f in doc["findings"])


@pytest.mark.parametrize("field", ["ids", "counts", "alive_after", "micro_shards"])
def test_elements_of_the_wrong_type_are_invalid_events(run, capsys, field):
    for path in run.glob("*.jsonl"):
        events = _events(path)
        for e in events:
            if field in e and e[field]:
                e[field] = [{"x": 1}, *e[field][1:]]
                break
        else:
            continue
        _write(path, events)
        break
    assert cli.main(["analyze", str(run), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any(f["code"] == "FT111" and "invalid" in f["message"] for f in doc["findings"])


def test_a_line_nested_100000_deep_is_malformed_not_a_crash(run):
    path = run / "driver-i0.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n")
        fh.write(b"[" * 100_000 + b"\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze", str(run), "--format", "json"],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    kinds = [f["evidence"].get("kind") for f in doc["findings"] if f["code"] == "FT111"]
    assert kinds.count("malformed") == 2


def test_a_fifo_is_exit_2_not_a_hang(tmp_path, capsys):
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    assert cli.main(["analyze", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and "Hint" in err


def test_a_fifo_inside_a_directory_is_skipped(run, capsys):
    os.mkfifo(run / "pipe.jsonl")
    assert cli.main(["analyze", str(run)]) == 0


def test_an_engine_log_cut_is_excused_only_by_the_drivers_engine_failed(run):
    engine = run / "engine-r0-i0.jsonl"
    _write(engine, _events(engine)[:-1])  # the engine's process died with its node: no log_closed
    assert any("without log_closed" in f.message for f in analyze_paths([run]).findings)
    driver = run / "driver-i0.jsonl"
    events = _events(driver)
    at = next(i for i, e in enumerate(events) if e["type"] == "run_finished")
    failed = {**events[at - 1], "type": "engine_failed", "engine": 0, "incarnation": 0, "reason": "node lost"}
    for key in [k for k in failed if k not in ("schema", "run", "time", "source", "seq", "type")]:
        if key not in ("engine", "incarnation", "reason"):
            del failed[key]
    events.insert(at, failed)
    for seq, e in enumerate(events):
        e["seq"] = seq
    events[-1]["lines"] = events[-1]["seq"]
    _write(driver, events)
    result = analyze_paths([run])
    assert not any("without log_closed" in f.message for f in result.findings), result.findings
    # the failure is a row of the recovery table; declared after the run's last step and weight
    # sync in a run that completed, it owed nothing more: recovered by the run's end
    assert result.findings == []
    (row,) = result.recovery
    assert (row["engine"], row["cause"], row["recovered_by"]) == (0, "node lost", "run end")
    # declared before the last weight sync, with nothing replacing the engine: unrecovered
    sent = max(i for i, e in enumerate(events) if e["type"] == "weights_sent")
    events.insert(sent, {**events.pop(at), "time": events[sent]["time"] - 1e-3})
    for seq, e in enumerate(events):
        e["seq"] = seq
    _write(driver, events)
    (unrecovered,) = analyze_paths([run]).findings
    assert unrecovered.code == "FT113" and "failure of engine 0 (node lost)" in unrecovered.message
