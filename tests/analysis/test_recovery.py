"""The recovery table's ``recovered_by`` for faults that only delay work (``ABSORBABLE``)."""

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
