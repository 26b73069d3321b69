"""Checkpoints of a training run: the driver's side of ``ftkit.checkpoint`` (docs/checkpoints.md).

At the end of every ``checkpoint_every``-th rollout (``due``), ``publish``:

1. asks every rank of every live cell for its preflight (``RankWorker.checkpoint_preflight``:
   consumes the rank's non-finite guard, checks disk space and the target; no collective), under
   the step deadline; a cell that does not answer fails (the coordinator handles it like any
   failure) and counts as a failed verdict;
2. ``agree``: one failing rank means nobody serialises; the publication is rejected with every
   reason (``checkpoint_rejected``) and training goes on;
3. otherwise publishes (``Publisher``: write, scan, manifest, rename, journal, retention,
   ``latest``), its write phase done by rank 0 of the first live cell (``write_checkpoint``,
   collective inside the cell: parameters, optimizer moments and steps gathered to the TP=1/PP=1
   layout, counters, witness table, every rank's logged fingerprint total and its
   ``rank_spec``, written straight into the staging directory), which sends back only the files'
   records: the state never reaches this process. A write error (ENOSPC) comes back as a value
   and rejects the publication; a cell that dies while it writes is failed and the next live
   cell writes the same state again (it is the same on every cell).

The checkpoint's step is the rollout's last step. Its metric (``--best-metric``) is the
rollout's mean reward, or with ``eval_reward`` the mean reward of the run's eval set
(``RlTask.eval_set``: the ``--eval-prompts`` file, else the task's fixed held-out prompts)
answered by greedy decoding on the engines, which hold exactly the checkpoint's weights at that
moment; it is computed at every boundary (also with ``--eval-prompts`` and ``--best-metric
reward``: logged, not ranked) and logged as a ``metric`` event (``values: {"eval_reward": ...}``);
a non-finite logit makes it NaN, which retention never ranks best. The publication fault points
run here (the publisher is the driver; ``publish_write`` fires before the rank is asked to write),
except ``publish_preflight``, which every rank runs. Any layout is checkpointed:
the checkpoint holds the TP=1/PP=1 state, its manifest ``rank_totals`` every rank's total
(``{rank: total}``) and ``meta.json`` ``ranks`` every rank's spec, from which
``verify-checkpoint`` recomputes each total from the stored tensors
(``ftkit.checkpoint.rank_totals``) before comparing them with the event log.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ftkit.evidence.emit as emit
from ftkit.checkpoint.publish import Outcome
from ftkit.train.control.rundir import run_name

if TYPE_CHECKING:
    from ftkit.events.writer import EventWriter
    from ftkit.tasks.protocols import RlTask
    from ftkit.train.config import TrainConfig
    from ftkit.train.control.engine_pool import EnginePool
    from ftkit.train.control.roster import CellRoster
    from ftkit.train.faults.spec import FaultSpec


class RunCheckpoints:
    """Publication of checkpoints for one run (``enabled`` when ``checkpoint_every > 0``)."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        roster: CellRoster,
        events: EventWriter,
        engines: EnginePool,
        task: RlTask,
        faults: Sequence[FaultSpec],
    ) -> None:
        from ftkit.checkpoint.publish import Publisher
        from ftkit.checkpoint.retention import RetentionPolicy
        from ftkit.train.faults.points import injector_for

        self.cfg, self.roster, self.events, self.engines, self.task = cfg, roster, events, engines, task
        self.enabled = cfg.checkpoints.every > 0
        self.dir = Path(run_dir) / "checkpoints"
        self.run = run_name(run_dir)  # the name the run's log carries (a moved run keeps it)
        self.step = -1
        self.summary: list[dict[str, Any]] = []  # per boundary: step, published, path, reason
        injector = injector_for(faults, events, "driver")

        def log(type_: str, fields: dict[str, Any]) -> None:
            events.emit(type_, **fields)

        self.publisher = Publisher(
            self.dir,
            RetentionPolicy(cfg.checkpoints.keep_last, cfg.checkpoints.keep_best, cfg.eval.best_metric),
            on_event=log,
            at=lambda point: self._strike(injector, point),
        )

    def _strike(self, injector: Any, point: str) -> str | None:
        """The injector's hook at a writer phase: the kind it returns (``enospc``, which the
        publisher applies), or None. An injected ``exception`` there is an error of
        that phase, handled like the I/O errors it stands for: the publication is rejected with
        the reason and training goes on (``sigkill``, ``exit`` and ``hang`` strike the driver
        itself: docs/faults.md, what remains unprotected)."""
        import errno

        from ftkit.train.faults.injector import InjectedFault

        try:
            kind: str | None = injector.at(point, step=self.step)
        except InjectedFault as exc:
            raise OSError(errno.EIO, str(exc)) from exc
        return kind

    def due(self, rollout: int) -> bool:
        """Whether the end of ``rollout`` is a publication boundary."""
        every: int = self.cfg.checkpoints.every
        return self.enabled and (rollout + 1) % every == 0

    def eval_reward(self, rollout: int) -> float:
        """Mean reward (``--reward``) of the eval set (``RlTask.eval_set``: the ``--eval-prompts``
        file, else the task's held-out prompts) under greedy decoding on the engines; NaN when a
        logit was not finite. Logged as a ``metric`` event."""
        import math

        from ftkit.train.rl.rewards import get_reward

        task, prompts = self.task.eval_set(self.cfg.rng.seed)
        responses, _ = self.engines.generate(prompts, rollout, greedy=True)
        reward_fn = get_reward(self.cfg.task.reward, self.cfg.recovery.reward_timeout)
        value = float(reward_fn(task, prompts, responses).double().mean())
        if bool((responses < 0).any()):
            value = math.nan
        emit.metric(self.events, rollout=rollout, step=None, values={"eval_reward": value})
        return value

    def publish(self, rollout: int, reward: float) -> Outcome:
        """Preflight everywhere, agree, publish (or reject); never raises for a rejection.
        ``reward`` is the rollout's mean reward (the metric unless ``--best-metric eval_reward``)."""
        from ftkit.checkpoint.guard import GuardVerdict, merge
        from ftkit.checkpoint.preflight import PreflightVerdict, agree
        from ftkit.checkpoint.publish import Payload, Staged, WriteFailure

        cfg, roster = self.cfg, self.roster
        self.step = step = (rollout + 1) * cfg.batch.steps_per_rollout - 1
        evaluated = cfg.eval.best_metric == "eval_reward" or cfg.eval.eval_prompts is not None
        value = self.eval_reward(rollout) if evaluated else reward  # logged with --eval-prompts too
        metric = value if cfg.eval.best_metric == "eval_reward" else reward
        alive = roster.alive()
        answers = roster.wait(
            {c: roster.cells[c].checkpoint_preflight(step, str(self.dir)) for c in alive}, cfg.recovery.step_timeout
        )
        verdicts = [v for c in sorted(answers.values) for v, _ in answers.values[c]]
        guards = [g for c in sorted(answers.values) for _, g in answers.values[c]]
        for c, cause in sorted(answers.failed.items()):
            roster.fail(c, f"during the checkpoint preflight: {cause}")
            verdicts.append(PreflightVerdict(False, f"cell{c}", (f"cell{c}: no preflight answer ({cause})",)))
        for c in sorted(answers.collective - set(answers.failed)):
            verdicts.append(PreflightVerdict(False, f"cell{c}", (f"cell{c}: collective error during preflight",)))
        agreed = agree(verdicts)
        guard = merge(guards) if guards else GuardVerdict(step, step, False)
        if not agreed.ok:
            return self._note(
                self.publisher.publish(step, Payload(files={}), guard, agreed, metric=metric, rollout=rollout)
            )
        meta = {
            "run": self.run,
            "cells": len(alive),
            "layout": {"tp": cfg.layout.tp, "pp": cfg.layout.pp},
            "seed": cfg.rng.seed,
            "model": cfg.model.preset,
            "config": cfg.model_dump(mode="json"),
        }

        def write(stage: Path) -> Staged:  # in the first live cell's rank 0 (failing over like any cell work)
            shard_bytes = self.publisher.shard_bytes
            staged = roster.on_first_cell(
                "the checkpoint write", lambda cell: cell.write_checkpoint(str(stage), step, meta, shard_bytes)
            )[0]
            if isinstance(staged, WriteFailure):
                raise staged.error()
            return cast(Staged, staged)

        return self._note(self.publisher.publish(step, write, guard, agreed, metric=metric, rollout=rollout))

    def _note(self, out: Outcome) -> Outcome:
        self.summary.append(
            {"step": out.step, "published": out.published, "path": str(out.path or ""), "reason": out.reason}
        )
        return out
