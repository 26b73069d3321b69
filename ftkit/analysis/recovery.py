"""The recovery table: one row per ``fault_injected``, filled in as the replay goes on.

- ``detect_s``: first sign of the fault after it struck: the faulted cell turned ``errored``, any
  step attempt ``failed`` / ``discarded``, or a ``grad_nonfinite``;
- ``reconfigure_s``: the first ``reconfigure`` after it;
- ``heal_s``: the first ``heal`` of the faulted cell after it;
- ``steps_discarded``: step attempts committed by no cell, attributed to the latest fault
  before them;
- ``samples_lost``: witness deficit (allocated ids counted fewer times than expected) of the
  fault's rollout; ``None`` while the rollout is open or has no witness evidence. Must be 0;
- ``recovered_by``: ``reconfigure``, ``heal`` or ``retry`` (a later attempt of a step committed
  after the fault), whichever came first; ``None`` means unrecovered (FT113).

All times are seconds after the fault's own ``time``. Memory is one row per fault.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class FaultRow:
    index: int
    kind: str
    point: str
    cell: Optional[int]
    rank: Optional[int]
    rollout: Optional[int]
    step: Optional[int]
    time: float
    where: tuple[str, int] = field(repr=False)
    detect_s: Optional[float] = None
    reconfigure_s: Optional[float] = None
    heal_s: Optional[float] = None
    steps_discarded: int = 0
    samples_lost: Optional[int] = None
    recovered_by: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("where")
        d["file"], d["line"] = self.where
        return d


class RecoveryTracker:
    def __init__(self) -> None:
        self.rows: list[FaultRow] = []

    def fault(self, ev: dict[str, Any], where: tuple[str, int]) -> None:
        self.rows.append(FaultRow(len(self.rows), ev["kind"], ev["point"], ev.get("cell"), ev.get("rank"),
                                  ev.get("rollout"), ev.get("step"), float(ev["time"]), where))

    def _after(self, t: float) -> list[FaultRow]:
        return [r for r in self.rows if r.time <= t]

    def _recovered(self, row: FaultRow, how: str) -> None:
        if row.recovered_by is None:
            row.recovered_by = how

    def detected(self, t: float, cell: Optional[int] = None) -> None:
        """A failure sign at ``t`` (for ``cell`` when it names one)."""
        for r in self._after(t):
            if r.detect_s is None and (cell is None or r.cell is None or r.cell == cell):
                r.detect_s = t - r.time

    def reconfigured(self, t: float) -> None:
        for r in self._after(t):
            if r.reconfigure_s is None:
                r.reconfigure_s = t - r.time
                self._recovered(r, "reconfigure")

    def healed(self, t: float, cell: int) -> None:
        for r in self._after(t):
            if r.heal_s is None and (r.cell is None or r.cell == cell):
                r.heal_s = t - r.time
                self._recovered(r, "heal")

    def step_closed(self, t0: float, committed: bool, attempt: int) -> None:
        """A step attempt that started at ``t0`` closed."""
        before = self._after(t0)
        if not before:
            return
        if not committed:
            before[-1].steps_discarded += 1
        elif attempt > 0:
            for r in before:
                self._recovered(r, "retry")

    def rollout_closed(self, rollout: int, deficit: Optional[int]) -> None:
        for r in self.rows:
            if r.rollout == rollout:
                r.samples_lost = deficit

    def table(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rows]
