"""The step's phases: ``PhaseTimer`` (laps), ``attempt_phases`` / ``shard_seconds`` (the
coordinator's composition of the ranks' answers) and ``StepClock`` (the driver's side)."""

import time

from ftkit.evidence.phases import PhaseTimer
from ftkit.train.control.results import StepOutcome
from ftkit.train.control.step_clock import StepClock, attempt_phases, emit_step, shard_seconds
from ftkit.train.rank.step_types import Committed, Reduced


def test_laps_cover_the_stretch_without_gaps():
    clock = PhaseTimer()
    a = clock.lap("a")
    skipped = clock.lap(None)
    b = clock.lap("a")
    with clock.phase("b"):
        pass
    assert clock.seconds["a"] == a + b and "b" in clock.seconds and skipped >= 0
    assert list(clock.seconds) == ["a", "b"]


def test_attempt_phases_split_the_waits_into_rank_phases_and_the_rest():
    reduced = Reduced(0, 0, 3, 0, True, 1.0, 10, {"prepare": 0.1, "forward_backward": 0.5}, {0: 0.3, 1: 0.2})
    committed = Committed(0, 0, 3, 0, 1.0, "t", {"optimizer": 0.2})
    phases = attempt_phases({"membership": 0.01}, (1.0, reduced), (0.5, committed))
    assert phases == {
        "membership": 0.01,
        "prepare": 0.1,
        "forward_backward": 0.5,
        "wait_peers": 0.4,
        "optimizer": 0.2,
        "commit_barrier": 0.3,
    }
    # a rank's clock a hair ahead of the driver's wait: never a negative rest
    assert attempt_phases({}, (0.5, reduced), (0.1, committed))["wait_peers"] == 0.0


def test_shard_seconds_come_from_the_cell_that_computed_each():
    a = Reduced(0, 0, 0, 0, True, 0.0, 1, {}, {0: 0.1, 1: 0.2})
    b = Reduced(1, 0, 0, 0, True, 0.0, 1, {}, {3: 0.4})  # micro-shard 2 was reused: no seconds
    assert shard_seconds({0: [a], 1: [b]}, 4) == [0.1, 0.2, None, 0.4]


class Log:
    def __init__(self):
        self.lines = []

    def emit(self, type, **fields):
        self.lines.append((type, fields))
        return True


def test_the_driver_clock_puts_its_phases_on_the_next_step_and_measures_the_wall():
    clock = StepClock()
    clock.start()
    with clock.phase("generation"):
        time.sleep(0.01)
    out = StepOutcome(0, 0, 1, 1.5, 2.0, 8, 0.02, 2, {"forward_backward": 0.02}, [0.01, None])
    log = Log()
    tps = emit_step(log, out, clock)
    ((type_, fields),) = log.lines
    assert type_ == "metric" and tps == 8 / 0.02
    assert fields["values"] == {
        "loss": 1.5,
        "grad_norm": 2.0,
        "tokens_per_s": tps,
        "step_seconds": 0.02,
        "attempts": 1.0,
    }
    assert list(fields["phases"]) == ["generation", "forward_backward"] and fields["phases"]["generation"] >= 0.01
    assert fields["wall_seconds"] >= fields["phases"]["generation"]
    assert fields["micro_shard_seconds"] == [0.01, None]
    emit_step(log, out, clock)  # the next step: the generation was the first's only
    assert list(log.lines[1][1]["phases"]) == ["forward_backward"]
