"""The driver's cell state machine: one state per cell, legal transitions, the membership epoch.

::

    pending -> starting -> alive -> stopped                    (a run without faults)
                   |         |
                   v         v
                 failed <----+------------------+
                   |  ^                         |
                   v  |                         |
               restarting -> healing -> alive   |
                   ^            |               |
                   +------------+ (heal rejected: another donor)
                                +---------------+ (died while healing)

``failed``, ``restarting`` and ``healing`` may also go to ``stopped`` (the run ended or gave
the cell up). Every transition is one ``cell_state`` event (old, new, reason) written by the
driver, so the log holds each detection with its cause. ``CellBook.transition`` refuses an
illegal one (a bug in the driver, never a fault).

``alive()`` is the sorted list of ``alive`` cells: the membership of the current ``epoch``.
The epoch counts up at every ``reconfigure`` (``CellBook.next_epoch``); the cross-cell groups
of an epoch live under their own store prefix, so a member of an old epoch cannot join.
"""

from __future__ import annotations

from enum import Enum

from ftkit.evidence import emit


class CellState(str, Enum):
    """The states of a cell (the ``CellStatus`` values of the event schema)."""

    pending = "pending"
    starting = "starting"
    alive = "alive"
    failed = "failed"
    restarting = "restarting"
    healing = "healing"
    stopped = "stopped"


LEGAL: dict[CellState, frozenset[CellState]] = {
    CellState.pending: frozenset({CellState.starting}),
    CellState.starting: frozenset({CellState.alive, CellState.failed, CellState.stopped}),
    CellState.alive: frozenset({CellState.failed, CellState.stopped}),
    CellState.failed: frozenset({CellState.restarting, CellState.stopped}),
    CellState.restarting: frozenset({CellState.healing, CellState.failed, CellState.stopped}),
    CellState.healing: frozenset({CellState.alive, CellState.restarting, CellState.failed, CellState.stopped}),
    CellState.stopped: frozenset(),
}


class CellBook:
    """The states of all cells and the current epoch; every transition is emitted to ``log``
    (the driver's: its event log, teed to the live view, ``ftkit.evidence.emit.Tee``)."""

    def __init__(self, cells: int, log: emit.EventSink) -> None:
        self.state = {c: CellState.pending for c in range(cells)}
        self.epoch = -1  # no membership yet; the first reconfigure makes epoch 0
        self.log = log

    def transition(self, cell: int, new: CellState, reason: str, after_signal: bool = False) -> None:
        """Move ``cell`` to ``new`` (emits ``cell_state``); an illegal move raises ``RuntimeError``.
        Once a signal stopped the run, no cell is failed any more: whatever made it look failed
        (a call that the signal cut short) raises the interruption instead
        (``ftkit.train.control.run_end.pending_interruption``), unless ``after_signal``: a death
        seen by a call made after the signal was handled (``CellSession.stop``), which no signal cut."""
        if new is CellState.failed and not after_signal:
            from ftkit.train.control.run_end import raise_if_interrupted

            raise_if_interrupted()
        old = self.state[cell]
        if new not in LEGAL[old]:
            raise RuntimeError(f"cell {cell}: illegal transition {old.value} -> {new.value} ({reason})")
        self.state[cell] = new
        emit.cell_state(self.log, cell=cell, old=old.value, new=new.value, reason=reason)

    def in_state(self, *states: CellState) -> list[int]:
        """The cells in any of ``states``, sorted."""
        return sorted(c for c, s in self.state.items() if s in states)

    def alive(self) -> list[int]:
        """The alive cells, sorted: the current membership."""
        return self.in_state(CellState.alive)

    def next_epoch(self, reason: str, before: list[int]) -> int:
        """Count the epoch up and emit ``reconfigure`` (``before`` -> the alive cells now)."""
        self.epoch += 1
        emit.reconfigure(self.log, epoch=self.epoch, alive_before=before, alive_after=self.alive(), reason=reason)
        return self.epoch
