"""``emit``: the one output path. Any findings, whatever their text, come out as valid data in
every format, with the exit code from the verdict; only the chosen rendering is produced."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from ftkit.findings import Finding, RuleSummary, Severity, sort_findings
from ftkit.report.emit import Report, emit
from ftkit.report.sink import Format, Output

texts = st.text(max_size=60)
findings_st = st.lists(
    st.builds(
        Finding,
        code=st.sampled_from(["FT101", "CD001", "X9"]),
        rule=texts,
        severity=st.sampled_from(list(Severity)),
        message=texts,
        evidence=st.dictionaries(
            st.sampled_from(["file", "line", "tensor", "value"]),
            st.one_of(texts, st.integers(), st.floats(allow_nan=True, allow_infinity=True)),
            max_size=4,
        ),
        fix=texts,
    ),
    max_size=25,
)


def _report(findings: list[Finding], verdict: str, calls: list[str]) -> Report:
    def human(console: Console) -> None:
        calls.append("human")
        for f in findings:
            console.print(f"{f.code} {f.message} {f.evidence}", markup=False)

    def document() -> dict[str, Any]:
        calls.append("document")
        return {"findings": [f.model_dump(mode="json") for f in findings], "worst": float("nan")}

    return Report(
        command="test-cmd",
        verdict=verdict,
        findings=sort_findings(findings),
        rules=[RuleSummary(code="FT101", rule="r", severity=Severity.error)],
        summary=f"{verdict}: {len(findings)} finding(s) " + "".join(f.message for f in findings[:2]),
        document=document,
        human=human,
        step_summary=lambda: calls.append("summary") or "| a |\n|---|\n| b |",
    )


@given(findings=findings_st, verdict=st.sampled_from(["pass", "fail"]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_findings_render_safely_in_every_format(
    findings: list[Finding], verdict: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    calls: list[str] = []
    junit = tmp_path / "r.xml"
    expected = 1 if verdict == "fail" else 0

    assert emit(Output(Format.json), _report(findings, verdict, calls), junit_xml=junit) == expected
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert doc["verdict"] == verdict and doc["schema_version"] == 1 and doc["worst"] == "NaN"
    ET.parse(junit)

    assert emit(Output(Format.github), _report(findings, verdict, calls)) == expected
    lines = capsys.readouterr().out.splitlines()
    assert 1 <= len(lines) <= 10 and all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
    assert lines[-1].startswith(f"::{'error' if verdict == 'fail' else 'notice'} title=ftkit test-cmd::")

    assert emit(Output(Format.human), _report(findings, verdict, calls)) == expected
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out
    assert calls == ["document", "human"]  # the step summary only when $GITHUB_STEP_SUMMARY is set


def test_step_summary_is_written_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    calls: list[str] = []
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "s.md"))
    emit(Output(Format.github), _report([], "pass", calls))
    assert calls == ["summary"] and (tmp_path / "s.md").read_text() == "| a |\n|---|\n| b |\n\n"
