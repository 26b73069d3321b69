"""The run's cells as the driver's collaborators see them: ``CellRoster``.

The step coordinator, the healer, the checkpointer and the checkpoint restore all act on the
same thing: the cells of this session (``cells``: index -> ``Cell``), their state machine
(``book``), and how to wait for their answers (``wait`` / ``ready`` / ``problem``, a
``RefWaiter``). Each is given the roster at construction and uses only its methods; none
reaches into another. ``fail(cell, cause)`` is the one way a detected failure is recorded:
``cell_state`` -> failed, the cell killed, its restart queued (``take_restarts``) when cells
are restarted at all, and every other live cell on a node Ray lost failed with it
(``NodeWatch``, the placer). A recovery that restarts every cell starts a new session of
the same roster (``reset``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ftkit.train.control.cell_state import CellBook, CellState
from ftkit.train.control.run_end import RunFailed
from ftkit.train.control.waiting import Answers, Problem, RefWaiter

if TYPE_CHECKING:
    from ftkit.train.control.cells import Cell


class NodeWatch(Protocol):
    """Which nodes hold a cell and which of them Ray lost (``ftkit.train.control.placement.Placer``)."""

    cell_nodes: dict[int, list[str]]

    def dead_nodes(self) -> set[str]: ...
    def address(self, node: str) -> str: ...
    def cells_on(self, nodes: set[str]) -> list[int]: ...


class CellsLost(RunFailed):
    """No live cell is left (exit 1 unless the driver restarts the cells)."""


class CellRoster:
    """The cells of the session (see the module docstring). ``step_timeout`` bounds the
    single-cell calls (``on_first_cell``); ``min_cells`` is ``require_cells``' floor;
    ``restarts``: whether a failed cell is queued for a restart (healing on)."""

    def __init__(
        self,
        book: CellBook,
        cells: dict[int, Cell],
        waiter: RefWaiter,
        sync_log: Callable[[], None],
        *,
        step_timeout: float,
        min_cells: int,
        restarts: bool,
        nodes: NodeWatch | None = None,
        death_notices: bool = False,
    ) -> None:
        self.book, self.cells, self.waiter, self.sync_log = book, cells, waiter, sync_log
        self.step_timeout, self.min_cells, self.restarts, self.nodes = step_timeout, min_cells, restarts, nodes
        self.death_notices = death_notices  # waits probe the cells' ``dead()`` (Ray's actor table)
        self.since: dict[int, int] = dict.fromkeys(cells, 0)  # first step a cell trained in its incarnation
        self._to_restart: list[int] = []

    def reset(self, book: CellBook, cells: dict[int, Cell]) -> None:
        """A new session of every cell (a recovery after all were lost)."""
        self.book, self.cells, self.since, self._to_restart = book, cells, dict.fromkeys(cells, 0), []

    # --- waiting ----------------------------------------------------------------------
    def wait(self, refs: dict[int, list[object]], timeout_s: float, peers: tuple[int, ...] = ()) -> Answers:
        """``RefWaiter.wait``: every cell's answers, never raising for a fault; with death
        notices on, a cell Ray reports dead fails at once, and the wait ends as soon as one of
        ``peers`` (cells the waited-for ones depend on, e.g. a heal's donor) is dead."""
        dead = self._dead if self.death_notices else None
        return self.waiter.wait(refs, timeout_s, dead=dead, peers=peers)

    def _dead(self, cell: int) -> str | None:
        return self.cells[cell].dead() if cell in self.cells else None

    def ready(self, refs: list[object], timeout_s: float) -> list[Any]:
        """``RefWaiter.ready``: the refs that answered within ``timeout_s``."""
        return self.waiter.ready(refs, timeout_s)

    def now(self) -> float:
        """The waiter's clock (monotonic seconds): what deadlines are measured in."""
        return self.waiter.clock()

    def problem(self, ref: object) -> Problem | None:
        """What an answered ref that is not a value means (``None``: a value)."""
        return self.waiter.problem(ref)

    # --- membership -------------------------------------------------------------------
    def alive(self) -> list[int]:
        return self.book.alive()

    def fail(self, cell: int, cause: str) -> None:
        """Record a detected failure (``cell_state`` -> failed), kill the cell, queue its
        restart (``take_restarts``); the other live cells of a lost node fail with it."""
        if self.book.state[cell] in (CellState.failed, CellState.stopped):
            return
        lost = self._lost_nodes(cell)
        if lost and self.nodes is not None:
            cause = f"{cause}; node {', '.join(f'{n[:12]} ({self.nodes.address(n)})' for n in lost)} lost"
        self.book.transition(cell, CellState.failed, cause)
        self.sync_log()
        self.cells[cell].kill()
        if self.restarts and cell not in self._to_restart:
            self._to_restart.append(cell)
        for other in self.nodes.cells_on(set(lost)) if lost and self.nodes is not None else []:
            if self.book.state[other] == CellState.alive:
                self.fail(other, f"node lost with cell {cell}")

    def _lost_nodes(self, cell: int) -> list[str]:
        """The nodes of ``cell`` that Ray no longer lists as alive."""
        if self.nodes is None or cell not in self.nodes.cell_nodes:
            return []
        return sorted(self.nodes.dead_nodes() & set(self.nodes.cell_nodes[cell]))

    def take_restarts(self) -> list[int]:
        """The failed cells queued for a restart since the last call (in failure order)."""
        queued, self._to_restart = self._to_restart, []
        return [c for c in queued if self.book.state[c] == CellState.failed]

    def replace(self, cell: int, new: Cell) -> None:
        """``new`` (a restarted incarnation) takes ``cell``'s place."""
        self.cells[cell] = new

    def joined(self, cell: int, step: int) -> None:
        """``cell`` (healed) trains from ``step`` on: it holds no earlier step of its rollout."""
        self.since[cell] = step

    def require_cells(self) -> None:
        """Raise ``RunFailed`` with fewer live cells than ``min_cells`` (``CellsLost`` when none
        is left: the driver may restart them all, ``ftkit.train.recovery.all_lost``)."""
        alive = self.book.alive()
        if len(alive) < self.min_cells:
            raise (CellsLost if not alive else RunFailed)(
                f"{len(alive)} live cell(s) left, --min-cells is {self.min_cells}",
                hint="the cells' failures are in the event log (cell_state events); lower --min-cells "
                "or find what kills them",
            )

    def on_first_cell(self, what: str, call: Callable[[Cell], list[Any]]) -> list[Any]:
        """``call(cell)`` on the first live cell (its refs' values), failing over to the next
        live cell when it dies. ``what`` names the work in the failure."""
        while True:
            self.require_cells()
            cell = self.book.alive()[0]
            answers = self.wait({cell: call(self.cells[cell])}, self.step_timeout)
            if cell in answers.values:
                return answers.values[cell]
            self.fail(cell, f"during {what}: {answers.failed.get(cell, 'collective error')}")
