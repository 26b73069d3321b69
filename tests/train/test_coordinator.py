"""``StepCoordinator`` over fake cells (tests/train/fakecells.py): commit, discard, retry,
reconfigure, restarts after the commit, deadlines, and when a run cannot go on. No Ray."""

from __future__ import annotations

import pytest
from fakecells import FakeRef, FakeRun, never

from ftkit.train.config import TrainConfig
from ftkit.train.control.coordinator import StepCoordinator
from ftkit.train.control.roster import CellsLost
from ftkit.train.control.run_end import RunFailed
from ftkit.train.control.waiting import MARGIN_S


class RecordingHealer:
    """A ``Healing`` that only records what the coordinator asks of it, in order."""

    def __init__(self, log: list[tuple]) -> None:
        self.log = log

    def restart(self, cell: int) -> None:
        self.log.append(("restart", cell))

    def at_boundary(self, step: int, wait: bool = False) -> None:
        self.log.append(("at_boundary", step, wait))

    def give_up(self, reason: str = "run end") -> None:
        self.log.append(("give_up", reason))


def _coord(run: FakeRun, heal: bool = True, **cfg: object) -> StepCoordinator:
    config = TrainConfig(cells=run.cells, rollouts=1, step_timeout=run.step_timeout, **cfg)
    coord = StepCoordinator(config, run.roster, RecordingHealer(run.log) if heal else None)
    coord.reconfigure("run start")
    return coord


def test_a_clean_step_commits_on_every_cell_once() -> None:
    run = FakeRun(cells=2)
    coord = _coord(run)
    out = coord.run_step(0, 0, None, dump=False)
    assert (out.attempts, out.loss, out.grad_norm, out.tokens, out.cells_alive) == (1, 1.5, 0.25, 10, 2)
    assert run.calls("shards") == [("shards", 0, 0, 0, (0, 1, 2, 3)), ("shards", 1, 0, 0, (4, 5, 6, 7))]
    assert [c[:2] for c in run.calls("commit")] == [("commit", 0), ("commit", 1)]
    assert run.calls("discard") == [] and run.calls("restart") == []
    # the healer is asked at the boundary before the attempt; the last step waits for restarts
    assert ("at_boundary", 0, False) in run.log and coord.run_step(0, 1, None, False).attempts == 1
    assert ("at_boundary", 1, True) in run.log


def test_a_dead_cell_discards_the_attempt_everywhere_and_the_retry_commits_over_the_survivors() -> None:
    run = FakeRun(cells=2, script={("compute_reduce", 1, 0, 0): FakeRef(problem=("dead", "the actor died"))})
    coord = _coord(run)
    epoch = run.book.epoch
    out = coord.run_step(0, 0, None, dump=False)
    assert out.attempts == 2 and out.cells_alive == 1
    assert (1, "alive", "failed") in run.states() and ("kill", 1, 0) in run.log
    assert [c[:4] for c in run.calls("discard")] == [("discard", 0, 0, 0)]  # the survivor drops its attempt
    assert run.book.epoch == epoch + 1 and coord.members == [0]  # reconfigured to the survivor
    assert ("shards", 0, 0, 1, tuple(range(8))) in run.log  # the retry: every micro-shard on cell 0
    assert [c[:4] for c in run.calls("commit")] == [("commit", 0, 0, 1)]
    # the restart starts only once the survivors committed (never during the retry)
    assert run.log.index(("restart", 1)) > run.log.index(run.calls("commit")[0])


def test_a_non_finite_reduction_is_discarded_and_retried_without_a_reconfigure() -> None:
    from ftkit.train.rank.step_types import Reduced

    bad = {("compute_reduce", c, 0, 0): FakeRef(Reduced(c, 0, 0, 0, False, 0.0, 0)) for c in (0, 1)}
    run = FakeRun(cells=2, script=bad)
    coord = _coord(run)
    epoch = run.book.epoch
    assert coord.run_step(0, 0, None, dump=False).attempts == 2
    assert [c[:4] for c in run.calls("discard")] == [("discard", 0, 0, 0), ("discard", 1, 0, 0)]
    assert run.book.epoch == epoch and not [s for s in run.states() if s[2] == "failed"]


def test_a_collective_error_is_a_symptom_the_cell_is_not_failed() -> None:
    run = FakeRun(cells=2, script={("compute_reduce", 0, 0, 0): FakeRef(problem=("collective", "peer gone"))})
    coord = _coord(run)
    epoch = run.book.epoch
    assert coord.run_step(0, 0, None, dump=False).attempts == 2
    assert not [s for s in run.states() if s[2] == "failed"] and run.book.epoch == epoch + 1


def test_a_hung_cell_is_failed_at_the_deadline_and_the_others_get_one_collective_timeout() -> None:
    run = FakeRun(cells=2, step_timeout=60.0, collective_timeout=10.0)
    coord = _coord(run)
    start = run.refs.now
    run.script[("compute_reduce", 0, 0, 0)] = FakeRef(Reduced_ok(0), at=start + 1.0)
    run.script[("compute_reduce", 1, 0, 0)] = never()
    coord.run_step(0, 0, None, dump=False)
    failed = [f for t, f in run.events if t == "cell_state" and f["new"] == "failed"]
    assert failed[0]["cell"] == 1 and failed[0]["reason"].startswith("hung: no answer after 13.0s")
    assert run.refs.timeouts[run.refs.timeouts.index(60.0) + 1] == pytest.approx(10.0 + MARGIN_S)


def test_no_answer_at_all_waits_the_whole_step_timeout() -> None:
    run = FakeRun(cells=1, step_timeout=42.0)
    coord = _coord(run, heal=False)
    run.script[("compute_reduce", 0, 0, 0)] = never()
    start = run.refs.now
    with pytest.raises(CellsLost, match="0 live cell"):
        coord.run_step(0, 0, None, dump=False)
    assert run.refs.now - start == pytest.approx(42.0)


def test_a_cell_dying_during_the_commit_is_failed_and_the_step_stands() -> None:
    run = FakeRun(cells=2, script={("commit", 0, 0, 0): FakeRef(problem=("dead", "gone"))})
    coord = _coord(run)
    out = coord.run_step(0, 0, None, dump=False)
    assert out.attempts == 1 and out.cells_alive == 1 and run.calls("discard") == []
    assert (0, "alive", "failed") in run.states()


def test_retries_are_bounded_and_min_cells_is_kept() -> None:
    always = {("compute_reduce", 0, 0, a): FakeRef(problem=("collective", "x")) for a in range(3)}
    run = FakeRun(cells=2, script=always)
    coord = _coord(run, max_retries=2)
    with pytest.raises(RunFailed, match=r"step 0 failed 3 times \(--max-retries 2\)"):
        coord.run_step(0, 0, None, dump=False)
    run = FakeRun(cells=2, min_cells=2, script={("compute_reduce", 1, 0, 0): FakeRef(problem=("dead", "x"))})
    coord = _coord(run, min_cells=2)
    with pytest.raises(RunFailed, match="1 live cell.* --min-cells is 2"):
        coord.run_step(0, 0, None, dump=False)


def test_a_member_that_cannot_join_is_failed_and_the_next_epoch_tried() -> None:
    run = FakeRun(cells=3)
    config = TrainConfig(cells=3, rollouts=1)
    coord = StepCoordinator(config, run.roster, None)
    run.script[("configure", 2, 0, 0)] = FakeRef(problem=("exception", "bind failed"))
    coord.reconfigure("run start")
    assert coord.members == [0, 1] and run.book.epoch == 1
    assert (2, "alive", "failed") in run.states()


def test_the_dump_writer_is_the_first_cell_that_trained_the_whole_rollout() -> None:
    run = FakeRun(cells=2)
    coord = _coord(run)
    run.roster.joined(0, 3)  # cell 0 was healed at step 3: it missed steps 2 of rollout 1
    assert coord.dump_writer(1) == 1 and coord.dump_writer(2) == 0


def Reduced_ok(cell: int):  # noqa: N802 - reads as the value it makes
    from ftkit.train.rank.step_types import Reduced

    return Reduced(cell, 0, 0, 0, True, 1.5, 10)
