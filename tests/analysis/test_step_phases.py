"""``StepPhases`` (the ``step_phases`` stats of analyze-events) and its human table."""

import io

from rich.console import Console

from ftkit.analysis.step_phases import StepPhases
from ftkit.report.analysis_human import phases_table


def metric(wall, **phases):
    return {"type": "metric", "step": 0, "values": {}, "phases": phases, "wall_seconds": wall}


def test_median_max_share_and_unattributed_per_phase():
    stats = StepPhases()
    stats.add(metric(1.0, generation=0.5, forward_backward=0.4))
    stats.add(metric(0.5, forward_backward=0.3))  # no generation on this step: it counts 0
    stats.add(metric(0.6, forward_backward=0.5, reduce=0.1))  # a phase first seen on step 3
    stats.add({"type": "metric", "step": 3, "values": {"loss": 1.0}})  # an older log's metric: not counted
    out = stats.summary()
    assert out["steps"] == 3
    assert out["wall"] == {"median": 0.6, "max": 1.0, "total": 2.1}
    assert list(out["phases"]) == ["forward_backward", "generation", "reduce"]  # by total
    assert out["phases"]["generation"] == {"median": 0.0, "max": 0.5, "total": 0.5, "share": round(0.5 / 2.1, 4)}
    assert out["phases"]["reduce"]["median"] == 0.0 and out["phases"]["reduce"]["max"] == 0.1
    assert out["phases"]["forward_backward"]["median"] == 0.4
    assert out["unattributed"] == {"median": 0.1, "max": 0.2, "total": 0.3}


def test_no_phases_no_summary():
    stats = StepPhases()
    stats.add({"type": "metric", "step": 0, "values": {"loss": 1.0}})
    assert stats.summary() is None


def test_human_table_lists_every_phase_with_its_share():
    stats = StepPhases()
    stats.add(metric(2.0, optimizer=0.5, forward_backward=1.5))
    console = Console(file=io.StringIO(), width=100)
    console.print(phases_table(stats.summary()))
    text = console.file.getvalue()
    assert "1 step;" in text and "2.0000s" in text.replace("\n", "")
    assert text.index("forward_backward") < text.index("optimizer")
    assert "75.0%" in text and "25.0%" in text and "(unattributed)" in text
