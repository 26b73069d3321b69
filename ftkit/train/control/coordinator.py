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
   deadline (hung: the cell is killed; but a cell still waiting after a peer failed, or found
   dead by Ray's death notice, is blocked on that peer and not failed);
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

Seams: the coordinator acts on the cells only through its ``CellRoster``
(``ftkit.train.control.roster``: wait, fail, the book) and heals only through the ``Healing`` it is
given at construction (``ftkit.train.control.healing.Healer``, or none with ``--no-heal``); the healer
holds the same roster, never the coordinator. ``tests/train/test_coordinator.py`` runs it over
fake cells without Ray.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ftkit.train.control.results import StepOutcome
from ftkit.train.control.roster import CellRoster, CellsLost
from ftkit.train.control.run_end import RunFailed, raise_if_interrupted
from ftkit.train.control.waiting import MARGIN_S
from ftkit.train.rank.step_types import Committed, Reduced, StepTask

if TYPE_CHECKING:
    from ftkit.train.config import TrainConfig

__all__ = ["CellsLost", "Healing", "StepCoordinator", "StepOutcome"]


class Healing(Protocol):
    """What the coordinator asks of the healer (``ftkit.train.control.healing.Healer``)."""

    def restart(self, cell: int) -> None:
        """Start a new incarnation of failed ``cell``; nothing waits for it."""

    def at_boundary(self, step: int, wait: bool = False) -> None:
        """Heal the restarted cells that are ready before ``step`` (``wait``: the last step)."""

    def give_up(self, reason: str = "run end") -> None:
        """Stop every cell still starting or waiting to be healed."""


class StepCoordinator:
    """The steps of a run over the cells of ``roster`` (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, roster: CellRoster, healer: Healing | None) -> None:
        self.cfg, self.roster, self.healer = cfg, roster, healer
        self.members: list[int] = []  # the alive set of the current epoch

    # --- membership -------------------------------------------------------------------
    def restart_failed(self) -> None:
        """Start the queued restarts (``Healing.restart``). Called once the survivors committed
        the step the cells failed in: a new incarnation's start (process spawn, imports) would
        otherwise compete with the survivors' retry for the same host's CPUs, and the retry
        is what training waits for; the restart itself is not waited for either way."""
        for cell in self.roster.take_restarts():
            if self.healer is not None:
                self.healer.restart(cell)

    def reconfigure(self, reason: str) -> None:
        """Rebuild the cross-cell groups over the alive cells under a new epoch; a member that
        fails to join is failed and the next epoch tried, at most ``max_retries + 1`` times."""
        roster, retries = self.roster, self.cfg.recovery.max_retries
        for _ in range(retries + 1):
            roster.require_cells()
            before, self.members = self.members, roster.alive()
            epoch = roster.book.next_epoch(reason, before)
            answers = roster.wait(
                {c: roster.cells[c].configure(epoch, self.members) for c in self.members},
                self.cfg.recovery.collective_timeout + MARGIN_S,
            )
            for cell, cause in answers.failed.items():
                roster.fail(cell, cause)
            if answers.clean:
                return
            reason = f"epoch {epoch} could not form: {', '.join(answers.failed.values()) or 'collective error'}"
        raise RunFailed(
            f"the cells could not form a group {retries + 1} times in a row ({reason})",
            hint="check the cells' connectivity; a heavily loaded machine may need a larger --collective-timeout",
        )

    # --- one step ---------------------------------------------------------------------
    def run_step(self, rollout: int, step: int, batch: Any, dump: bool) -> StepOutcome:
        """Run ``step`` until one attempt commits on every live cell (see the module docstring)."""
        from ftkit.evidence.phases import PhaseTimer
        from ftkit.train.control.step_clock import attempt_phases, shard_seconds
        from ftkit.train.rl.microshards import assign

        cfg, roster, t0, clock = self.cfg, self.roster, time.perf_counter(), PhaseTimer()
        for attempt in range(cfg.recovery.max_retries + 1):
            clock.mark()
            raise_if_interrupted()  # a signal something swallowed stops the run here at the latest
            if attempt == 0:  # failures since the last commit (outside a step: a weight export)
                self.restart_failed()
            if self.healer is not None:
                self.healer.at_boundary(step, wait=step == cfg.total_steps - 1)
            if self.members != roster.alive():
                self.reconfigure("membership changed")
            clock.lap("membership")
            alive, epoch = self.members, roster.book.epoch
            shards = assign(cfg.batch.micro_shards, alive)
            record = dump and bool(cfg.dumps.what)
            tasks = {c: StepTask(rollout, step, attempt, epoch, tuple(shards[c]), record, record) for c in alive}
            phase1 = roster.wait(
                {c: roster.cells[c].compute_reduce(tasks[c], batch) for c in alive}, cfg.recovery.step_timeout
            )
            reduced: dict[int, list[Reduced]] = phase1.values
            wait1 = clock.lap(None)
            if phase1.clean and all(r.finite for rs in reduced.values() for r in rs):
                committed = self._commit(rollout, step, attempt, alive)
                wait2 = clock.lap(None)
                self.restart_failed()
                clock.lap("membership")
                if committed is not None:
                    first = reduced[alive[0]][0]
                    seconds = time.perf_counter() - t0
                    cells_alive = len(roster.alive())
                    phases = attempt_phases(clock.seconds, (wait1, first), (wait2, committed))
                    return StepOutcome(
                        rollout, step, attempt + 1, first.loss, committed.grad_norm, first.tokens, seconds,
                        cells_alive, phases, shard_seconds(reduced, cfg.batch.micro_shards), dict(first.metrics),
                    )  # fmt: skip
                clock.add("retry", wait1 + wait2)
                continue
            for cell, cause in phase1.failed.items():
                roster.fail(cell, cause)
            self._discard(step, attempt)
            if not phase1.clean:
                why = "; ".join(
                    [f"cell {c} {cause}" for c, cause in sorted(phase1.failed.items())]
                    + [f"cell {c} blocked on dead peer {peer}" for c, peer in sorted(phase1.blocked.items())]
                )
                self.reconfigure(f"step {step} attempt {attempt} failed: {why or 'collective error'}")
            clock.add("retry", wait1 + clock.lap(None))
        raise RunFailed(
            f"step {step} failed {cfg.recovery.max_retries + 1} times (--max-retries {cfg.recovery.max_retries})",
            hint="the attempts' failures are in the event log (cell_state, step_outcome); raise --max-retries "
            "or find what keeps failing",
        )

    def _commit(self, rollout: int, step: int, attempt: int, alive: list[int]) -> Committed | None:
        """Phase 2 on every live cell; the first live cell's ``Committed``, or ``None`` when no
        cell survived the commit (every survivor has the same committed state)."""
        roster, writer = self.roster, self.dump_writer(rollout)
        every = self.cfg.dumps.cells == "all"
        answers = roster.wait(
            {c: roster.cells[c].commit(step, attempt, c == writer or every) for c in alive},
            self.cfg.recovery.step_timeout,
        )
        for cell, cause in answers.failed.items():
            roster.fail(cell, f"during commit: {cause}")
        done = [c for c in alive if c in answers.values]
        if not done:
            roster.require_cells()
            return None
        committed: Committed = answers.values[done[0]][0]
        return committed

    def _discard(self, step: int, attempt: int) -> None:
        """Phase 2 when the attempt cannot commit: every surviving cell drops what it holds."""
        roster = self.roster
        refs = {c: roster.cells[c].discard(step, attempt) for c in roster.alive()}
        for cell, cause in roster.wait(refs, self.cfg.recovery.step_timeout).failed.items():
            roster.fail(cell, f"during discard: {cause}")

    def dump_writer(self, rollout: int) -> int | None:
        """The live cell that writes rollout ``rollout``'s replicated dump: the first one that
        has trained every step of the rollout (a healed cell missed the earlier ones)."""
        first_step = rollout * self.cfg.batch.steps_per_rollout
        return next((c for c in self.roster.alive() if self.roster.since.get(c, 0) <= first_step), None)
