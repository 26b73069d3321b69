"""The driver's cell state machine: legal transitions are events, illegal ones are refused."""

from types import SimpleNamespace

import pytest

from ftkit.events.schema import parse_event
from ftkit.train.control.cell_state import LEGAL, CellBook, CellState


def book(cells=2):
    emitted = []
    return CellBook(cells, SimpleNamespace(emit=lambda type_, **fields: emitted.append((type_, fields)))), emitted


def test_a_failed_cell_is_restarted_healed_and_alive_again_every_step_an_event():
    b, emitted = book()
    path = ["starting", "alive", "failed", "restarting", "healing", "restarting", "healing", "alive", "stopped"]
    for new in path:
        b.transition(1, CellState(new), f"to {new}")
    assert [f["new"] for t, f in emitted if t == "cell_state"] == path
    assert [f["old"] for t, f in emitted][1:] == path[:-1]
    assert emitted[2][1] == {"cell": 1, "old": "alive", "new": "failed", "reason": "to failed"}


@pytest.mark.parametrize(
    ("path", "bad"),
    [(["starting", "alive"], "restarting"), (["starting", "alive", "stopped"], "alive"), ([], "alive")],
)
def test_illegal_transitions_raise_and_emit_nothing(path, bad):
    b, emitted = book()
    for new in path:
        b.transition(0, CellState(new), "ok")
    with pytest.raises(RuntimeError, match="illegal transition"):
        b.transition(0, CellState(bad), "bad")
    assert len(emitted) == len(path)


def test_epochs_count_up_with_the_alive_set():
    b, emitted = book(3)
    for c in range(3):
        b.transition(c, CellState.starting, "start")
        b.transition(c, CellState.alive, "up")
    assert b.next_epoch("run start", []) == 0
    b.transition(2, CellState.failed, "dead")
    assert b.alive() == [0, 1]
    assert b.next_epoch("cell 2 failed", [0, 1, 2]) == 1
    reconf = [f for t, f in emitted if t == "reconfigure"]
    assert reconf[-1] == {"epoch": 1, "alive_before": [0, 1, 2], "alive_after": [0, 1], "reason": "cell 2 failed"}


def test_every_state_is_a_schema_cell_status_and_every_state_has_rules():
    assert set(LEGAL) == set(CellState)
    envelope = {"schema": 1, "run": "r", "time": 1.0, "seq": 0}
    source = {"role": "driver", "cell": None, "rank": None, "incarnation": 0, "pid": 1, "host": "h"}
    for state in CellState:
        ev = {**envelope, "type": "cell_state", "source": source, "cell": 0, "old": "alive", "new": state.value}
        assert parse_event(ev).new == state.value
