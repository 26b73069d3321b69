"""The recovery table: faults that only delay work (``ABSORBABLE``), timings, engine faults."""

from ftkit.analysis.recovery import RecoveryTracker


def _fault(kind: str, step: int, t: float) -> dict:
    return {"kind": kind, "point": "before_forward", "cell": 1, "rank": 0, "rollout": 0, "step": step, "time": t}


def test_a_slow_fault_whose_step_commits_is_absorbed() -> None:
    tr = RecoveryTracker()
    tr.fault(_fault("slow", 3, 10.0), ("f", 1))
    tr.step_closed(9.5, True, 0, 2)  # another step: not this fault's
    assert tr.rows[0].recovered_by is None
    tr.step_closed(9.9, True, 0, 3)
    assert tr.rows[0].recovered_by == "absorbed"


def test_a_kill_is_never_absorbed_only_recovered() -> None:
    tr = RecoveryTracker()
    tr.fault(_fault("sigkill", 3, 10.0), ("f", 1))
    tr.step_closed(9.9, True, 0, 3)  # a commit alone does not recover a killed cell
    assert tr.rows[0].recovered_by is None
    tr.reconfigured(11.0)
    assert tr.rows[0].recovered_by == "reconfigure" and tr.rows[0].reconfigure_s == 1.0


def test_a_slow_fault_whose_step_is_discarded_waits_for_the_retry() -> None:
    tr = RecoveryTracker()
    tr.fault(_fault("slow", 3, 10.0), ("f", 1))
    tr.step_closed(9.9, False, 0, 3)
    assert tr.rows[0].recovered_by is None
    tr.step_closed(12.0, True, 1, 3)
    assert tr.rows[0].recovered_by == "absorbed"


def test_time_to_the_next_commit_and_the_heal_bytes_of_every_rank() -> None:
    tr = RecoveryTracker()
    tr.fault(_fault("sigkill", 3, 10.0), ("f", 1))
    tr.committed(9.9)  # before the fault: not its next commit
    tr.committed(11.5)
    tr.committed(12.0)
    tr.healed(20.0, 1, 1000, epoch=2)  # rank 0 of the healed cell
    tr.healed(20.1, 1, 500, epoch=2)  # rank 1, same heal
    tr.healed(40.0, 1, 700, epoch=5)  # a later heal of the same cell is not this fault's
    row = tr.table()[0]
    assert row["next_commit_s"] == 1.5 and row["heal_s"] == 10.0 and row["heal_bytes"] == 1500


def _engine_fault(kind: str, t: float, engine: int = 0) -> dict:
    return {
        "kind": kind, "point": "during_weight_sync", "cell": None, "rank": None, "rollout": 0, "step": 2,
        "time": t, "engine": engine,
    }  # fmt: skip


def test_an_engine_fault_is_detected_and_recovered_by_its_engine_only() -> None:
    """A killed engine is not recovered by what the cells do (a reconfigure for a healed cell, a
    retry), only by its replacement starting; a dead cell is not its detection either."""
    tr = RecoveryTracker()
    tr.fault(_engine_fault("sigkill", 10.0), ("f", 1))
    tr.detected(10.5, cell=1)  # a cell failing: not this engine's sign
    tr.engine_failed(10.6, engine=1)  # another engine
    tr.reconfigured(11.0)
    tr.healed(11.5, 1, 100, epoch=2)
    tr.step_closed(10.2, True, 1, 3)  # a retry of the cells
    row = tr.table()[0]
    assert row["recovered_by"] is None and row["detect_s"] is None and row["engine"] == 0
    tr.engine_failed(10.8, engine=0)
    tr.engine_restarted(14.0, engine=1)
    assert tr.rows[0].recovered_by is None
    tr.engine_restarted(15.0, engine=0)
    row = tr.table()[0]
    assert row["recovered_by"] == "engine_restart" and abs(row["detect_s"] - 0.8) < 1e-9


def test_a_slow_engine_is_absorbed_by_the_next_commit() -> None:
    tr = RecoveryTracker()
    tr.fault(_engine_fault("slow", 10.0), ("f", 1))
    tr.committed(9.0)
    assert tr.rows[0].recovered_by is None
    tr.committed(12.0)
    assert tr.rows[0].recovered_by == "absorbed"
