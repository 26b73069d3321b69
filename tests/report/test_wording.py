"""Counts read as English in the verdict line (issue 24 item 10: no "1 events")."""

from __future__ import annotations

from ftkit.analysis.engine import AnalysisResult
from ftkit.report.analysis_text import verdict_line


def test_one_event_is_singular() -> None:
    result = AnalysisResult(findings=[], rules=[], stats={"events": 1, "files": 1}, recovery=[])
    line = verdict_line(result, "pass")
    assert "in 1 event from" in line and "1 events" not in line
    assert "in 2 events from" in verdict_line(AnalysisResult([], [], {"events": 2, "files": 1}, []), "pass")
