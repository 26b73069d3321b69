"""Replay semantics: witness de-duplication, commit and membership edge cases, integrity, the
recovery table, rule selection and bounded memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftkit.analysis import replay as replay_mod
from ftkit.analysis.engine import analyze_paths
from ftkit.analysis.registry import all_rules
from ftkit.errors import InputError, UsageError
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rewrite(path: Path, events: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _codes(result) -> list[str]:
    return sorted(f.code for f in result.findings)


@pytest.fixture()
def run(tmp_path):
    generate(
        tmp_path,
        SyntheticSpec(cells=3, engines=1, rollouts=2, steps_per_rollout=3, samples_per_rollout=12, faults=1, seed=3),
    )
    return tmp_path / "events"


def test_clean_run_result_shape(run):
    r = analyze_paths([run])
    assert r.findings == [] and r.verdict() == "pass"
    assert {x.code for x in r.rules} == set(all_rules())
    assert r.stats["status"] == "completed" and r.stats["cells"] == 3 and r.stats["faults"] == 1
    assert r.stats["steps_committed"] == 6 and r.stats["steps_closed"] == 7  # one discarded attempt
    (row,) = r.recovery
    assert row["recovered_by"] == "reconfigure" and row["steps_discarded"] == 1 and row["samples_lost"] == 0
    assert 0 <= row["detect_s"] <= row["reconfigure_s"] <= row["heal_s"]


def test_witness_counts_of_every_cell_count_once_and_disagreement_is_divergence(run):
    path = run / "trainer-c1-r0-i0.jsonl"
    events = _events(path)
    first = next(e for e in events if e["type"] == "witness_counts")
    first["counts"] = [2] + first["counts"][1:]
    _rewrite(path, events)
    r = analyze_paths([run])
    assert _codes(r) == ["FT101"] and "witness counts" in r.findings[0].message


def test_committed_twice(run):
    path = run / "trainer-c0-r0-i0.jsonl"
    events = _events(path)
    again = dict(
        next(e for e in events if e["type"] == "step_outcome" and e["step"] == 1 and e["outcome"] == "committed")
    )
    i = next(i for i, e in enumerate(events) if e["type"] == "step_outcome" and e["step"] == 2)
    events.insert(i + 1, {**again, "attempt": 5, "time": events[i]["time"] + 1e-6})
    for seq, e in enumerate(events):
        e["seq"] = seq
    _rewrite(path, events)
    r = analyze_paths([run])
    assert "FT106" in _codes(r) and any("already committing" in f.message for f in r.findings)


def test_missing_step_outcome_of_a_live_cell_is_inconsistent(run):
    path = run / "trainer-c0-r0-i0.jsonl"
    events = [e for e in _events(path) if not (e["type"] == "step_outcome" and e["step"] == 0)]
    for seq, e in enumerate(events):
        e["seq"] = seq
    events[-1]["lines"] = events[-1]["seq"]  # a writer that never wrote the outcome, closed normally
    _rewrite(path, events)
    r = analyze_paths([run])
    assert _codes(r) == ["FT106"] and "missing on cell 0" in r.findings[0].message


def test_integrity_findings(run):
    driver = run / "driver-i0.jsonl"
    events = _events(driver)
    assert events[0]["type"] == "run_started"
    tail = dict(
        events[-1], type="metric", rollout=0, step=None, values={}, seq=len(events), time=events[-1]["time"] + 1
    )
    _rewrite(driver, events[1:] + [tail])  # no run_started, a seq gap at the start, an event after the end
    messages = [f.message for f in analyze_paths([run]).findings if f.code == "FT111"]
    assert any("no run_started" in m for m in messages)
    assert any("seq gap: 0..0 missing" in m for m in messages)
    assert any("after run_finished" in m for m in messages)


def test_bad_lines_and_unknown_types(run):
    with open(run / "trainer-c2-r0-i0.jsonl", "ab") as fh:
        fh.write(b'{"schema": 1, "type": "from_the_future", "x": 1}\n\x00\x01 binary\n{"schema": 1, "type": "metri')
    with open(run / "trainer-c0-r0-i0.jsonl", "a") as fh:
        fh.write('{"schema": 1, "type": "metric", "run": "synthetic", "time": "late"}\n')
    r = analyze_paths([run])
    ft111 = [f for f in r.findings if f.code == "FT111"]
    kinds = sorted((f.severity.value, f.evidence.get("kind", "invalid")) for f in ft111)
    assert kinds == [("error", "invalid"), ("error", "malformed"), ("warning", "truncated")]
    assert all(f.evidence["file"].endswith(".jsonl") and f.evidence["line"] > 0 for f in ft111)
    assert r.stats["unknown_types"] == {"from_the_future": 1} and "from_the_future" in r.notes[0]


def test_several_runs_in_one_log(run, tmp_path):
    other = tmp_path / "other"
    generate(other, SyntheticSpec(cells=1, engines=0, rollouts=1, run="another"))
    r = analyze_paths([run, other / "events"])
    assert any("several runs" in f.message for f in r.findings)


def test_rule_selection(run):
    r = analyze_paths([run], select=["ft103", "FT101"])
    assert [x.code for x in r.rules] == ["FT101", "FT103", "FT106", "FT111", "FT112"]  # integrity always runs
    r = analyze_paths([run], skip=["FT104"])
    assert "FT104" not in {x.code for x in r.rules} and len(r.rules) == len(all_rules()) - 1
    with pytest.raises(UsageError, match="always run"):
        analyze_paths([run], skip=["FT111"])
    with pytest.raises(UsageError, match="FT999"):
        analyze_paths([run], select=["FT999"])
    with pytest.raises(InputError):
        analyze_paths([run / "nope"])


def test_selected_rules_only_report_their_own_findings(tmp_path):
    generate(tmp_path, SyntheticSpec(violation="FT104"))
    assert analyze_paths([tmp_path], skip=["FT104"]).findings == []
    assert _codes(analyze_paths([tmp_path], select=["FT104"])) == ["FT104"]


def test_memory_is_bounded_by_open_steps(tmp_path, monkeypatch):
    peak = {"steps": 0, "rollouts": 0}
    original = replay_mod.Replay._record  # called for every step event, after the record is opened

    def record(self, event, fi, line):
        rec = original(self, event, fi, line)
        peak["steps"] = max(peak["steps"], len(self.pending))
        peak["rollouts"] = max(peak["rollouts"], len(self.rollouts))
        return rec

    monkeypatch.setattr(replay_mod.Replay, "_record", record)
    generate(
        tmp_path,
        SyntheticSpec(
            cells=3, tp=2, engines=1, rollouts=30, steps_per_rollout=4, faults=4, tensors=8, samples_per_rollout=8
        ),
    )
    r = analyze_paths([tmp_path])
    assert r.findings == [] and r.stats["steps_committed"] == 120
    assert peak["steps"] <= 2 * (replay_mod.LAG + 2) and peak["rollouts"] <= 3


def test_empty_log_fails_closed(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    r = analyze_paths([tmp_path])
    assert {"FT111", "FT112", "FT113"} <= set(_codes(r)) and r.verdict() == "fail"
