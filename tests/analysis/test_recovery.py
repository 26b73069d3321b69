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
    tr.engine_failed(10.6, 1, "dead", ("d", 2))  # another engine: a failure of its own
    tr.reconfigured(11.0)
    tr.healed(11.5, 1, 100, epoch=2)
    tr.step_closed(10.2, True, 1, 3)  # a retry of the cells
    row = tr.table()[0]
    assert row["recovered_by"] is None and row["detect_s"] is None and row["engine"] == 0
    tr.engine_failed(10.8, 0, "dead", ("d", 3))
    tr.engine_restarted(14.0, engine=1)
    assert tr.rows[0].recovered_by is None and tr.rows[1].recovered_by == "engine_restart"
    tr.engine_restarted(15.0, engine=0)
    row = tr.table()[0]
    assert row["recovered_by"] == "engine_restart" and abs(row["detect_s"] - 0.8) < 1e-9
    # engine 0's failure was its fault's detection; engine 1's is a row of its own
    assert len(tr.rows) == 2 and tr.rows[1].engine == 1 and not tr.rows[1].injected


def test_a_slow_engine_is_absorbed_by_the_next_commit() -> None:
    tr = RecoveryTracker()
    tr.fault(_engine_fault("slow", 10.0), ("f", 1))
    tr.committed(9.0)
    assert tr.rows[0].recovered_by is None
    tr.committed(12.0)
    assert tr.rows[0].recovered_by == "absorbed"


def test_a_failure_nobody_injected_is_a_row_of_its_own_and_fails_closed_until_recovered() -> None:
    """An outside SIGKILL (no ``fault_injected``): the cell's failure is the row, detected at once,
    recovered by the reconfigure, healed later; an unrecovered one stays ``None`` (FT113)."""
    tr = RecoveryTracker()
    tr.cell_failed(10.0, 1, "dead: the actor died", ("driver.jsonl", 7), 0)
    tr.reconfigured(10.5)
    tr.committed(11.0)
    tr.healed(15.0, 1, 100, epoch=3)
    (row,) = tr.table()
    assert row["injected"] is False and row["kind"] == "detected" and row["cause"] == "dead: the actor died"
    assert row["cell"] == 1 and row["detect_s"] == 0.0 and row["recovered_by"] == "reconfigure"
    assert row["reconfigure_s"] == 0.5 and row["next_commit_s"] == 1.0 and row["heal_s"] == 5.0
    assert (row["file"], row["line"]) == ("driver.jsonl", 7)
    tr.cell_failed(20.0, 0, "hung: no answer after 12.0s (deadline)", ("driver.jsonl", 9), 0)
    assert tr.rows[1].recovered_by is None


def test_an_injected_fault_is_matched_to_its_detection_once() -> None:
    tr = RecoveryTracker()
    tr.fault(_fault("sigkill", 3, 10.0), ("f", 1))
    tr.cell_failed(10.2, 0, "dead", ("d", 1), 0)  # another cell: not this fault's detection
    tr.cell_failed(10.3, 1, "dead", ("d", 2), 0)  # the fault's detection: no row of its own
    tr.cell_failed(12.0, 1, "restart failed: ...", ("d", 3), 0)  # a second failure of the cell: its own row
    assert [(r.kind, r.cell, r.injected) for r in tr.rows] == [
        ("sigkill", 1, True),
        ("detected", 0, False),
        ("detected", 1, False),
    ]
    assert tr.rows[0].detect_s is not None and abs(tr.rows[0].detect_s - 0.3) < 1e-9


def test_a_nan_grad_retried_takes_neither_the_next_fault_s_reconfigure_nor_its_heal() -> None:
    """A chaos run's nan-grad on cell 2 at step 22 was shown with the reconfigure and heal of the
    next fault on cell 2 (step 29)."""
    tr = RecoveryTracker()
    nan = {**_fault("nan-grad", 22, 10.0), "cell": 2}
    tr.fault(nan, ("f", 1))
    tr.step_closed(10.1, False, 0, 22)  # the attempt is discarded everywhere
    tr.step_closed(10.5, True, 1, 22)  # and its retry commits
    assert tr.rows[0].recovered_by == "retry"
    tr.cell_failed(30.0, 2, "dead", ("d", 2), 0)  # a later, outside kill of the same cell
    tr.reconfigured(31.0)
    tr.healed(38.0, 2, 100, epoch=4)
    nan_row, kill_row = tr.table()
    assert nan_row["reconfigure_s"] is None and nan_row["heal_s"] is None
    assert kill_row["injected"] is False and kill_row["reconfigure_s"] == 1.0 and kill_row["heal_s"] == 8.0


def test_a_detected_failure_between_rollouts_loses_the_next_rollout_s_samples_or_none() -> None:
    """A rank killed during a checkpoint preflight (no rollout open): its row takes the rollout
    that opens next, so its ``samples_lost`` is that rollout's deficit, not ``None``."""
    tr = RecoveryTracker()
    tr.cell_failed(10.0, 1, "during the checkpoint preflight: dead", ("d", 1), None)
    tr.cell_failed(11.0, 0, "dead", ("d", 2), 4)  # while rollout 4 was open: that one's
    assert [r.rollout for r in tr.rows] == [None, 4]
    tr.rollout_opened(5)
    tr.rollout_closed(4, 2)
    tr.rollout_closed(5, 0)
    assert [(r.rollout, r.samples_lost) for r in tr.rows] == [(5, 0), (4, 2)]
