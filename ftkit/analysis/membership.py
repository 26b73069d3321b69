"""Membership of the replay: who was alive in an epoch, who was lost during a step.

``alive(epoch)`` is the ``alive_after`` of the epoch's ``reconfigure``; epoch 0 without one is the
set of cells ``alive`` by ``cell_state`` when its first step began, or all ``num_cells`` cells
when the log has no ``cell_state``. A cell is *lost* for a step when it died during it (see
``cell_lost``); lost cells are excused from "missing" checks. Deaths come only from the driver's
declarations (``cell_state`` to a dead state); a rank log that merely ends proves nothing.
"""

from __future__ import annotations

from typing import Any

from ftkit.analysis.records import StepRecord
from ftkit.analysis.replay_state import ReplayState


class Membership(ReplayState):
    """Alive sets per epoch and deaths per cell (state in ``ReplayState``)."""

    def alive(self, epoch: int | None, rec: StepRecord) -> frozenset[int] | None:
        """Alive set of ``epoch`` (see the module docstring); None when it cannot be known."""
        if epoch in self.epochs:
            return self.epochs[epoch]
        if epoch is None or self.epochs and epoch > min(self.epochs):
            return None
        if rec.alive_snapshot:
            alive = rec.alive_snapshot
        elif self.run_started is not None:
            alive = frozenset(range(self.run_started["num_cells"]))
        else:
            alive = frozenset(rec.outcomes) | {c for fps in rec.fingerprints.values() for c in fps}
        self.epochs[epoch] = alive
        return alive

    @property
    def ranks_per_cell(self) -> int:
        """tp x pp of the run (from ``run_started``), else the highest rank seen plus one."""
        if self.run_started is not None:
            tp: int = self.run_started["tp"]
            pp: int = self.run_started["pp"]
            return max(1, tp * pp)
        return self.max_rank + 1

    def cell_lost(self, cell: int, step: int) -> bool:
        """The cell died during ``step``: the driver declared it ``errored`` while the run was at
        ``step`` or before, and it had not come back by then (the driver declared it ``alive``
        again, or a new incarnation reported a later step). Only the driver's declaration makes a
        death: a rank log that merely ends proves nothing (it may be cut)."""
        return any(died <= step and (back is None or step < back) for died, back in self.deaths.get(cell, ()))

    def _died(self, cell: int) -> None:
        """The driver declared ``cell`` dead. It died in the step the run was at, and never before
        the step after the last one the driver declared trained (``declared_step``, its ``metric``):
        a declared step was committed by every live cell, so a cell that dies afterwards still owes
        all its evidence of that step (a log cut before it is not excused by the later death)."""
        deaths = self.deaths.setdefault(cell, [])
        if not deaths or deaths[-1][1] is not None:
            died = max(self.cell_last.get(cell, -1), self.max_step, self.declared_step + 1)
            deaths.append([died, None])

    def _rank_of(self, rank: int | None, fi: int) -> int | None:
        """``_rank`` of an event of stream ``fi`` whose ``rank`` field is ``rank``."""
        if rank is None:
            rank = (self.file_source[fi] or {}).get("rank")
        if type(rank) is int and rank > self.max_rank:
            self.max_rank = rank
        return rank

    def _rank(self, ev: dict[str, Any]) -> int | None:
        """The event's rank (its own field, else its source's), tracking the highest seen."""
        rank = ev.get("rank")
        if rank is None:
            rank = ev["source"].get("rank")
        if type(rank) is int and rank > self.max_rank:
            self.max_rank = rank
        return rank
