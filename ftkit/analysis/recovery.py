"""The recovery table: one row per fault, injected or not, filled in as the replay goes on.

A row is a ``fault_injected``, or a failure the driver detected that no injected fault explains
(``injected`` false, ``kind`` ``detected``, ``cause`` the driver's reason): a cell declared failed
(``cell_state`` -> failed / errored) or an engine declared failed (``engine_failed``) that is not
the detection of an earlier, not yet explained injected fault of that cell (of a kind that can
fail a cell: not in ``NEVER_FAILS_A_CELL``) or engine. So an outside kill, a hang nobody
injected, or a healthy cell failed by mistake is in the table and FT113 checks that the run
recovered from it.

- ``detect_s``: first sign of the fault after it struck: the faulted cell turned ``errored``, any
  step attempt ``failed`` / ``discarded``, or a ``grad_nonfinite``;
- ``reconfigure_s``: the first ``reconfigure`` after it;
- ``next_commit_s``: the first committed step (any cell's ``step_outcome`` committed) after it:
  how long training stood still;
- ``heal_s``: the first ``heal`` of the faulted cell after it; ``heal_bytes``: the bytes that
  heal moved (every rank of the cell, the ``heal`` events of the same cell and epoch);
- ``steps_discarded``: step attempts committed by no cell, attributed to the latest fault
  before them;
- ``samples_lost``: witness deficit (allocated ids counted fewer times than expected) of the
  fault's rollout; ``None`` while the rollout is open or has no witness evidence. Must be 0. A
  detected row's rollout is the one open when the driver declared the failure, else the next
  one to open (a failure between rollouts strikes the next one's samples);
- ``recovered_by``: ``reconfigure``, ``heal`` or ``retry`` (a later attempt of a step committed
  after the fault), whichever came first; ``absorbed`` for a fault that fails nothing by design
  (``slow``, in ``ABSORBABLE``) when its step committed anyway; for a fault at a checkpoint publication point
  (``publish_*``), ``rejected`` or ``published``: the publication ended and training went on;
  ``run end`` for a failure the driver detected (not injected) after the run's last activity
  (its last committed step's ``metric`` and its last ``weights_sent``) in a run that then
  finished ``completed``: a process that died after its last use, found when the driver flushed
  the logs at the end; the run owed it nothing more. ``None`` means unrecovered (FT113).

A fault that struck an inference engine (``engine`` set) is the engine's alone: detected by the
driver's ``engine_failed`` for that engine, recovered by that engine's ``engine_restart`` (the
replacement loaded the weights), or ``absorbed`` (``slow``) by the next committed step; the
cells' signs (a failed cell, a discarded attempt, a reconfigure, a heal, a retry) neither
detect nor recover it.

All times are seconds after the fault's own ``time``. Memory is one row per fault.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class FaultRow:
    index: int
    kind: str
    point: str
    cell: int | None
    rank: int | None
    rollout: int | None
    step: int | None
    time: float
    where: tuple[str, int] = field(repr=False)
    engine: int | None = None
    injected: bool = True
    cause: str | None = None
    detect_s: float | None = None
    reconfigure_s: float | None = None
    next_commit_s: float | None = None
    heal_s: float | None = None
    heal_bytes: int | None = None
    steps_discarded: int = 0
    samples_lost: int | None = None
    recovered_by: str | None = None
    explained: bool = field(default=False, repr=False)  # an injected row whose cell / engine failure was seen

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("where")
        d.pop("explained")
        d["file"], d["line"] = self.where
        return d


#: Fault kinds that only delay work: a run recovers from one when its step commits anyway.
ABSORBABLE = frozenset({"slow"})
#: Injected kinds that never fail a cell by design (the cells agree on a non-finite gradient, discard
#: and retry): a cell failure after one of them is not its detection. Any other kind, ftkit's or
#: another producer's, is taken to be detected by the next failure of its cell.
NEVER_FAILS_A_CELL = frozenset({"nan-grad"})
#: Ways of recovering that end a fault's story: it waits no longer for a reconfigure or a heal (a
#: nan-grad's retried step once took the reconfigure and heal of the next fault on its cell).
SETTLED = frozenset({"retry", "absorbed"})


class RecoveryTracker:
    """Fills the rows in; each update touches only the rows still waiting for it, so a long run
    with many faults stays linear."""

    def __init__(self) -> None:
        self.rows: list[FaultRow] = []
        self._times: list[float] = []
        self._waiting: dict[str, list[FaultRow]] = {
            "detect": [],
            "reconfigure": [],
            "commit": [],
            "heal": [],
            "recover": [],
        }
        self._heals: dict[tuple[int, int | None], list[FaultRow]] = {}  # (cell, epoch) -> rows it healed
        self._by_rollout: dict[int | None, list[FaultRow]] = {}
        self._next_rollout: list[FaultRow] = []  # detected rows struck between rollouts
        self._last_activity = float("-inf")  # the driver's last step metric or weight sync

    def activity(self, t: float) -> None:
        """The driver declared a step trained (``metric``) or sent weights (``weights_sent``) at ``t``."""
        if t > self._last_activity:
            self._last_activity = t

    def run_completed(self) -> None:
        """The run finished ``completed``: the detected failures after its last activity are
        recovered by ``run end`` (module docstring)."""
        self._recovered(
            [r for r in self._waiting["recover"] if not r.injected and r.time > self._last_activity], "run end"
        )

    def fault(self, ev: dict[str, Any], where: tuple[str, int]) -> None:
        self._add(
            FaultRow(
                len(self.rows),
                ev["kind"],
                ev["point"],
                ev.get("cell"),
                ev.get("rank"),
                ev.get("rollout"),
                ev.get("step"),
                float(ev["time"]),
                where,
                ev.get("engine"),
            )
        )

    def _add(self, row: FaultRow) -> None:
        self.rows.append(row)
        self._times.append(max(row.time, self._times[-1]) if self._times else row.time)
        for what, waiting in self._waiting.items():
            if (row.engine is None or what not in ("reconfigure", "heal")) and (row.injected or what != "detect"):
                waiting.append(row)
        self._by_rollout.setdefault(row.rollout, []).append(row)

    def cell_failed(self, t: float, cell: int, cause: str, where: tuple[str, int], rollout: int | None) -> None:
        """The driver declared ``cell`` failed at ``t`` for ``cause`` while ``rollout`` was open
        (``None``: between rollouts): the detection of the latest injected fault of that cell that
        fails cells and is not explained yet, else a row of its own."""
        self.detected(t, cell)
        for r in reversed(self.rows):
            if (
                r.injected
                and not r.explained
                and r.engine is None
                and r.kind not in NEVER_FAILS_A_CELL
                and r.cell in (None, cell)
                and r.time <= t
                and r.recovered_by is None
            ):
                r.explained = True
                return
        row = FaultRow(len(self.rows), "detected", "", cell, None, rollout, None, t, where, None, False, cause, 0.0)
        self._add(row)
        if rollout is None:
            self._next_rollout.append(row)

    def rollout_opened(self, rollout: int) -> None:
        """The first evidence of ``rollout`` (its allocation): the detected rows struck between
        rollouts are its."""
        for row in self._next_rollout:
            self._by_rollout[None].remove(row)
            row.rollout = rollout
            self._by_rollout.setdefault(rollout, []).append(row)
        self._next_rollout.clear()

    def engine_failed(self, t: float, engine: int, cause: str, where: tuple[str, int]) -> None:
        """The driver found ``engine`` failed at ``t`` (``engine_failed``): the detection of the
        engine's latest unexplained injected fault, else a row of its own."""
        if self._waiting["detect"]:
            for r in self._take("detect", t, lambda r: r.engine == engine):
                r.detect_s = t - r.time
        for r in reversed(self.rows):
            if r.injected and not r.explained and r.engine == engine and r.time <= t and r.recovered_by is None:
                r.explained = True
                return
        self._add(FaultRow(len(self.rows), "detected", "", None, None, None, None, t, where, engine, False, cause, 0.0))

    def _take(self, what: str, t: float, match: Callable[[FaultRow], bool] = lambda r: True) -> list[FaultRow]:
        """Rows waiting for ``what`` that struck at or before ``t`` and ``match``; no longer waiting."""
        waiting = self._waiting[what]
        taken = [r for r in waiting if r.time <= t and match(r)]
        if taken:
            self._waiting[what] = [r for r in waiting if r not in taken]
        return taken

    def _recovered(self, rows: list[FaultRow], how: str) -> None:
        for r in rows:
            if r.recovered_by is None:
                r.recovered_by = how
        self._waiting["recover"] = [r for r in self._waiting["recover"] if r.recovered_by is None]
        if how in SETTLED and rows:
            for what in ("reconfigure", "heal"):
                self._waiting[what] = [r for r in self._waiting[what] if r not in rows]

    def detected(self, t: float, cell: int | None = None) -> None:
        """A failure sign of the cells at ``t`` (for ``cell`` when it names one)."""
        if self._waiting["detect"]:
            for r in self._take(
                "detect", t, lambda r: r.engine is None and (cell is None or r.cell is None or r.cell == cell)
            ):
                r.detect_s = t - r.time

    def engine_restarted(self, t: float, engine: int) -> None:
        """A replacement of ``engine`` started at ``t`` (``engine_restart``)."""
        self._recovered([r for r in self._waiting["recover"] if r.engine == engine and r.time <= t], "engine_restart")

    def reconfigured(self, t: float) -> None:
        rows = self._take("reconfigure", t)
        for r in rows:
            r.reconfigure_s = t - r.time
        self._recovered(rows, "reconfigure")

    def committed(self, t: float) -> None:
        """A committed ``step_outcome`` at ``t``."""
        if self._waiting["commit"]:
            for r in self._take("commit", t, lambda r: r.time < t):
                r.next_commit_s = t - r.time
                if r.engine is not None and r.kind in ABSORBABLE:
                    self._recovered([r], "absorbed")

    def healed(self, t: float, cell: int, nbytes: int | None = None, epoch: int | None = None) -> None:
        """A rank of ``cell`` logged ``heal`` at ``t`` (``nbytes`` moved, joining ``epoch``)."""
        rows = self._take("heal", t, lambda r: r.cell is None or r.cell == cell)
        for r in rows:
            r.heal_s = t - r.time
        self._recovered(rows, "heal")
        if rows:
            self._heals[(cell, epoch)] = rows
        if nbytes is not None:
            for r in self._heals.get((cell, epoch), ()):
                r.heal_bytes = (r.heal_bytes or 0) + nbytes

    def checkpoint_closed(self, t: float, how: str) -> None:
        """A checkpoint publication ended at ``t`` (``how``: rejected / published): it recovers
        the faults struck at its ``publish_*`` points before it."""
        rows = [r for r in self._waiting["recover"] if r.time <= t and r.point.startswith("publish_")]
        self._recovered(rows, how)

    def step_closed(self, t0: float, committed: bool, attempt: int, step: int | None = None) -> None:
        """Attempt ``attempt`` of step ``step``, started at ``t0``, closed."""
        if committed and step is not None and self._waiting["recover"]:
            self._recovered(
                [r for r in self._waiting["recover"] if r.kind in ABSORBABLE and r.step == step], "absorbed"
            )
        n = bisect_right(self._times, t0)
        if not n:
            return
        if not committed:
            self.rows[n - 1].steps_discarded += 1
        elif attempt > 0 and self._waiting["recover"]:
            self._recovered([r for r in self._waiting["recover"] if r.time <= t0 and r.engine is None], "retry")

    def rollout_closed(self, rollout: int, deficit: int | None) -> None:
        for r in self._by_rollout.get(rollout, ()):
            r.samples_lost = deficit

    def table(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rows]
