"""Healing, the driver's side: restart failed cells in the background, heal them at a step boundary.

``Healer.restart(cell)`` (called when a cell is marked failed): ``failed -> restarting``, new
actors with ``incarnation + 1`` in a new placement group (``cells.spawn_cell``, on the live
node with the fewest live cells: ``Placer.cell_target``) and their ``init_cell`` started;
nothing waits for them, the survivors keep training.

``Healer.at_boundary(step, wait)`` (called by the coordinator before every step attempt;
``wait`` before the run's last step, see below): for each
restarting cell whose ranks all finished ``init_cell``, ``restarting -> healing`` and, for each
rank position, the donor rank streams its state (``RankWorker.serve_state``: the state codec,
each storage once, over a direct TCP connection rendezvoused through the driver's TCPStore,
``ftkit.train.rank.heal_stream``) into the recipient (``RankWorker.load_state``), which
fingerprints what it holds and compares with the donor's total. Every rank equal:
``healing -> alive`` (the ranks emitted ``heal``); the coordinator then reconfigures with the
cell in the membership. A mismatch: ``healing -> restarting`` with the reason, and the heal is
retried from the next donor (at most ``HEAL_TRIES`` attempts per cell and boundary). Heals run
in rounds: each round pairs every waiting recipient with a *different* live donor and runs
those transfers in parallel (recipients beyond the number of donors wait for the next round);
within a cell, every rank position streams in parallel too. The donor of a failed transfer
is failed when it died or its stream did not end within the collective timeout; otherwise
the recipient is. A recipient that dies or errs is failed again (and
restarted); one that is not placed and started within ``heal_timeout`` is given up
(``stopped``) and the run goes on with fewer cells.

Before the run's last step the coordinator waits for the cells still starting (bounded by
``heal_timeout``): survivors never wait for a restart otherwise, but a run that lost a cell
ends with all its cells where possible, and the last step's fingerprints prove each healed
cell's state (FT107).

Seams: the healer holds the session's ``CellRoster`` (the cells, their book, waiting and
``fail``), a ``spawn`` function that creates a cell's new incarnation, and the placer's
``HealPlacement`` side, all given at construction; it never sees the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ftkit.train.control.cell_state import CellState
from ftkit.train.control.waiting import MARGIN_S, Answers
from ftkit.train.rank.step_types import HealReport

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from ftkit.train.config import TrainConfig
    from ftkit.train.control.cells import Cell
    from ftkit.train.control.roster import CellRoster

#: ``spawn(cell, incarnation, target_node) -> Cell``: a new incarnation's actors, not waited for.
Spawn = Callable[[int, int, "str | None"], "Cell"]


class HealPlacement(Protocol):
    """Where a restarted cell goes, and where it went (``ftkit.train.control.placement.Placer``)."""

    def cell_target(self, cell: int) -> str | None: ...
    def placed_cell(self, cell: int, incarnation: int, placement_group: PlacementGroup | None) -> None: ...


#: Heal attempts per boundary before the cell waits for the next one.
HEAL_TRIES = 3


class Healer:
    """Restarts and heals cells for a ``StepCoordinator`` (see the module docstring)."""

    def __init__(
        self,
        cfg: TrainConfig,
        roster: CellRoster,
        spawn: Spawn,
        store: tuple[str, int],
        placer: HealPlacement | None = None,
        cancel: Callable[[str], None] = lambda key: None,
    ) -> None:
        self.cfg, self.roster, self.spawn, self.store, self.placer = cfg, roster, spawn, store, placer
        self.cancel = cancel  # sets a key in the driver's TCPStore (``_cancel``)
        self.starting: dict[int, tuple[list[Any], float]] = {}  # cell -> (init refs, restart time)
        self.ready: set[int] = set()  # started, not healed yet
        self.attempts: dict[int, int] = {}  # cell -> heal attempts so far (the fault point's attempt)
        self.reports: list[HealReport] = []

    def restart(self, cell: int) -> None:
        """Start a new incarnation of ``cell`` (``failed -> restarting``)."""
        old = self.roster.cells[cell]
        self.roster.book.transition(cell, CellState.restarting, f"restarting as incarnation {old.incarnation + 1}")
        target = self.placer.cell_target(cell) if self.placer is not None else None
        new = self.spawn(cell, old.incarnation + 1, target)
        self.roster.replace(cell, new)
        self.starting[cell] = (new.init(*self.store), self.roster.now())

    def at_boundary(self, step: int, wait: bool = False) -> None:
        """Heal every restarted cell that is ready (see the module docstring); with ``wait``,
        first wait for the cells still starting (each at most until its ``heal_timeout``)."""
        roster = self.roster
        for cell in sorted(self.starting):
            refs, since = self.starting[cell]
            left = since + self.cfg.recovery.heal_timeout - self.roster.now() if wait else 0.0
            ready = roster.ready(refs, max(0.0, left))
            if len(ready) < len(refs):
                if self.roster.now() - since > self.cfg.recovery.heal_timeout:
                    del self.starting[cell]
                    roster.cells[cell].kill()
                    roster.book.transition(
                        cell,
                        CellState.stopped,
                        f"not started within --heal-timeout {self.cfg.recovery.heal_timeout:g}s",
                    )
                continue
            del self.starting[cell]
            problems = [p for p in map(roster.problem, refs) if p is not None]
            if problems:
                roster.book.transition(cell, CellState.failed, f"restart failed: {problems[0][1]}")
                roster.cells[cell].kill()
                self.restart(cell)
                continue
            self.ready.add(cell)
            if self.placer is not None:
                new = roster.cells[cell]
                self.placer.placed_cell(cell, new.incarnation, new.placement_group)
        self._heal_ready(step)

    def _heal_ready(self, step: int) -> None:
        """Heal the ready cells in rounds: each round pairs every waiting recipient with a
        distinct live donor (as far as there are donors) and runs the transfers in parallel;
        a cell gets at most ``HEAL_TRIES`` attempts per boundary."""
        roster, book = self.roster, self.roster.book
        tries = dict.fromkeys(self.ready, 0)
        while True:
            donors = book.alive()
            waiting = [c for c in sorted(self.ready) if tries[c] < HEAL_TRIES]
            if not donors or not waiting:
                return
            pairs = self._pair({c: c + self.attempts.get(c, 0) for c in waiting}, donors)
            serving: dict[int, list[Any]] = {}
            loading: dict[int, list[Any]] = {}
            keys_of: dict[int, list[str]] = {}
            for cell, donor in pairs.items():
                tries[cell] += 1
                attempt = self.attempts.get(cell, 0)
                self.attempts[cell] = attempt + 1
                book.transition(cell, CellState.healing, f"healing from donor cell {donor} (attempt {attempt})")
                inc = roster.cells[cell].incarnation
                keys = [f"heal/c{cell}/i{inc}/a{attempt}/r{r}" for r in range(len(roster.cells[cell].workers))]
                keys_of[cell] = keys
                serving[cell] = roster.cells[donor].serve_state(keys)
                loading[cell] = roster.cells[cell].load_state(keys, donor, book.epoch + 1, step, attempt)
            # one wait per recipient (they all run meanwhile): a large state may stream for longer
            # than the grace one wait gives the others after the first answer. A donor Ray reports
            # dead ends its recipient's wait at once; a recipient found dead calls its donor off.
            answers: dict[int, Answers] = {}
            for c, refs in loading.items():
                answers[c] = roster.wait({c: refs}, self.cfg.recovery.step_timeout, peers=(pairs[c],))
                if answers[c].failed.get(c, "").startswith("dead"):
                    self._cancel(keys_of[c])
            grace = self.cfg.recovery.collective_timeout + MARGIN_S  # a served stream ends within it
            roster.ready([r for refs in serving.values() for r in refs], grace)
            for cell, donor in pairs.items():
                self._settle(cell, donor, step, answers[cell], serving[cell])

    def _cancel(self, keys: list[str]) -> None:
        """Call off the donors' transfers under ``keys`` (``heal_stream.cancel_key``, set in
        the driver's TCPStore through ``cancel``): a donor waiting for a dead recipient returns
        at once instead of at its collective timeout."""
        from ftkit.train.rank.heal_stream import cancel_key

        for key in keys:
            self.cancel(cancel_key(key))

    @staticmethod
    def _pair(offsets: dict[int, int], donors: list[int]) -> dict[int, int]:
        """``{recipient: donor}`` for one round: distinct donors (recipients beyond the
        donors wait for the next round); recipient ``c`` prefers ``donors[offsets[c] % n]``,
        then the ones after it (the offset grows with its heal attempts: a retry goes to the
        next donor)."""
        pairs: dict[int, int] = {}
        for cell, offset in offsets.items():
            if len(pairs) == len(donors):
                break
            k = offset % len(donors)
            pairs[cell] = next(d for d in donors[k:] + donors[:k] if d not in pairs.values())
        return pairs

    def _settle(self, cell: int, donor: int, step: int, answers: Answers, serving: list[object]) -> None:
        """The outcome of one transfer to ``cell`` (see the module docstring)."""
        roster, book = self.roster, self.roster.book
        if cell not in answers.values:
            done = roster.ready(serving, 0.0)
            donor_problems = [p for p in map(roster.problem, done) if p is not None and p[0] == "dead"]
            if donor_problems or len(done) < len(serving):  # the donor failed, not the recipient
                cause = donor_problems[0][1] if donor_problems else "its stream did not end within the deadline"
                book.transition(cell, CellState.restarting, f"donor cell {donor} failed during the heal")
                roster.fail(donor, f"as heal donor: {cause}")
                return
            self.ready.discard(cell)
            cause = answers.failed.get(cell, "heal failed")
            book.transition(cell, CellState.failed, f"heal from donor cell {donor}: {cause}")
            roster.cells[cell].kill()
            self.restart(cell)
            return
        reports: list[HealReport] = answers.values[cell]
        self.reports += reports
        bad = [r for r in reports if not r.accepted]
        if not bad:
            self.ready.discard(cell)
            roster.joined(cell, step)
            book.transition(cell, CellState.alive, f"healed from donor cell {donor}, fingerprints equal")
            return
        r = bad[0]
        book.transition(
            cell,
            CellState.restarting,
            f"heal from donor cell {donor} rejected: rank {r.rank} holds {r.total[:16]}, "
            f"the donor {r.donor_total[:16]}",
        )

    def give_up(self, reason: str = "run end") -> None:
        """At the run's end (or when every cell restarts at once): stop every cell still starting."""
        for cell in sorted(set(self.starting) | self.ready):
            self.roster.cells[cell].kill()
            self.roster.book.transition(cell, CellState.stopped, reason)
        self.starting.clear()
        self.ready.clear()
