"""Open step and rollout records of the replay, and the watermark that closes them.

Step evidence (outcomes, fingerprints, witness counts) is gathered in one ``StepRecord`` per open
(rollout, step, attempt). A step is *closed* -- the rules' ``on_step`` runs and the record is
dropped -- once every active stream that reports steps has reached step ``s + LAG`` (or ended),
so everything that belongs to it has been read. A rollout is closed when every such stream has
moved past it and its steps are closed. Memory therefore follows the open steps and rollouts
(plus one row per fault, checkpoint and non-finite step), never the length of the log. Streams
are expected to be time-ordered (the writer's are: one process each).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ftkit.analysis.membership import Membership
from ftkit.analysis.records import RolloutRecord, StepRecord

LAG = 2  # a step closes when every reporting stream is this many steps ahead


class Watermark(Membership):
    """Open records keyed by (rollout, step, attempt) and their closing (state in ``ReplayState``)."""

    @staticmethod
    def _unmark(marks: Counter[int], value: int) -> None:
        marks[value] -= 1
        if not marks[value]:
            del marks[value]

    def _progress(self, fi: int, line: int, step: int, rollout: int) -> bool:
        """Record that stream ``fi`` reached ``step``; False when the step is already closed."""
        last = self.file_step.get(fi)
        if last == step:  # the common case: one more event of the stream's current step
            return True
        if step < self.closed_below:
            self.late[0] += 1
            self.late[1] = self.late[1] or self.where(fi, line)
            return False
        if last is None or step > last:
            # Run once per stream and step (a third of the events of a small-event log): the marks
            # are updated inline, and a stream's rollout mark only when its rollout changes.
            marks = self.step_marks
            if last is not None:
                marks[last] -= 1
                if not marks[last]:
                    del marks[last]
            self.file_step[fi] = step
            if step > self.max_step:
                self.max_step = step
            cell = self.file_cell.get(fi)
            if cell is not None:
                if step > self.cell_last.get(cell, -1):
                    self.cell_last[cell] = step
                deaths = self.deaths.get(cell)
                if deaths and deaths[-1][1] is None and step > deaths[-1][0]:
                    deaths[-1][1] = step  # a new incarnation reports: the cell is back
            old_rollout = self.file_rollout.get(fi)  # None exactly when last is None
            if old_rollout is None or rollout > old_rollout:
                if old_rollout is not None:
                    self._unmark(self.rollout_marks, old_rollout)
                self.file_rollout[fi] = rollout
                self.rollout_marks[rollout] += 1
            marks[step] += 1
            if last is not None and last not in marks and last < min(marks):
                self._advance()  # the slowest stream moved on
        return True

    def _stream_left(self, fi: int) -> None:
        """Stream ``fi`` ended: it no longer holds the watermark back."""
        step = self.file_step.pop(fi, None)
        if step is not None:
            self._unmark(self.step_marks, step)
            self._unmark(self.rollout_marks, self.file_rollout.pop(fi))
            self._advance()

    def _advance(self, final: bool = False) -> None:
        """Close every step below the watermark and every rollout all streams moved past."""
        if not final and not self.step_marks:
            return  # no stream reports steps right now: wait for the next one (or the end)
        step_mark = min(self.step_marks) if not final else math.inf
        roll_mark = min(self.rollout_marks) if not final else math.inf
        limit = step_mark - LAG + 1
        if limit > self.closed_below and self.pending:
            for key in sorted(k for k in self.pending if k[1] < limit):
                self._close_step(self.pending.pop(key))
        if limit > self.closed_below and limit != math.inf:
            self.closed_below = int(limit)
        open_rollouts = {k[0] for k in self.pending}
        for r in sorted(self.rollouts):
            if r < roll_mark and r not in open_rollouts:
                self._close_rollout(self.rollouts.pop(r))

    def _record(self, ev: dict[str, Any], fi: int, line: int) -> StepRecord | None:
        """The open record of the event's (rollout, step, attempt), opened on first sight; None
        when the step is already closed (the event came late: counted, reported by the rules) or
        when the event is not its writer's (see ``_foreign``)."""
        return self._record_at(
            fi,
            line,
            ev["type"],
            (ev["rollout"], ev["step"], ev["attempt"]),
            ev["cell"],
            ev.get("rank"),
            ev["time"],
            "rank" in ev,
        )

    def _record_at(
        self,
        fi: int,
        line: int,
        t: str,
        key: tuple[int, int, int],
        ev_cell: int,
        ev_rank: int | None,
        time: float,
        has_rank: bool,
    ) -> StepRecord | None:
        """``_record`` of an event given by its fields (a compact record: ``ftkit.analysis.parallel``);
        ``has_rank``: whether the event has a ``rank`` field (``ev_rank`` is None when it has not)."""
        cell = self.file_cell.get(fi)  # a trainer's stream (its source is known): the source's cell
        if cell is not None and (ev_cell != cell or ev_rank not in (None, (self.file_source[fi] or {}).get("rank"))):
            self._foreign(t, ev_cell, ev_rank, has_rank, fi, line)
            return None
        rec = self.pending.get(key)
        if rec is not None and self.file_step.get(fi) == key[1]:
            return rec  # the common case, without a call
        if rec is None:
            if not self._progress(fi, line, key[1], key[0]):
                return None
            snapshot = frozenset(c for c, s in self.cell_status.items() if s == "alive") if self.cell_status else None
            rec = self.pending[key] = StepRecord(key[0], key[1], key[2], time, snapshot)
            self.closure.see_step(key[1])
            if key[0] not in self.rollouts:
                self.rollouts[key[0]] = RolloutRecord(key[0])
        elif not self._progress(fi, line, key[1], key[0]):
            return None
        return rec

    def _foreign(self, t: str, cell: int, rank: int | None, has_rank: bool, fi: int, line: int) -> None:
        """Step evidence whose ``cell`` / ``rank`` is not its writer's (``source``): a rank writes
        only its own evidence, so the line is moved or forged; it counts for nobody (FT111)."""
        src = self.file_source[fi] or {}
        self.report(
            "FT111",
            f"{t} of cell {cell} rank {rank if has_rank else src.get('rank')} written by the process of "
            f"cell {src.get('cell')} rank {src.get('rank')}: evidence only counts from its own writer",
            where=self.where(fi, line),
        )

    def _close_step(self, rec: StepRecord) -> None:
        rec.committed_cells = frozenset(
            c for c, ranks in rec.outcomes.items() if any(o == "committed" for o, _ in ranks.values())
        )
        alive = self.alive(rec.epoch, rec)
        rec.live = alive if alive is not None else frozenset(rec.outcomes)
        deaths = self.deaths  # only a cell that died can be lost: no call for the others
        rec.lost = frozenset(c for c in rec.live if c in deaths and self.cell_lost(c, rec.step))
        self.steps_closed += 1
        if rec.committed:
            self.steps_committed += 1
            self.last_committed = max(self.last_committed, rec.step)
            ro = self.rollouts.get(rec.rollout)
            if ro is not None:
                ro.committed_steps += 1
                if rec.witness is not None:
                    ro.counted_steps += 1
                    tally = ro.tally
                    for i, n in zip(rec.witness[0], rec.witness[1]):
                        tally[i] = tally.get(i, 0) + n
        if rec.outcomes:
            self.recovery.step_closed(rec.t0, rec.committed, rec.attempt, rec.step)
        for rule in self.rules:
            rule.on_step(rec)

    def _close_rollout(self, ro: RolloutRecord) -> None:
        self.recovery.rollout_closed(ro.rollout, ro.deficit())
        for rule in self.rules:
            rule.on_rollout(ro)
