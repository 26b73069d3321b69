"""``CellSession``: the run's cells, as the driver starts, joins and stops them.

One ``CellSession`` per run holds the placer, the ``CellRoster`` (the cells of the current
session, ``ftkit.train.control.roster``), and the session's ``StepCoordinator`` and ``Healer``.
``spawn(targets, epoch, incarnation)`` makes a new cell book (from ``epoch``), the cells'
actors (``incarnation``, on ``targets``), the coordinator and the healer (none with
``--no-heal``), each given what it uses at construction; ``join(cells)`` runs ``init_cell`` on
every cell and forms the session's first membership; ``stop(reason, flush_s)`` flushes the live
cells' logs and kills every cell; ``export_weights(version, fmt)`` has the first live cell
export the weights for the engines (their fingerprints fetched, the tensors left in Ray's object
store). A recovery after every cell was lost (``Driver._recover``) spawns and joins again: the
roster starts a new session of cells, coordinator and healer are new (their attempt counts start
over, as in a new process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ftkit.train.config import STARTUP_TIMEOUT_S

if TYPE_CHECKING:
    from ftkit.engines.protocol import WeightsFormat
    from ftkit.events.writer import EventWriter
    from ftkit.evidence.emit import EventSink
    from ftkit.train.control.cells import Cell
    from ftkit.train.control.coordinator import StepCoordinator
    from ftkit.train.control.healing import Healer
    from ftkit.train.control.placement import Placer
    from ftkit.train.control.roster import CellRoster
    from ftkit.train.plan.run_plan import RunPlan


class CellSession:
    """The cells of a run (see the module docstring)."""

    def __init__(
        self,
        plan: RunPlan,
        run_dir: str,
        store: tuple[str, int],
        placer: Placer,
        events: EventWriter,
        cell_log: EventSink,
        store_set: Callable[[str, str], None] = lambda key, value: None,
    ) -> None:
        self.plan, self.cfg = plan, plan.config
        self.run_dir, self.store, self.placer = run_dir, store, placer
        self.store_set = store_set  # sets a key in the driver's TCPStore (a heal called off)
        self.events, self.cell_log = events, cell_log  # cell_log: the cell books' (events, teed to the live view)
        self._roster: CellRoster | None = None
        self._coord: StepCoordinator | None = None
        self.healer: Healer | None = None

    @property
    def roster(self) -> CellRoster:
        assert self._roster is not None, "no cells spawned yet"
        return self._roster

    @property
    def coord(self) -> StepCoordinator:
        assert self._coord is not None, "no cells spawned yet"
        return self._coord

    def export_weights(self, version: int, fmt: WeightsFormat | None) -> tuple[Any, str, dict[str, str]]:
        """``(object ref, total, {name: fingerprint})`` of weights ``version`` exported by the first
        live cell in the engines' format ``fmt`` (``RankWorker.export_weights``), failing over to
        the next live cell when it dies. The tensors stay in Ray's object store, owned by the
        driver, which fetches only the fingerprints (docs/engines.md, "The weight sync's path")."""
        assert fmt is not None, "the engines are not ready"
        tensors: list[Any] = []

        def export(cell: Cell) -> list[Any]:
            sent, ref = cell.export_weights(version, fmt)
            tensors[:] = [ref]  # the answering cell's: on_first_cell returns after its last call
            return sent

        sent = self.roster.on_first_cell("the weights export", export)[0]
        return tensors[0], sent["total"], sent["params"]

    def spawn(self, targets: dict[int, str | None], epoch: int, incarnation: int) -> list[Cell]:
        """A new cell book, the cells' actors, the coordinator and the healer; returns the
        cells (not started yet)."""
        from ftkit.train.control.cell_state import CellBook, CellState
        from ftkit.train.control.cells import start_cells
        from ftkit.train.control.coordinator import StepCoordinator
        from ftkit.train.control.healing import Healer
        from ftkit.train.control.roster import CellRoster
        from ftkit.train.control.waiting import RefWaiter

        cfg, r = self.cfg, self.cfg.recovery
        indices = list(range(cfg.cluster.cells))
        book = CellBook(cfg.cluster.cells, self.cell_log)
        book.epoch = epoch  # a resumed or restarted session goes on from the earlier epochs
        for c in indices:
            book.transition(c, CellState.starting, "run start")
        cells = start_cells(self.plan, self.run_dir, indices, cfg.layout.ranks, incarnation, targets)
        for cell in cells:
            self.placer.placed_cell(cell.index, cell.incarnation, cell.placement_group)
        by_index = {cell.index: cell for cell in cells}
        if self._roster is None:
            self._roster = CellRoster(
                book,
                by_index,
                RefWaiter(r.collective_timeout),
                lambda: self.events.sync(wait=False),
                step_timeout=r.step_timeout,
                min_cells=r.min_cells,
                restarts=r.heal,
                nodes=self.placer,
                death_notices=True,
            )
        else:
            self._roster.reset(book, by_index)
        spawn = partial(_spawn, self.plan, self.run_dir)

        def cancel(key: str) -> None:
            self.store_set(key, "1")

        self.healer = Healer(cfg, self._roster, spawn, self.store, self.placer, cancel) if r.heal else None
        self._coord = StepCoordinator(cfg, self._roster, self.healer)
        return cells

    def join(self, cells: list[Cell]) -> None:
        """``init_cell`` on every cell, then the first membership of the session."""
        from ftkit.train.control.cell_state import CellState

        roster = self.roster
        answers = roster.wait({cell.index: cell.init(*self.store) for cell in cells}, STARTUP_TIMEOUT_S)
        for cell in cells:
            if cell.index in answers.values:
                roster.book.transition(cell.index, CellState.alive, "started")
        for c, cause in answers.failed.items():
            roster.fail(c, f"at start: {cause}")
        self.coord.reconfigure("run start")

    def stop(self, reason: str, flush_s: float, release: bool = True) -> None:
        """Flush the live cells' event logs (at most ``flush_s``), kill every cell (releasing its
        placement group unless ``release`` is false), and move each cell that is not stopped to
        ``stopped`` with ``reason``. A live cell whose flush fails (a rank that died after the
        last step, or does not answer) is declared ``failed`` first: its log ends without
        ``log_closed``, and the analyzer excuses only a declared death. After a signal (the run
        ends ``interrupted``) only a flush call that raised declares its cell failed (a rank
        that died just before the signal: these calls are made after it was handled, so it did
        not cut them); one that did not answer within ``flush_s`` is only stopped."""
        from ftkit.train.control.cell_state import CellState
        from ftkit.train.control.run_end import pending_interruption

        if self._roster is None:  # nothing was spawned
            return
        roster = self._roster
        if self.healer is not None:
            self.healer.give_up(reason)
        from ftkit.train.control.waiting import NOT_FLUSHED, failed_flushes

        live = {c: cell for c, cell in roster.cells.items() if roster.book.state[c] == CellState.alive}
        failed: dict[int, str] = {}
        with contextlib.suppress(Exception):  # Ray itself gone: nothing can be told apart
            failed = failed_flushes({c: cell.shutdown() for c, cell in live.items()}, flush_s)
        signalled = pending_interruption() is not None
        for c, cause in sorted(failed.items()):
            if not signalled:
                roster.fail(c, f"at {reason}: {cause}")
            elif not cause.startswith(NOT_FLUSHED):
                roster.book.transition(c, CellState.failed, f"at {reason}: {cause}", after_signal=True)
        for cell in roster.cells.values():
            cell.kill(release_group=release)
        left = (CellState.starting, CellState.alive, CellState.failed, CellState.restarting, CellState.healing)
        for c in roster.book.in_state(*left):
            roster.book.transition(c, CellState.stopped, reason)


def _spawn(plan: RunPlan, run_dir: str, cell: int, incarnation: int, target: str | None) -> Cell:
    """A restarted cell's new incarnation (``Healer``'s ``spawn``: ``ftkit.train.control.cells.spawn_cell``)."""
    from ftkit.train.control.cells import spawn_cell

    return spawn_cell(plan, run_dir, cell, plan.config.layout.ranks, incarnation, target)
