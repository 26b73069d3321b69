"""At 60 columns the analyze-events tables stay readable (issue 24 item 9): columns are chosen by
priority and dropped whole (the caption names them), text wraps, nothing shrinks to ``x…``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ftkit.analysis.engine import AnalysisResult, analyze_paths
from ftkit.report.analysis_human import render_human
from ftkit.report.analysis_text import RECOVERY_COLUMNS
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> AnalysisResult:
    d: Path = tmp_path_factory.mktemp("narrow")
    generate(d, SyntheticSpec(cells=3, engines=1, rollouts=2, steps_per_rollout=4, faults=2))
    return analyze_paths([d / "events"])


def _render(result: AnalysisResult, width: int) -> str:
    buf = io.StringIO()
    render_human(Console(file=buf, width=width, emoji=False, highlight=False), result, result.verdict())
    return buf.getvalue()


def test_sixty_columns_keep_whole_columns_by_priority(result: AnalysisResult) -> None:
    text = _render(result, 60)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "…" not in text
    for header in ("code", "rule", "findings", "index", "kind", "recovered_by"):
        assert f" {header} " in text
    assert "membership-inconsistent" in text  # the longest rule name, whole
    assert "not shown at this width:" in text and "detect_s" in text.split("not shown at this width:")[-1]


def test_a_wide_terminal_shows_every_column(result: AnalysisResult) -> None:
    text = _render(result, 220)
    assert "not shown" not in text and all(f" {c} " in text for c in RECOVERY_COLUMNS)
