"""The step coordinator: runs each optimizer step over the live cells, all-or-nothing, and survives faults.

``StepCoordinator.run_step(rollout, step, batch_ref, dump) -> StepOutcome`` (docs/faults.md):

1. at the step boundary, restarted cells that are ready are healed and the membership is
   reconfigured (``Healer.at_boundary``; before the run's last step it waits for them);
2. phase 1: every rank of every live cell runs ``compute_reduce`` on its micro-shards
   (``microshards.assign`` over the live cells); the driver waits with ``ray.wait`` under a
   deadline (``step_timeout``; once any answer came, a value or a failure, at most
   ``collective_timeout`` more for the rest: a value means every peer passed the same
   collectives, a failure means the attempt is lost anyway) and classifies every answer: a
   ``Reduced``, a dead actor (``RayActorError``), a ``CollectiveError`` (a symptom: the rank
   is alive, a peer is not), another exception (the cell failed), or no answer by the
   deadline (hung: the cell is killed);
3. phase 2: when every live rank reduced and the reduction was finite, ``commit`` on every
   cell; a cell that dies now is marked failed, the others have committed the same state.
   Anything else: ``discard`` on every surviving cell (nothing stepped anywhere), failed
   cells killed, the groups rebuilt under a new epoch (``reconfigure``), the micro-shards
   reassigned, and the step retried with ``attempt + 1`` (a survivor reuses the micro-shard
   gradients it computed in the discarded attempt: ``shard_cache``). Failed cells are
   restarted (``restart_failed``) as soon as the step committed.

Fewer live cells than ``min_cells``, or more than ``max_retries`` failed attempts of one
step, raise ``RunFailed``. A step's result never depends on which cells computed it (exact
reduction, per-micro-shard seeds), so a retry over fewer cells commits the same bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ftkit.train.cell_state import CellBook, CellState
from ftkit.train.cells import Cell
from ftkit.train.run_end import RunFailed, raise_if_interrupted
from ftkit.train.step_types import Committed, Reduced, StepTask

#: Seconds added to every deadline derived from a timeout (scheduling, event fsyncs).
MARGIN_S = 2.0


class CellsLost(RunFailed):
    """No live cell is left (exit 1 unless the driver restarts the cells)."""


@dataclass
class StepOutcome:
    """A committed step (a step that cannot commit raises ``RunFailed`` instead)."""

    rollout: int
    step: int
    attempts: int  # attempts it took (1 without faults)
    loss: float
    grad_norm: float
    tokens: int
    seconds: float  # from the first attempt's start to the commit
    cells_alive: int  # live cells after the step


@dataclass
class Answers:
    """What one wait over several cells' refs found."""

    values: dict[int, list[Any]] = field(default_factory=dict)  # cell -> per-rank results
    failed: dict[int, str] = field(default_factory=dict)  # cell -> cause (dead, hung, exception)
    collective: set[int] = field(default_factory=set)  # cells that saw a collective error

    @property
    def clean(self) -> bool:
        return not self.failed and not self.collective


class StepCoordinator:
    """The live cells of a run and their steps (see the module docstring)."""

    def __init__(self, cfg: Any, book: CellBook, cells: dict[int, Cell], events: Any) -> None:
        self.cfg, self.book, self.cells, self.events = cfg, book, cells, events
        self.members: list[int] = []  # the alive set of the current epoch
        self.since: dict[int, int] = {c: 0 for c in cells}  # first step a cell trained in its incarnation
        self.healer: Any = None  # set by the driver (ftkit.train.healing.Healer)
        self.placer: Any = None  # set by the driver (ftkit.train.placement.Placer)
        self.to_restart: list[int] = []  # failed cells, restarted once the survivors commit

    # --- waiting ----------------------------------------------------------------------
    def wait(self, refs: dict[int, list[Any]], timeout_s: float) -> Answers:
        """Wait for every cell's refs (see the module docstring, step 2); never raises for a fault."""
        import ray

        out = Answers()
        owner = {ref: (c, r) for c, rs in refs.items() for r, ref in enumerate(rs)}
        got: dict[int, dict[int, Any]] = {c: {} for c in refs}
        pending = list(owner)
        start = time.monotonic()
        deadline = start + timeout_s
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, left)) if left > 0 else ([], pending)
            if not ready:
                for ref in pending:
                    cell = owner[ref][0]
                    if cell not in out.failed:
                        out.failed[cell] = f"hung: no answer after {time.monotonic() - start:.1f}s (deadline)"
                break
            for ref in ready:
                cell, rank = owner[ref]
                problem = classify(ref)
                if problem is None:
                    got[cell][rank] = ray.get(ref)
                    # the others passed the same collectives: what is left of their work is short
                    deadline = min(deadline, time.monotonic() + self.cfg.collective_timeout + MARGIN_S)
                    continue
                kind, text = problem
                if kind == "collective":
                    out.collective.add(cell)
                elif cell not in out.failed:
                    out.failed[cell] = f"{kind}: {text}" if rank == 0 else f"{kind} (rank {rank}): {text}"
                # once anything failed, the others get one collective timeout to answer
                deadline = min(deadline, time.monotonic() + self.cfg.collective_timeout + MARGIN_S)
        for cell, ranks in got.items():
            if cell not in out.failed and cell not in out.collective and len(ranks) == len(refs[cell]):
                out.values[cell] = [ranks[r] for r in range(len(refs[cell]))]
        return out

    # --- membership -------------------------------------------------------------------
    def fail(self, cell: int, cause: str) -> None:
        """Record a detected failure (``cell_state`` -> failed), kill the cell, queue its restart
        (``restart_failed``)."""
        if self.book.state[cell] in (CellState.failed, CellState.stopped):
            return
        lost = self._lost_nodes(cell)
        if lost:
            cause = f"{cause}; node {', '.join(f'{n[:12]} ({self.placer.address(n)})' for n in lost)} lost"
        self.book.transition(cell, CellState.failed, cause)
        self.events.sync(wait=False)
        self.cells[cell].kill()
        if self.healer is not None and cell not in self.to_restart:
            self.to_restart.append(cell)
        for other in self.placer.cells_on(set(lost)) if lost else []:
            if self.book.state[other] == CellState.alive:
                self.fail(other, f"node lost with cell {cell}")

    def _lost_nodes(self, cell: int) -> list[str]:
        """The nodes of ``cell`` that Ray no longer lists as alive (a lost node: every cell on
        it is failed before the next reconfigure)."""
        if self.placer is None or cell not in self.placer.cell_nodes:
            return []
        return sorted(self.placer.dead_nodes() & set(self.placer.cell_nodes[cell]))

    def restart_failed(self) -> None:
        """Start the queued restarts (``Healer.restart``). Called once the survivors committed
        the step the cells failed in: a new incarnation's start (process spawn, imports) would
        otherwise compete with the survivors' retry for the same host's CPUs, and the retry
        is what training waits for; the restart itself is not waited for either way."""
        queued, self.to_restart = self.to_restart, []
        for cell in queued:
            if self.book.state[cell] == CellState.failed:
                self.healer.restart(cell)

    def reconfigure(self, reason: str) -> None:
        """Rebuild the cross-cell groups over the alive cells under a new epoch; a member that
        fails to join is failed and the next epoch tried, at most ``max_retries + 1`` times."""
        for _ in range(self.cfg.max_retries + 1):
            self.require_cells()
            before, self.members = self.members, self.book.alive()
            epoch = self.book.next_epoch(reason, before)
            answers = self.wait(
                {c: self.cells[c].configure(epoch, self.members) for c in self.members},
                self.cfg.collective_timeout + MARGIN_S,
            )
            for cell, cause in answers.failed.items():
                self.fail(cell, cause)
            if answers.clean:
                return
            reason = f"epoch {epoch} could not form: {', '.join(answers.failed.values()) or 'collective error'}"
        raise RunFailed(
            f"the cells could not form a group {self.cfg.max_retries + 1} times in a row ({reason})",
            hint="check the cells' connectivity; a heavily loaded machine may need a larger --collective-timeout",
        )

    def require_cells(self) -> None:
        """Raise ``RunFailed`` with fewer live cells than ``min_cells`` (``CellsLost`` when none
        is left: the driver may restart them all, ``ftkit.train.recovery``)."""
        alive = self.book.alive()
        if len(alive) < self.cfg.min_cells:
            raise (CellsLost if not alive else RunFailed)(
                f"{len(alive)} live cell(s) left, --min-cells is {self.cfg.min_cells}",
                hint="the cells' failures are in the event log (cell_state events); lower --min-cells "
                "or find what kills them",
            )

    # --- one step ---------------------------------------------------------------------
    def run_step(self, rollout: int, step: int, batch: Any, dump: bool) -> StepOutcome:
        """Run ``step`` until one attempt commits on every live cell (see the module docstring)."""
        from ftkit.train.microshards import assign

        cfg, t0 = self.cfg, time.perf_counter()
        for attempt in range(cfg.max_retries + 1):
            raise_if_interrupted()  # a signal something swallowed stops the run here at the latest
            if attempt == 0:  # failures since the last commit (outside a step: a weight export)
                self.restart_failed()
            if self.healer is not None:
                self.healer.at_boundary(step, wait=step == cfg.rollouts * cfg.steps_per_rollout - 1)
            if self.members != self.book.alive():
                self.reconfigure("membership changed")
            alive, epoch = self.members, self.book.epoch
            shards = assign(cfg.micro_shards, alive)
            record = dump and bool(cfg.dump_what)
            tasks = {c: StepTask(rollout, step, attempt, epoch, tuple(shards[c]), record, record) for c in alive}
            phase1 = self.wait(
                {c: self.cells[c].compute_reduce(tasks[c], batch) for c in alive},
                cfg.step_timeout,
            )
            reduced: dict[int, list[Reduced]] = phase1.values
            if phase1.clean and all(r.finite for rs in reduced.values() for r in rs):
                committed = self._commit(rollout, step, attempt, alive)
                self.restart_failed()
                if committed is not None:
                    first = reduced[alive[0]][0]
                    return StepOutcome(
                        rollout,
                        step,
                        attempt + 1,
                        first.loss,
                        committed.grad_norm,
                        first.tokens,
                        time.perf_counter() - t0,
                        len(self.book.alive()),
                    )
                continue
            for cell, cause in phase1.failed.items():
                self.fail(cell, cause)
            self._discard(step, attempt)
            if not phase1.clean:
                why = "; ".join(f"cell {c} {cause}" for c, cause in sorted(phase1.failed.items()))
                self.reconfigure(f"step {step} attempt {attempt} failed: {why or 'collective error'}")
        raise RunFailed(
            f"step {step} failed {cfg.max_retries + 1} times (--max-retries {cfg.max_retries})",
            hint="the attempts' failures are in the event log (cell_state, step_outcome); raise --max-retries "
            "or find what keeps failing",
        )

    def _commit(self, rollout: int, step: int, attempt: int, alive: list[int]) -> Committed | None:
        """Phase 2 on every live cell; the first live cell's ``Committed``, or ``None`` when no
        cell survived the commit (every survivor has the same committed state)."""
        writer = self.dump_writer(rollout)
        answers = self.wait(
            {c: self.cells[c].commit(step, attempt, c == writer or self.cfg.dump_cells == "all") for c in alive},
            self.cfg.step_timeout,
        )
        for cell, cause in answers.failed.items():
            self.fail(cell, f"during commit: {cause}")
        done = [c for c in alive if c in answers.values]
        if not done:
            self.require_cells()
            return None
        committed: Committed = answers.values[done[0]][0]
        return committed

    def _discard(self, step: int, attempt: int) -> None:
        """Phase 2 when the attempt cannot commit: every surviving cell drops what it holds."""
        alive = self.book.alive()
        answers = self.wait({c: self.cells[c].discard(step, attempt) for c in alive}, self.cfg.step_timeout)
        for cell, cause in answers.failed.items():
            self.fail(cell, f"during discard: {cause}")

    def dump_writer(self, rollout: int) -> int | None:
        """The live cell that writes rollout ``rollout``'s replicated dump: the first one that
        has trained every step of the rollout (a healed cell missed the earlier ones)."""
        first_step = rollout * self.cfg.steps_per_rollout
        return next((c for c in self.book.alive() if self.since.get(c, 0) <= first_step), None)

    # --- one cell for the whole run ---------------------------------------------------
    def on_first_cell(self, what: str, call: Any) -> list[Any]:
        """``call(cell)`` on the first live cell (its refs' values), failing over to the next
        live cell when it dies. ``what`` names the work in the failure."""
        while True:
            self.require_cells()
            cell = self.book.alive()[0]
            answers = self.wait({cell: call(self.cells[cell])}, self.cfg.step_timeout)
            if cell in answers.values:
                return answers.values[cell]
            self.fail(cell, f"during {what}: {answers.failed.get(cell, 'collective error')}")


def classify(ref: Any) -> tuple[str, str] | None:
    """``None`` when ``ref`` holds a value; else ``(kind, text)``: kind ``dead``,
    ``collective`` or ``exception``."""
    import ray

    from ftkit.train.crosscell import CollectiveError

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as exc:
        return "dead", f"the actor died ({type(exc).__name__}: {_first_line(exc)})"
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
        if isinstance(cause, CollectiveError):
            return "collective", str(cause)
        return "exception", f"{type(cause).__name__}: {_first_line(cause)}"
    except ray.exceptions.RayError as exc:
        return "dead", f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__
