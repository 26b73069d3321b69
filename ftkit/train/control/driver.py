"""The driver of ``ftkit train``: the run directory, Ray, the cells, the engines and the loop.

The parts with state of their own live in ``session``, ``coordinator``, ``healing``,
``checkpoints`` and ``engine_pool``; this module is the sequence of the run.

``run_training(plan, on_step)`` runs the run of a ``RunPlan`` (``ftkit.train.plan.run_plan``) to the end
and returns a ``RunResult`` (with the analyzer's verdict over the run's own event log). In order:

1. checks that fail fast, before anything is written: the device, the run directory
   (``cfg.output.out``; an existing one only with ``overwrite``, and only if it is an ftkit run
   directory or empty), Ray (an existing connection is reused; else ``cfg.cluster.ray_address`` is
   joined, or a new local instance with ``LOCAL_RAY_CPUS`` logical CPUs is started with
   ``address="local"``, so a running cluster elsewhere is never joined by accident, and shut
   down at the end), the placement (``ftkit.train.plan.placement``: GPU shares, which cells
   share a GPU, the cross-cell backend; put in the run plan the actors receive) and whether
   the cluster's resources hold the cells and engines;
2. the run directory, ``run.json`` (config, ftkit version, layout, seed), the driver's
   ``EventWriter`` and ``run_started``; from here on ``run_finished`` always ends the log and
   ``status.json`` (``ftkit.train.control.run_end``) records how the run ended;
3. a ``TCPStore`` hosted here, on this node's Ray IP and a free port, through which every
   rank builds its cell world and the cross-cell groups;
4. the placement plan (``ftkit.train.control.placement``: cells and engines spread over the nodes,
   each placement logged), the cells (``ftkit.train.control.cells``, state machine
   ``ftkit.train.control.cell_state``), ``init_cell``
   and the first ``reconfigure`` (epoch 0), and the engines (``ftkit.train.control.engine_pool``),
   which load the initial weights (version 0);
5. per rollout ``r``: prompts -> engines generate -> rewards -> advantages ->
   ``witness_allocated`` -> ``rollouts/rollout_r.safetensors`` -> ``steps_per_rollout``
   optimizer steps, each run to a commit by the step coordinator
   (``ftkit.train.control.coordinator``: two-phase commit, failure detection, discard, reconfigure,
   retry; failed cells restarted and healed by ``ftkit.train.control.healing``) with a ``metric`` per
   step and per rollout -> weights version ``r+1`` exported by the first live cell,
   fingerprinted (``weights_sent``) and loaded by every engine (``engine_weights``);
   If every live cell is lost (a lost node that held them all), the cells are all started
   again in this process from the newest verified checkpoint or the seed
   (``ftkit.train.recovery.all_lost``, ``_recover``) and the loop goes on from there;
6. the final state (``save_final`` on the first live cell), ``run_finished``, shutdown;
7. ``analyze_paths`` over ``events/``.

Resumed (``resume=True``, ``ftkit train --resume``; ``ftkit.train.recovery.resume_plan`` and
``ftkit.train.recovery.resume``, docs/checkpoints.md "Resume"): ``cfg.output.out`` is an
existing run directory, kept; step 2 reconciles its checkpoints and picks the newest that
verifies and logs ``run_resumed`` instead of ``run_started``; step 4 starts the cells with
incarnations and epochs after the earlier sessions', loads the checkpoint into every cell
(``restore_cells``) and gives the engines its weights (version = the next rollout); step 5
begins at the rollout after the checkpoint's (at 0 without one).

SIGINT / SIGTERM raise ``RunInterrupted`` (exit 130 / 143); a run that cannot go on raises
``RunFailed`` (exit 1); in both cases the log ends with ``run_finished`` (``interrupted`` /
``failed`` and the reason), every actor is killed and the local Ray is shut down.

Weights version ``v`` is the state after ``v`` rollouts; it is sent with ``rollout = v``,
the rollout it generates (version ``rollouts`` is the final state, generating nothing).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.errors import ConfigError, FtkitError
from ftkit.train.control.gcs_watch import GcsWatch
from ftkit.train.control.ray_session import connect_ray, cuda_available, disconnect, host_store, plain_line
from ftkit.train.control.results import RunResult, StepReport, analyze
from ftkit.train.control.step_clock import StepClock, emit_step
from ftkit.version import __version__

if TYPE_CHECKING:
    from ftkit.train.control.results import StepOutcome
    from ftkit.train.control.session import CellSession
    from ftkit.train.plan.run_plan import RunPlan


class Driver:
    """One run (see the module docstring); use ``run_training``."""

    def __init__(
        self,
        plan: RunPlan,
        on_step: Callable[[StepReport], None] | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        resume: bool = False,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.run_plan, self.cfg, self.resume = plan, plan.config, resume
        self.on_warning = on_warning or (lambda message: print(f"Warning: {message}", file=sys.stderr))
        self.on_step = on_step or (lambda report: None)
        self.on_event = on_event or (lambda type_, fields: None)
        self.task = plan.task.build()
        self.cells: CellSession | None = None  # the cells, their roster, coordinator and healer
        self.engines: Any = None
        self.checkpoints: Any = None
        self.engine_totals: list[list[str]] = []
        self.rewards: list[float] = []
        self.steps_committed = 0
        self.first_rollout = 0  # > 0 when resumed from a checkpoint
        self.start_rollout = 0  # the first rollout this process reports (``RunResult.first_rollout``)
        self.recoveries = 0  # times every cell was restarted at once (``_recover``)
        self.plan: Any = None  # ftkit.train.recovery.resume_plan.ResumePlan when resumed
        self.gcs: GcsWatch | None = None
        self.clock = StepClock()  # the phases of each step's metric (step_clock)

    # --- the run ----------------------------------------------------------------------
    def run(self) -> RunResult:
        from ftkit.train.control.run_end import signals_interrupt

        with signals_interrupt() as arm:
            return self._run(arm)

    def _open_run(self, arm_signals: Callable[[], None]) -> bool:
        """Check the device and the run directory, connect Ray (``connect_ray``), plan a
        resume, write ``run.json`` and open the driver's event log; returns whether this
        process started its own Ray (``disconnect`` it at the end). Nothing is left connected
        when it raises."""
        from ftkit.events.writer import EventWriter
        from ftkit.train.control.cells import check_resources, placement_for
        from ftkit.train.control.code_identity import check_same_code
        from ftkit.train.control.rundir import check_run_dir, make_run_dir, run_name, write_run_json

        cfg = self.cfg
        # The ranks need the compiled kernels (their dump writer counts non-finites): a missing
        # build is an InstallError (exit 2) here, before anything starts, not a failure of every
        # cell at its start that the run retries until no cell is left (exit 1).
        from ftkit.tensors import kernels  # noqa: F401

        self.device = self.run_plan.device
        if self.device == "cuda" and not cuda_available():
            raise ConfigError(
                "--device cuda, but torch sees no CUDA device here",
                hint="use --device cpu (or auto), or run on a machine with a GPU",
            )
        if self.resume:
            from ftkit.train.recovery.resume_plan import check_resume_dir

            check_resume_dir(cfg.output.out)
        else:
            check_run_dir(cfg.output.out, cfg.output.overwrite)
        own_ray = connect_ray(cfg, rearm=arm_signals)  # ray.init installs its own SIGTERM handler
        try:
            check_same_code()  # the actors import the driver's ftkit, not a checkout in the working directory
            placement = placement_for(self.run_plan)  # exit 2 for a layout the GPUs cannot hold
            check_resources(placement, cfg.cluster.cells, cfg.engine.count)
            self.run_plan = dataclasses.replace(self.run_plan, placement=placement)
            if self.resume:
                from ftkit.train.recovery.resume_plan import plan_resume

                self.run_dir = Path(cfg.output.out).resolve()
                self.plan = plan_resume(self.run_dir, cfg, self.on_warning)
            else:
                self.run_dir = make_run_dir(cfg.output.out, cfg.output.overwrite).resolve()
            write_run_json(self.run_dir, cfg, self.device, self.task)
            self.gcs = GcsWatch().start()
            self.name = run_name(self.run_dir)
            self.events = EventWriter(self.run_dir / "events", run=self.name, role="driver")
        except BaseException:
            disconnect(own_ray)
            raise
        return own_ray

    def _train(self) -> list[str]:
        """Every rollout from ``first_rollout`` on, then the final state (its files). When
        every live cell is lost (``CellsLost``) and healing is on, the cells are all started
        again (``_recover``), at most ``max_retries + 1`` times."""
        from ftkit.train.control.coordinator import CellsLost

        cfg, lost = self.cfg, False
        self.clock.start()
        while True:
            try:
                if lost:  # every live cell was lost: all of them again
                    self._recover()
                for rollout in range(self.first_rollout, cfg.schedule.rollouts):
                    self._rollout(rollout)
                return self._save_final()
            except CellsLost:
                if not cfg.recovery.heal or self.recoveries > cfg.recovery.max_retries:
                    raise  # --no-heal, or lost again too often: the run fails (exit 1)
                lost = True

    def _run(self, arm_signals: Callable[[], None]) -> RunResult:
        from ftkit.train.control import run_end
        from ftkit.train.control.run_end import RunInterrupted, interruption, ray_failure

        cfg, started = self.cfg, time.perf_counter()
        own_ray = self._open_run(arm_signals)
        # From here on the run exists: whatever happens, its log says how it ended.
        head: dict[str, Any] = {
            "config": cfg.model_dump(mode="json"),
            "num_cells": cfg.cluster.cells,
            "tp": cfg.layout.tp,
            "pp": cfg.layout.pp,
            "num_engines": cfg.engine.count,
            "ftkit_version": __version__,
        }
        self.head = head
        if self.plan is None:
            emit.run_started(self.events, **head)
        else:
            emit.run_resumed(self.events, **head, **self.plan.fields())
        status: emit.RunStatus
        status, reason, code = "failed", None, None
        try:
            self.store = host_store()
            self._start()
            final = self._train()
            status = "completed"
        except RunInterrupted as exc:
            status, reason, code = "interrupted", exc.message.split(":")[0], exc.exit_code
            raise
        except FtkitError as exc:  # RunFailed (exit 1), a ConfigError found while starting (exit 2)
            reason, code = plain_line(exc.message), exc.exit_code
            raise
        except BaseException as exc:
            stopped = interruption(exc)  # the signal landed inside Ray's C code, which wrapped it
            if stopped is not None:
                status, reason, code = "interrupted", stopped.message.split(":")[0], stopped.exit_code
                raise stopped from None
            failed = ray_failure(exc)  # the cluster lost a node, a placement group, an object
            if failed is not None:
                reason, code = plain_line(failed.message), failed.exit_code
                raise failed from None
            reason, code = plain_line(f"{type(exc).__name__}: {exc}"), 3  # a bug in ftkit
            raise
        finally:  # a signal from here on: ``end_run``, then ``verdict_after_end``
            gcs_lost = self.gcs is not None and self.gcs.gone()  # nothing waits on a dead GCS
            shutdown = partial(self._shutdown, release=not gcs_lost)
            ended = run_end.end_run(status, reason, code, shutdown, self._record_end)
            if self.gcs is not None:
                self.gcs.stop()
            with run_end.signals_deferred(raise_after=False):
                disconnect(own_ray, gcs_lost)
            if ended[0] != status:  # a signal came before the end was recorded: it is how the run ended
                raise run_end.pending_interruption() or AssertionError("no signal") from None
        rewrite = partial(self._record_status, status, None)
        verdict = run_end.verdict_after_end(lambda: analyze(self.run_dir), status, rewrite)
        return RunResult(
            self.run_dir,
            self.name,
            self.steps_committed,
            cfg.total_steps,
            time.perf_counter() - started,
            final,
            self.rewards,
            self.engine_totals,
            verdict,
            self.checkpoints.summary if self.checkpoints is not None else [],
            self.start_rollout,
        )

    def _record_end(self, status: emit.RunStatus, reason: str | None, code: int | None) -> None:
        """``run_finished`` ends the driver's log, then ``status.json`` says the same."""
        emit.run_finished(self.events, status=status, reason=reason)
        self.events.close()
        self._record_status(status, reason, code)

    def _record_status(self, status: str, reason: str | None, code: int | None) -> None:
        from ftkit.train.control.run_end import write_status

        write_status(self.run_dir, status, reason, code, self.steps_committed, self.cfg.total_steps)

    def _start(self) -> None:
        from ftkit.train.control.checkpoints import RunCheckpoints
        from ftkit.train.control.engine_pool import EnginePool
        from ftkit.train.control.placement import Placer
        from ftkit.train.control.session import CellSession

        cfg, plan = self.cfg, self.plan
        placer = Placer(self.run_plan.placement.rank_resources(), cfg.layout.ranks, self.events)
        spread = placer.plan_start(cfg.cluster.cells, cfg.engine.count)
        session = self.cells = CellSession(
            self.run_plan, str(self.run_dir), (self.store.host, self.store.port), placer, self.events,
            emit.Tee(self.events, self.on_event), self.store.set,
        )  # fmt: skip
        epoch, incarnation = (-1, 0) if plan is None else (plan.last_epoch, plan.incarnation)
        cells = session.spawn(spread.cells, epoch, incarnation)
        self.engines = EnginePool(
            self.run_plan, str(self.run_dir), placer, spread.engines, self.events, reexport=self._export_weights
        )
        session.join(cells)
        self.engines.ready()
        self._restore()
        self.start_rollout = self.first_rollout
        self._push_weights(version=self.first_rollout)
        self.checkpoints = RunCheckpoints(
            cfg, self.run_dir, session.roster, self.events, self.engines, self.task, self.run_plan.faults
        )

    def _session(self) -> CellSession:
        assert self.cells is not None, "no cells started yet"
        return self.cells

    def _restore(self) -> None:
        """Load the session plan's checkpoint into the cells (resume, recovery); without one
        the cells hold the seed's initial state and training starts at rollout 0."""
        plan = self.plan
        if plan is None:
            return
        self.first_rollout, self.steps_committed = 0, 0
        if plan.checkpoint is not None:
            from ftkit.train.recovery.resume import restore_cells

            rollout, step = restore_cells(self._session().roster, plan.checkpoint)
            self.first_rollout, self.steps_committed = rollout + 1, step + 1

    def _recover(self) -> None:
        """Every live cell was lost (``CellsLost``; the run loop calls this with healing on, at
        most ``max_retries + 1`` times per run): stop what is left of the cells and start them
        all again in this process from the newest checkpoint that verifies, else from the
        seed's initial state (``ftkit.train.recovery.all_lost``; logged as ``run_resumed``)."""
        from ftkit.train.recovery.all_lost import recovery_plan

        self.recoveries += 1
        session = self._session()
        session.stop("every live cell was lost: restarting all cells", flush_s=0.0)
        self.plan = recovery_plan(self.run_dir, self.cfg, session.roster, self.on_warning)
        self.on_warning(
            f"every live cell was lost; restarting the cells from {self.plan.fields()['checkpoint'] or 'the seed'}"
        )
        emit.run_resumed(self.events, **self.head, **self.plan.fields())
        spread = session.placer.plan_cells(self.cfg.cluster.cells)
        session.join(session.spawn(spread, self.plan.last_epoch, self.plan.incarnation))
        self._restore()
        self.start_rollout = min(self.start_rollout, self.first_rollout)  # back to the seed: report from 0
        keep = self.first_rollout - self.start_rollout  # rewards and weights of rollouts still valid
        del self.rewards[keep:], self.engine_totals[keep:]
        self._push_weights(version=self.first_rollout)

    def _rollout(self, rollout: int) -> None:
        import ray

        from ftkit.train.rl import rollouts
        from ftkit.train.rl.rewards import get_reward
        from ftkit.train.rl.rollout_stats import idle_warning, rollout_metrics

        cfg, clock = self.cfg, self.clock
        with clock.phase("generation"):
            batch = self._generate(rollout)
        with clock.phase("scoring"):
            reward_fn = get_reward(cfg.task.reward, cfg.recovery.reward_timeout)
            rewards = reward_fn(self.task, batch["prompts"], batch["responses"])
            mask = self.task.response_mask(batch["responses"])
            tensors = rollouts.build_batch(
                batch["prompts"], batch["responses"], batch["logprobs"], rewards, cfg.task.group_size, rollout, mask
            )
        with clock.phase("record"):
            rollouts.check_rerecorded(self.run_dir, cfg.task.reward, rollout, tensors)
            if cfg.reduction.bookkeeping:  # without bookkeeping the ranks carry no witness to count with
                emit.witness_allocated(
                    self.events, rollout=rollout, attempt=0, ids=tensors["witness_ids"].tolist(), expected=1
                )
            rollouts.record(
                self.run_dir,
                rollout,
                tensors,
                meta={"task": self.task.name, "reward": cfg.task.reward, "group_size": str(cfg.task.group_size)},
            )
            reward = float(rewards.double().mean())
            self.rewards.append(reward)
            gen_s = clock.pending.get("generation", 0.0)  # this rollout's: the last step's close reset it
            values = {"reward": reward, **rollout_metrics(tensors, self.task, cfg.task.group_size, gen_s)}
            emit.metric(self.events, rollout=rollout, step=None, values=values)
            if (idle := idle_warning(rollout, values, cfg.sampling.temperature == 0)) is not None:
                self.on_warning(idle)
            batch_ref = ray.put(tensors)
        dump = cfg.dumps_rollout(rollout) and bool(cfg.dumps.what)
        for k in range(cfg.batch.steps_per_rollout):
            step = rollout * cfg.batch.steps_per_rollout + k
            if self.gcs is not None:  # RunFailed once Ray's GCS is lost (GcsWatch.check)
                self.gcs.check()
            self._step_done(self._session().coord.run_step(rollout, step, batch_ref, dump), values)
        with clock.phase("weight_sync"):
            self._push_weights(version=rollout + 1)
        with clock.phase("checkpoint"):
            if self.checkpoints.due(rollout):
                self.checkpoints.publish(rollout, reward)

    def _generate(self, rollout: int) -> dict[str, Any]:
        cfg = self.cfg
        prompts = self.task.prompts(cfg.rng.seed, rollout, cfg.batch.samples_per_rollout // cfg.task.group_size)
        prompts = prompts.repeat_interleave(cfg.task.group_size, dim=0)
        responses, logprobs = self.engines.generate(prompts, rollout)
        return {"prompts": prompts, "responses": responses, "logprobs": logprobs}

    def _step_done(self, out: StepOutcome, rollout_values: dict[str, float]) -> None:
        """Metrics (with the step's phases: ``step_clock``) and progress of a committed step."""
        self.steps_committed += 1
        with self.clock.phase("log"):
            tps = emit_step(self.events, out, self.clock)
            self.events.sync()
            self.on_step(StepReport.of(out, self.cfg, rollout_values, tps))

    def _push_weights(self, version: int) -> None:
        """Export the first live cell's weights, fingerprinted by the cell as the engines must
        hold them (``CellSession.export_weights``); log ``weights_sent`` and load them on every
        engine. The tensors go from the cell to the engines: the driver never holds a copy."""
        self.engines.forget_weights()  # the previous version's object is freed first
        ref, total, params = self._session().export_weights(version, self.engines.weights_format)
        emit.weights_sent(self.events, rollout=version, version=version, total=total, params=params)
        self.engine_totals.append(self.engines.load(ref, version, total))

    def _export_weights(self, version: int) -> tuple[Any, str]:
        """``EnginePool``'s ``reexport``: ``(object ref, total)`` of weights ``version`` again."""
        ref, total, _ = self._session().export_weights(version, self.engines.weights_format)
        return ref, total

    def _save_final(self) -> list[str]:
        """Write ``final/`` from the first live cell; a resumed run's earlier ``final/`` (maybe of
        another layout: other ``tp{t}-pp{p}`` files) is removed first, so it holds this state only."""
        import shutil

        shutil.rmtree(self.run_dir / "final", ignore_errors=True)
        paths = self._session().roster.on_first_cell("the final save", lambda cell: cell.save_final(str(self.run_dir)))
        return sorted(p for rank_paths in paths for p in rank_paths)

    # --- helpers ------------------------------------------------------------------------
    def _shutdown(self, interrupted: bool, release: bool = True) -> None:
        """Flush every actor's event log (briefly when interrupted), then kill the actors;
        ``release=False`` (Ray's GCS is gone) leaves the cells' placement groups alone."""
        flush_s = 5.0 if interrupted else 60.0
        if self.cells is not None:
            self.cells.stop("interrupted" if interrupted else "run end", flush_s, release)
        if self.engines is not None:
            self.engines.shutdown(flush_s)


def run_training(
    plan: RunPlan,
    on_step: Callable[[StepReport], None] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    resume: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``plan`` to the end (see the module docstring); raises ``ConfigError`` /
    ``UsageError`` for a bad run directory, Ray address or layout. ``on_step`` hears every
    step, ``on_event(type, fields)`` every cell-state change and reconfiguration the driver logs
    (for a live view). ``resume``: continue the run in ``cfg.output.out`` from its newest checkpoint
    that verifies (``ftkit.train.recovery.resume``); ``on_warning`` hears why a newer one was skipped
    (default: a ``Warning:`` line on stderr). One process trains a run directory at a time
    (``ftkit.run_lock.hold_run_dir``: ``UsageError`` naming the owner)."""
    from ftkit.run_lock import hold_run_dir

    with hold_run_dir(plan.config.output.out):
        return Driver(plan, on_step, on_event, resume, on_warning).run()
