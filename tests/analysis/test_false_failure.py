"""FT115: a cell declared hung at a deadline within which another cell died was most likely a
survivor blocked on its dead peer (issue 25, item 3's false positive); a hang on its own, or
one declared long after the other failure, is not flagged."""

from __future__ import annotations

from pathlib import Path

from ftkit import __version__
from ftkit.analysis.engine import analyze_paths
from ftkit.events.writer import EventWriter
from ftkit.findings import Severity


def _log(tmp_path: Path, failures: list[tuple[float, int, str]]) -> Path:
    """A driver log of 3 cells whose failures are ``(time, cell, reason)``."""
    now = [0.0]

    def clock() -> float:
        return now[0]

    events = tmp_path / "events"
    d = EventWriter(events, "r", "driver", clock=clock, pid=1, host="h")
    d.emit("run_started", config={"seed": 0}, num_cells=3, tp=1, pp=1, num_engines=0, ftkit_version=__version__)
    for cell in range(3):
        d.emit("cell_state", cell=cell, old="pending", new="starting", reason="launch")
        d.emit("cell_state", cell=cell, old="starting", new="alive", reason="ready")
    for t, cell, reason in failures:
        now[0] = t
        d.emit("cell_state", cell=cell, old="alive", new="failed", reason=reason)
    d.close()
    return events


def _ft115(events: Path) -> list:
    result = analyze_paths([events], select=["FT115"])
    return [f for f in result.findings if f.code == "FT115"]


def test_a_hung_survivor_declared_with_its_dead_peer_is_a_warning(tmp_path: Path) -> None:
    events = _log(
        tmp_path,
        [
            (10.0, 1, "dead: the actor died (ActorDiedError: ...)"),
            (12.0, 0, "hung: no answer after 12.0s (deadline)"),
        ],
    )
    (finding,) = _ft115(events)
    assert finding.severity is Severity.warning
    assert (finding.evidence["cell"], finding.evidence["peer"]) == (0, 1)
    assert "blocked on its dead peer" in finding.message and finding.evidence["line"] > 0


def test_a_hang_alone_or_long_after_another_failure_is_not_flagged(tmp_path: Path) -> None:
    alone = _log(tmp_path / "a", [(12.0, 0, "hung: no answer after 12.0s (deadline)")])
    later = _log(
        tmp_path / "b",
        [(10.0, 1, "dead: the actor died"), (40.0, 0, "hung: no answer after 12.0s (deadline)")],
    )
    both_hung = _log(
        tmp_path / "c",
        [(10.0, 1, "hung: no answer after 12.0s (deadline)"), (10.0, 0, "hung: no answer after 12.0s (deadline)")],
    )
    assert _ft115(alone) == [] and _ft115(later) == [] and _ft115(both_hung) == []
