"""JUnit XML and GitHub annotations rendered from findings."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ftkit.findings import FailOn, Finding, RuleSummary, Severity, sort_findings, verdict
from ftkit.report import github, junit


def _findings() -> list[Finding]:
    return [
        Finding(code="FT109", rule="non-finite-metric", severity=Severity.warning, message="loss is NaN"),
        Finding(
            code="FT101",
            rule="replica-divergence",
            severity=Severity.error,
            message="cell 2 differs, a:b",
            evidence={"file": "events/x.jsonl", "line": 7},
            fix="check the reduction",
        ),
    ]


def test_junit_has_one_case_per_rule_and_failures(tmp_path: Path) -> None:
    rules = [
        RuleSummary(code="FT101", rule="replica-divergence", severity=Severity.error, checked=3, findings=1),
        RuleSummary(code="FT102", rule="engine-weights", severity=Severity.error, checked=2),
    ]
    path = tmp_path / "r.xml"
    junit.write_junit(path, "ftkit.test", junit.rule_cases("ftkit.test", rules, _findings()))
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    names = [tc.get("name") for tc in suite.findall("testcase")]
    assert names == ["FT101 replica-divergence", "FT102 engine-weights", "FT109 non-finite-metric"]
    assert suite.get("failures") == "2" and suite.get("tests") == "3"
    failure = suite.findall("testcase")[0].find("failure")
    assert failure is not None and failure.get("message") == "FT101 replica-divergence: cell 2 differs, a:b"
    assert "how to fix: check the reduction" in (failure.text or "")
    assert suite.findall("testcase")[1].find("failure") is None


def test_github_annotation_escapes_and_locates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    line = github.annotation(_findings()[1])
    assert line == (
        "::error file=events/x.jsonl,line=7,title=FT101 replica-divergence::cell 2 differs, a:b"
        "%0AHow to fix: check the reduction"
    )
    assert (
        github.annotation(Finding(code="X", rule="r", severity=Severity.info, message="a\nb%"))
        == "::notice title=X r::a%0Ab%25"
    )


def test_step_summary_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    assert github.append_step_summary("# one")
    assert github.append_step_summary(github.markdown_table(["a"], [["x|y"]]))
    assert target.read_text() == "# one\n\n| a |\n|---|\n| x\\|y |\n\n"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert not github.append_step_summary("ignored")


def test_fail_on_and_sorting() -> None:
    fs = _findings()
    assert [f.code for f in sort_findings(fs)] == ["FT101", "FT109"]
    assert verdict(fs, FailOn.error) == "fail"
    assert verdict(fs[:1], FailOn.error) == "pass"
    assert verdict(fs[:1], FailOn.warning) == "fail"
    assert verdict(fs, FailOn.never) == "pass"


def test_junit_valid_for_both_schemas_one_failure_element_per_failed_case(tmp_path: Path) -> None:
    """Surefire-style consumers need testcase/@time; several findings of one rule are one
    <failure> (counting the rest), so failures= equals the <failure> elements (issue 24 item 5)."""
    from junit_schemas import check_junit

    three = [
        Finding(code="FT111", rule="log-integrity", severity=Severity.error, message=f"line {n} malformed")
        for n in (3, 9, 12)
    ]
    rules = [
        RuleSummary(code="FT111", rule="log-integrity", severity=Severity.error, checked=20, findings=3),
        RuleSummary(code="FT107", rule="heal-unverified", severity=Severity.error, checked=0),
        RuleSummary(code="FT101", rule="replica-divergence", severity=Severity.error, checked=4),
    ]
    path = tmp_path / "r.xml"
    junit.write_junit(path, "ftkit.test", junit.rule_cases("ftkit.test", rules, [*three, *_findings()[1:]]))
    root = check_junit(path)
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "2" and suite.get("skipped") == "1"
    failure = suite.find("testcase/failure")
    assert failure is not None and failure.get("message") == "FT111 log-integrity: line 3 malformed (+2 more)"
    assert all(f"line {n} malformed" in (failure.text or "") for n in (3, 9, 12))
    assert all(tc.get("time") == "0" for tc in suite.iter("testcase"))


def test_junit_of_a_damaged_log_through_the_cli(tmp_path: Path) -> None:
    """``analyze`` on a log with several bad lines: one failure element per failed rule."""
    from junit_schemas import check_junit

    from ftkit import cli
    from ftkit.testing.synthetic import generate
    from ftkit.testing.synthetic_spec import SyntheticSpec

    events = generate(tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=2, steps_per_rollout=2)).events_dir
    log = sorted(events.glob("trainer-*.jsonl"))[0]
    lines = log.read_bytes().splitlines()
    lines[2:5] = [b"{not json", b"[1, 2]", b"\xff\xfe"]
    log.write_bytes(b"\n".join(lines) + b"\n")
    path = tmp_path / "r.xml"
    assert cli.main(["analyze-events", str(events), "--junit-xml", str(path), "-f", "json"]) == 1
    suite = check_junit(path).find("testsuite")
    assert suite is not None and int(suite.get("failures") or 0) >= 2
