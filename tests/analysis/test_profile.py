"""The evidence profile (ftkit.analysis.profile): FT112 expects exactly what a producer promised,
fails closed on anything promised and missing, and every rule whose evidence was not promised is
reported as not covered in every format (JSON, human, GitHub, JUnit, HTML), never as passed.

Logs are written in one process with ``EvidenceRun`` (one rank of one cell), plus hand-made
``evidence_profile`` events where a producer lies or repeats itself.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ftkit.analysis.engine import analyze_paths
from ftkit.evidence import EvidenceProfile, EvidenceRun
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

torch = pytest.importorskip("torch")


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(run: EvidenceRun, steps: int = 4, skip: dict[str, int] | None = None) -> None:
    """``steps`` committed steps of one rank over 2 samples each; ``skip``: {kind: step} left out."""
    skip = skip or {}
    model, opt = _model()
    if run.profile.witness:
        run.allocate(0, range(2 * steps))
    for step in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        run.step_outcome(step)
        if run.profile.due("state_fingerprint", step) and skip.get("state_fingerprint") != step:
            run.fingerprint(step, model, opt)
        if run.profile.witness and skip.get("witness_counts") != step:
            run.witness_counts(step, [2 * step, 2 * step + 1])
        if run.profile.due("metric", step) and skip.get("metric") != step:
            run.metric(step, loss=1.0)
        if run.profile.due("checkpoint", step) and skip.get("checkpoint") != step:
            run.publish_checkpoint(step, model, opt)
    run.close()


def _codes(result) -> set[str]:
    return {f.code for f in result.findings if f.severity.value == "error"}


def test_a_run_that_keeps_every_promise_passes_and_says_what_it_does_not_cover(tmp_path):
    _train(EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=2)))
    result = analyze_paths([tmp_path / "events"])
    assert result.verdict() == "pass", result.findings
    assert result.stats["evidence_profile"] == {
        "state_fingerprint": 1,
        "witness_counts": 1,
        "metric": 1,
        "checkpoint": 2,
    }
    assert result.stats["not_covered"] == ["FT102", "FT114"]  # no weight syncs promised


@pytest.mark.parametrize("kind", ["state_fingerprint", "witness_counts", "metric", "checkpoint"])
def test_anything_promised_and_missing_is_ft112(tmp_path, kind):
    # not a checkpoint step for the fingerprint: publish_checkpoint logs the one it publishes
    at = {"checkpoint": 3, "state_fingerprint": 2}.get(kind, 1)
    _train(EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=2)), skip={kind: at})
    result = analyze_paths([tmp_path / "events"])
    assert "FT112" in _codes(result), [f.message for f in result.findings]
    assert any(kind in f.message for f in result.findings if f.code == "FT112")


def test_a_cadence_is_honoured_both_ways(tmp_path):
    """Fingerprints promised every 2nd step: steps 1 and 3 are due, 0 and 2 are not."""
    (tmp_path / "a").mkdir()
    _train(EvidenceRun(tmp_path / "a", EvidenceProfile(fingerprint_every=2)), skip={"state_fingerprint": 0})
    assert analyze_paths([tmp_path / "a" / "events"]).verdict() == "pass"
    (tmp_path / "b").mkdir()
    _train(EvidenceRun(tmp_path / "b", EvidenceProfile(fingerprint_every=2)), skip={"state_fingerprint": 3})
    assert "FT112" in _codes(analyze_paths([tmp_path / "b" / "events"]))


def test_promising_less_cannot_make_a_log_pass_silently(tmp_path):
    """Nothing but step outcomes promised: the verdict cannot be a plain pass; every rule that
    needs the missing evidence is not covered, in every format."""
    from ftkit.report.analysis_formats import json_document, step_summary, verdict_line
    from ftkit.report.junit import rule_cases, write_junit
    from ftkit.report.timeline_html import write_report

    nothing = EvidenceProfile(fingerprint_every=None, witness=False, metric_every=None)
    _train(EvidenceRun(tmp_path, nothing))
    result = analyze_paths([tmp_path / "events"])
    assert result.verdict() == "pass"  # nothing promised is missing ...
    expected = ["FT101", "FT102", "FT103", "FT104", "FT105", "FT107", "FT109", "FT110", "FT114"]
    assert result.stats["not_covered"] == expected
    doc = json.loads(json.dumps(json_document(result, result.verdict())))
    assert [r["code"] for r in doc["rules"] if r["not_covered"]] == expected
    assert all("did not promise" in r["not_covered"] for r in doc["rules"] if r["not_covered"])
    assert "not covered (evidence not promised): FT101, FT102" in verdict_line(result, result.verdict())
    assert step_summary(result, result.verdict()).count("not covered") >= len(expected)
    junit = tmp_path / "junit.xml"
    write_junit(junit, "s", rule_cases("s", result.rules, result.findings))
    suite = ET.parse(junit).getroot()[0]
    not_run = [r.code for r in result.rules if r.status == "not run"]  # no evidence it applies to
    assert not_run == ["FT116"]  # no RL rollout metrics in a DDP log
    assert suite.get("skipped") == str(len(expected) + len(not_run))
    skipped = {c.get("name").split()[0] for c in suite if c.find("skipped") is not None}
    assert skipped == set(expected) | set(not_run)
    write_report(tmp_path / "r.html", [tmp_path / "events"], result, result.verdict())
    html = (tmp_path / "r.html").read_text()
    assert html.count("not covered: ftkit.evidence did not promise") == len(expected)


def test_human_output_says_not_covered(tmp_path, capsys, monkeypatch):
    from ftkit import cli

    monkeypatch.setenv("COLUMNS", "200")
    _train(EvidenceRun(tmp_path, EvidenceProfile(fingerprint_every=None)))
    assert cli.main(["analyze-events", str(tmp_path / "events")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("│ FT101", "│ FT107"))]
    assert len(rows) == 2 and all("not covered" in r for r in rows)


def test_unknown_kinds_and_a_second_profile_fail_closed(tmp_path):
    run = EvidenceRun(tmp_path, EvidenceProfile())
    assert run.driver is not None
    run.driver.emit("evidence_profile", producer="later", kinds={"state_fingerprint": 1000})
    run.driver.emit("evidence_profile", producer="newer", kinds={"telepathy": 1})
    run.close()
    result = analyze_paths([tmp_path / "events"])
    assert any(f.code == "FT111" and "evidence_profile logged twice" in f.message for f in result.findings)
    assert result.stats["evidence_profile"]["state_fingerprint"] == 1  # the first profile stands


def test_unknown_kind_in_the_profile_is_ft112(tmp_path):
    _train(EvidenceRun(tmp_path / "r", EvidenceProfile()))
    log = tmp_path / "r" / "events" / "driver-i0.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    lines[1]["kinds"]["telepathy"] = 1
    assert lines[1]["type"] == "evidence_profile"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = analyze_paths([tmp_path / "r" / "events"])
    assert any(f.code == "FT112" and "telepathy" in f.message for f in result.findings)


def test_logs_without_a_profile_keep_todays_verdicts(tmp_path):
    """ftkit train's logs declare no profile: every rule covered, everything expected."""
    generate(tmp_path, SyntheticSpec(cells=2, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=6))
    result = analyze_paths([tmp_path / "events"])
    assert result.verdict() == "pass"
    assert result.stats["not_covered"] == [] and result.stats["evidence_profile"] is None
    assert all(r.not_covered is None for r in result.rules)
    (tmp_path / "v").mkdir()
    generate(
        tmp_path / "v",
        SyntheticSpec(cells=2, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, violation="FT112"),
    )
    assert "FT112" in _codes(analyze_paths([tmp_path / "v" / "events"]))


def test_the_profile_module_reads_none_as_everything():
    from ftkit.analysis.profile import expects, uncovered

    assert all(expects(None, k, s) for k in ("state_fingerprint", "witness_counts") for s in range(5))
    assert uncovered(None) == {}
    assert not expects({"producer": "x", "kinds": {"metric": 3}}, "metric", 1)
    assert expects({"producer": "x", "kinds": {"metric": 3}}, "metric", 2)
    with pytest.raises(ValueError):
        EvidenceProfile(fingerprint_every=0)


def test_the_event_log_of_the_api_validates_strictly(tmp_path):
    """FTKIT_STRICT_EVENTS is on in the tests: every line the API emits matches the schema."""
    _train(EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=2)))
    files = sorted(p.name for p in Path(tmp_path, "events").iterdir())
    assert files == ["driver-i0.jsonl", "trainer-c0-r0-i0.jsonl"]
