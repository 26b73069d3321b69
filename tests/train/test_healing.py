"""``Healer`` over fake cells (tests/train/fakecells.py): restart, heal ordering at a step
boundary, a rejected heal, a donor that dies, the heal timeout. No Ray."""

from __future__ import annotations

from fakecells import FakeRef, FakeRun, never

from ftkit.train.config import TrainConfig
from ftkit.train.control.healing import HEAL_TRIES, Healer
from ftkit.train.rank.step_types import HealReport


def _healer(run: FakeRun, heal_timeout: float = 120.0) -> tuple[Healer, list[tuple[int, int, str | None]]]:
    spawned: list[tuple[int, int, str | None]] = []

    def spawn(cell: int, incarnation: int, target: str | None):
        spawned.append((cell, incarnation, target))
        return run.cell(cell, incarnation)

    cfg = TrainConfig(cells=run.cells, heal_timeout=heal_timeout)
    return Healer(cfg, run.roster, spawn, ("127.0.0.1", 1)), spawned


def _fail(run: FakeRun, healer: Healer, cell: int) -> None:
    run.roster.fail(cell, "dead: test")
    for c in run.roster.take_restarts():
        healer.restart(c)


def test_a_failed_cell_is_restarted_as_its_next_incarnation_without_waiting() -> None:
    run = FakeRun(cells=2)
    healer, spawned = _healer(run)
    _fail(run, healer, 1)
    assert spawned == [(1, 1, None)] and run.roster.cells[1].incarnation == 1
    assert run.states()[-2:] == [(1, "alive", "failed"), (1, "failed", "restarting")]
    assert ("init", 1, 1, 1) in run.log  # init started, not waited for


def test_a_ready_cell_is_healed_from_a_live_donor_then_joins_at_the_boundary() -> None:
    run = FakeRun(cells=3)
    healer, _ = _healer(run)
    _fail(run, healer, 2)
    healer.at_boundary(5)
    assert run.states()[-2:] == [(2, "restarting", "healing"), (2, "healing", "alive")]
    serve = run.calls("serve_state")
    load = run.calls("load_state")
    assert [c[1] for c in serve] == [0] and load == [("load_state", 2, 5, 0)]  # donor 0, the first live
    assert run.roster.since[2] == 5 and len(healer.reports) == 1 and not healer.ready


def test_a_rejected_heal_goes_back_to_restarting_and_retries_from_the_next_donor() -> None:
    run = FakeRun(cells=3)
    healer, _ = _healer(run)
    _fail(run, healer, 2)
    rejected = FakeRef(HealReport(2, 0, 0, False, 8, "aa", "ab", {}))
    run.script[("load_state", 2, 5, 0)] = rejected
    healer.at_boundary(5)
    moves = [s for s in run.states() if s[0] == 2][-4:]
    assert moves == [
        (2, "restarting", "healing"),
        (2, "healing", "restarting"),
        (2, "restarting", "healing"),
        (2, "healing", "alive"),
    ]
    assert [c[1] for c in run.calls("serve_state")] == [0, 1]  # the retry's donor is the next live cell


def test_a_heal_that_keeps_failing_stops_after_heal_tries_at_one_boundary() -> None:
    run = FakeRun(cells=2)
    healer, _ = _healer(run)
    _fail(run, healer, 1)
    for attempt in range(HEAL_TRIES + 1):
        run.script[("load_state", 1, 3, attempt)] = FakeRef(HealReport(1, 0, 0, False, 8, "aa", "ab", {}))
    healer.at_boundary(3)
    assert len(run.calls("load_state")) == HEAL_TRIES and run.book.state[1].value == "restarting"
    assert healer.ready == {1}  # tried again at the next boundary


def test_a_donor_that_dies_is_failed_and_the_recipient_waits_for_another() -> None:
    run = FakeRun(cells=3)
    healer, spawned = _healer(run)
    _fail(run, healer, 2)
    run.script[("load_state", 2, 4, 0)] = FakeRef(problem=("exception", "stream broke"))
    run.script[("serve_state", 0, 0, 0)] = FakeRef(problem=("dead", "donor died"))
    healer.at_boundary(4)
    assert (0, "alive", "failed") in run.states()  # the donor, not the recipient
    assert (2, "healing", "restarting") in run.states()
    assert spawned == [(2, 1, None)]  # the recipient was not restarted again
    assert run.book.state[2].value == "alive"  # healed in the next round from donor 1


def test_a_cell_not_started_within_the_heal_timeout_is_given_up() -> None:
    run = FakeRun(cells=2)
    healer, _ = _healer(run, heal_timeout=30.0)
    run.script[("init", 1, 1, 1)] = never()
    _fail(run, healer, 1)
    healer.at_boundary(1)
    assert run.book.state[1].value == "restarting"  # not waited for, not given up yet
    healer.at_boundary(2, wait=True)  # the last step: wait, at most until the heal timeout
    assert run.refs.now == 30.0
    run.refs.now += 0.5  # the timeout is past
    healer.at_boundary(3)
    assert run.book.state[1].value == "stopped" and ("kill", 1, 1) in run.log
    assert run.states()[-1] == (1, "restarting", "stopped")


def test_give_up_stops_every_cell_still_starting() -> None:
    run = FakeRun(cells=2)
    healer, _ = _healer(run)
    run.script[("init", 1, 1, 1)] = never()
    _fail(run, healer, 1)
    healer.give_up("run end")
    assert run.states()[-1] == (1, "restarting", "stopped") and ("kill", 1, 1) in run.log
