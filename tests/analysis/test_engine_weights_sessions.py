"""FT102 across sessions of a resumed run: a weights version in flight when a session stopped
(killed between the push and the engines' loads, or failed / interrupted) is not an engine that
failed to report; a session that completed still owes every report."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftkit.analysis.engine import analyze_paths
from ftkit.events.writer import EventWriter
from ftkit.tensors.fingerprint import combine
from ftkit.train.config import TrainConfig

WEIGHT, OTHER = "ab" * 16, "cd" * 16  # the fingerprint of the one tensor "w" (totals are recomputed from it)


def _head(resumed: bool) -> dict[str, object]:
    head: dict[str, object] = dict(
        config=TrainConfig().model_dump(mode="json"), num_cells=1, tp=1, pp=1, num_engines=2, ftkit_version="0"
    )
    if resumed:
        head.update(checkpoint="step_000001", checkpoint_step=1, checkpoint_rollout=0, skipped=[])
    return head


def _session(events: Path, incarnation: int, ending: str | None, loads: int, loaded: str = WEIGHT) -> None:
    """A driver and two engines: version 1 sent and loaded by both, version 2 sent and loaded by
    ``loads`` engines; ``ending``: the run_finished status, None for a killed session."""
    driver = EventWriter(events, run="r", role="driver", incarnation=incarnation)
    engines = [EventWriter(events, run="r", role="engine", rank=e, incarnation=incarnation) for e in (0, 1)]
    driver.emit("run_resumed" if incarnation else "run_started", **_head(bool(incarnation)))
    for version, n in ((1, 2), (2, loads)):
        driver.emit(
            "weights_sent", rollout=version - 1, version=version, total=combine({"w": WEIGHT}), params={"w": WEIGHT}
        )
        for e in range(n):
            engines[e].emit(
                "engine_weights",
                rollout=version - 1,
                version=version,
                engine=e,
                total=combine({"w": loaded}),
                params={"w": loaded},
            )
    if ending is None:  # SIGKILLed: no run_finished, no log_closed anywhere
        return
    driver.emit("run_finished", status=ending, reason=None if ending == "completed" else "stopped")
    for w in (driver, *engines):
        w.close()


def _ft102(events: Path) -> list[str]:
    return [f.message for f in analyze_paths([events], select=["FT102"]).findings if f.code == "FT102"]


@pytest.mark.parametrize("ending", [None, "interrupted", "failed"])
def test_the_version_in_flight_when_a_session_stopped_is_excused(tmp_path: Path, ending: str | None) -> None:
    _session(tmp_path, 0, ending, loads=1)  # stopped after engine 0 loaded version 2, before engine 1
    _session(tmp_path, 1, "completed", loads=2)
    assert _ft102(tmp_path) == []


def test_a_completed_session_still_owes_every_report(tmp_path: Path) -> None:
    _session(tmp_path, 0, "completed", loads=1)
    _session(tmp_path, 1, "completed", loads=2)
    assert _ft102(tmp_path) == ["engine(s) [1] did not report loading weights version 2"]


def test_wrong_weights_in_a_stopped_session_are_still_reported(tmp_path: Path) -> None:
    _session(tmp_path, 0, None, loads=1, loaded=OTHER)  # what engine 0 did load was wrong
    _session(tmp_path, 1, "completed", loads=2)
    assert any(f"loaded weights {combine({'w': OTHER})[:12]} for version" in m for m in _ft102(tmp_path))


def test_without_the_resume_the_missing_report_is_a_finding(tmp_path: Path) -> None:
    _session(tmp_path, 0, "completed", loads=1)
    assert _ft102(tmp_path) == ["engine(s) [1] did not report loading weights version 2"]
