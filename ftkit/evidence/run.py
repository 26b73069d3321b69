"""``EvidenceRun``: the event log of one process of any trainer, in ftkit's run directory layout.

Contract (one ``EvidenceRun`` per process; every rank of the job opens one, in the same order
as its other collectives):

- ``EvidenceRun(run_dir, profile=...)`` takes the rank and world size from ``torch.distributed``
  (or ``rank=`` / ``world_size=``; one process without a process group is rank 0 of 1). Every
  data-parallel rank is one *cell* of one rank (``cell = rank``), which is what ftkit's analyzer
  compares replicas across. Rank 0 writes ``run.json`` (if absent) and holds a second log with the
  run's ``driver`` role: ``run_started``, the ``evidence_profile``, the cells' states, the epoch-0
  membership, the witness allocations, the metrics, the checkpoint publications and at ``close``
  ``run_finished``. ``engines=N``: the inference engines that must report every weight sync
  (``ftkit.evidence.engines``). Every rank writes its own ``trainer`` log (``events/trainer-c<rank>-r0-i<n>.jsonl``,
  ``ftkit.events.writer``: append-only, one ``write`` per line, never raising into training;
  ``incarnation=None`` claims the next free ``<n>``, so a restarted process never writes over its
  predecessor's log).
- ``resume=True``: a restarted job goes on from the newest trusted checkpoint that ends its
  rollout instead of starting again (``ftkit.evidence.resume``): rank 0 logs ``run_resumed`` in a
  new driver incarnation instead of ``run_started``, and ``restore(model, optimizer)`` loads the
  checkpoint and returns the ``ResumePoint`` (first step and rollout) to train from. Without a
  checkpoint, or in a new run directory, it starts at step 0. Without ``resume``, a run directory
  that holds an earlier session's log is an error (``ValueError`` on every rank), never a second
  ``run_started``.
- Per committed step, in this order: ``step_outcome`` (``step``), then the evidence the profile
  promises at that step: ``fingerprint``, ``witness_counts`` (a collective), ``metric`` (rank 0
  logs, the others ignore it), ``dump``, ``publish_checkpoint`` (a collective). ``step`` does the
  first three in one call. Steps are numbered from 0, run-global; ``rollout`` groups the samples
  of one witness allocation (an epoch of a data set, one RL rollout), 0 by default.
- ``close(status)`` ends the run, a collective: every rank closes its log (``log_closed``), rank 0
  last with ``run_finished``, and no rank returns before that line is written and every
  collective of the API has finished (``ftkit.evidence.collectives``: a work left to gloo's
  threads at exit can abort the process), so ``dist.destroy_process_group()`` may follow at once.
  A process that dies leaves its log unclosed, which the analyzer reports. ``EvidenceRun`` is
  also a context manager: ``with EvidenceRun(...) as run:`` closes it on leaving the block,
  ``completed``, or ``failed`` (the exception's type as the reason) when the block raised.
- Multi-node: every rank writes into ``run_dir``, so all nodes must see one shared run directory
  (a shared file system: NFS, Lustre, a mounted bucket with POSIX appends); a node-local path gives
  each node a partial log (one node's directory lacks the other nodes' ranks' logs).

The collectives use the default process group; run them on every rank or on none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.checkpoint.guard import NonFiniteGuard
from ftkit.events.writer import EventWriter
from ftkit.evidence.collectives import IdGather, barrier, broadcast_json, gather_json, rank_and_world, release
from ftkit.evidence.profile import EvidenceProfile
from ftkit.evidence.record import RunRecord, recorded_name
from ftkit.evidence.resume import ResumePoint
from ftkit.evidence.tally import RolloutTally
from ftkit.version import __version__

if TYPE_CHECKING:
    import torch

    from ftkit.evidence.dumps import StepDump
    from ftkit.evidence.emit import Outcome, RunStatus
    from ftkit.evidence.engines import Weights


class EvidenceRun:
    """The evidence log of this process; see the module docstring for the contract."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        profile: EvidenceProfile | None = None,
        *,
        run: str | None = None,
        config: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        engines: int = 0,
        incarnation: int | None = None,
        producer: str = "ftkit.evidence",
        resume: bool = False,
    ) -> None:
        self.dir = Path(run_dir)
        self.profile = profile or EvidenceProfile()
        got_rank, got_world = rank_and_world()
        self.rank = got_rank if rank is None else rank
        self.world_size = got_world if world_size is None else world_size
        self.driver: EventWriter | None = None
        self._closed = False
        self._ids = IdGather()
        self._pending: tuple[Any, dict[str, int]] | None = None  # a deferred witness gather
        self._tally: dict[int, RolloutTally] = {}  # rank 0: rollout -> its allocated samples' counts
        self._committed: dict[int, int] = {}  # the last committed step -> its attempt
        self._fingerprinted: tuple[int, str] | None = None  # (step, total) of the last fingerprint logged
        (self.dir / "events").mkdir(parents=True, exist_ok=True)
        opened: dict[str, Any] = {"run": run or self.dir.resolve().name, "start": ResumePoint().to_json(), "epoch": 0}
        if self.rank == 0:
            try:
                opened = self._open_driver(opened["run"], dict(config or {}), engines, producer, resume)
            except (OSError, ValueError) as exc:  # raised below as one ValueError, named once
                opened = {"error": str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"}
        opened = dict(broadcast_json(opened))  # also the barrier: no rank logs before run_started
        if "error" in opened:
            raise ValueError(opened["error"])
        self.run = str(opened["run"])
        self.start = ResumePoint.from_json(opened["start"])
        self.epoch = int(opened["epoch"])  # the membership epoch of this session
        self.guard = NonFiniteGuard(self.start.step)
        self.log = EventWriter(
            self.dir / "events", self.run, "trainer", cell=self.rank, rank=0, incarnation=incarnation
        )

    def _open_driver(
        self, name: str, config: dict[str, Any], engines: int, producer: str, resume: bool
    ) -> dict[str, Any]:
        """Rank 0: ``run.json``, the driver log and its opening lines (a new run, or a resumed
        one: ``ftkit.evidence.resume``); returns what every rank needs of it."""
        from ftkit.evidence.record import last_epoch
        from ftkit.evidence.resume import check_profile, earlier_session, plan, scheme_mismatch

        start, epoch = ResumePoint(), 0
        if earlier_session(self.dir):
            if not resume:
                raise ValueError(
                    f"{self.dir} holds the log of an earlier session: pass resume=True to go on with "
                    "that run, or use another run directory"
                )
            check_profile(self.dir, self.profile)
            mismatch = scheme_mismatch(self.dir)
            if mismatch is not None:
                raise ValueError(mismatch + ": finish the run with the ftkit version that started it")
            start, epoch = plan(self.dir, self.profile), last_epoch(self.dir / "events") + 1
        recorded = recorded_name(self.dir)
        if recorded is None:  # a new run directory (a resumed session keeps the record)
            layout = {"cells": self.world_size, "tp": 1, "pp": 1, "engines": engines}
            kinds = self.profile.kinds()
            RunRecord(name, config, layout, producer=producer, evidence_profile=kinds).write(self.dir)
        name = recorded or name
        driver = self.driver = EventWriter(self.dir / "events", name, "driver")
        n = self.world_size
        if start.resumed:
            emit.run_resumed(
                driver, config=config, num_cells=n, tp=1, pp=1, num_engines=engines, ftkit_version=__version__,
                checkpoint=start.checkpoint, checkpoint_step=start.checkpoint_step,
                checkpoint_rollout=start.checkpoint_rollout, skipped=start.skipped,
            )  # fmt: skip
        else:
            emit.run_started(
                driver, config=config, num_cells=n, tp=1, pp=1, num_engines=engines, ftkit_version=__version__
            )
            emit.evidence_profile(driver, producer=producer, kinds=self.profile.kinds())
        why = "resumed" if start.resumed else "started"
        for cell in range(self.world_size):
            emit.cell_state(driver, cell=cell, old="pending", new="alive", reason=why)
        everyone = list(range(self.world_size))
        emit.reconfigure(driver, epoch=epoch, alive_before=[], alive_after=everyone, reason=why)
        driver.sync()
        return {"run": name, "start": start.to_json(), "epoch": epoch}

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> ResumePoint:
        """Load the state of the checkpoint this session resumes from into ``model`` (wrappers
        removed) and ``optimizer`` (every rank; no-op without one) and return where to train on
        from (``ResumePoint``: ``step``, ``rollout``; ``0, 0`` for a new run). Call after building
        both, before the first step (``ftkit.evidence.resume``)."""
        if self.start.checkpoint is not None:
            from ftkit.evidence.resume import load_state

            load_state(self.dir / "checkpoints" / self.start.checkpoint, model, optimizer)
        return self.start

    # ------------------------------------------------------------------ samples
    def allocate(self, rollout: int, ids: Iterable[int], expected: int = 1) -> None:
        """Declare the sample ids of ``rollout`` (``witness_allocated``; rank 0 logs it, the others
        ignore the call): each must be counted ``expected`` times over the rollout's committed steps.
        Ids need be unique only within the rollout (an epoch may allocate the data set's indices
        again). Call before the rollout's first step. Refused (ValueError) when the profile does not
        promise witness counts (``EvidenceProfile(witness=False)``): nothing would count the ids,
        and FT103 could not tell a sample that was skipped from one that was never counted."""
        if not self.profile.witness:
            raise ValueError(
                "allocate() needs witness counts, which this run's EvidenceProfile(witness=False) does not "
                "promise: pass witness=True, or do not declare the samples"
            )
        if self.driver is not None:
            listed = [int(i) for i in ids]
            for old in [r for r in self._tally if r < rollout - 1]:  # a resume needs the newest only
                del self._tally[old]
            self._tally[rollout] = RolloutTally(listed, expected)
            emit.witness_allocated(self.driver, rollout=rollout, attempt=0, ids=listed, expected=expected)

    # ------------------------------------------------------------------ per step
    def step(
        self,
        step: int,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        samples: Iterable[int] | None = None,
        metrics: Mapping[str, float] | None = None,
        rollout: int = 0,
        attempt: int = 0,
    ) -> None:
        """A committed step: ``step_outcome``, then what the profile promises at it among
        ``fingerprint`` (needs ``model``, ``optimizer``), ``witness_counts`` (needs ``samples``: the
        ids this rank trained; a collective, overlapped with the next step: its line is written by the
        next ``step``, ``flush`` or ``close``) and ``metric``. Call after ``optimizer.step()``."""
        p = self.profile
        self.flush()
        self.step_outcome(step, rollout=rollout, attempt=attempt)
        if p.due("state_fingerprint", step):
            if model is None:
                raise ValueError(f"the profile promises a state_fingerprint at step {step}: pass model=")
            self.fingerprint(step, model, optimizer, rollout=rollout, attempt=attempt)
        if p.due("witness_counts", step):
            if samples is None:
                raise ValueError(f"the profile promises witness_counts at step {step}: pass samples=")
            self.witness_counts(step, samples, rollout=rollout, attempt=attempt, defer=True)
        if metrics is not None and p.due("metric", step):
            self.metric(step, rollout=rollout, **metrics)
        self.log.sync(wait=False)

    def step_outcome(self, step: int, outcome: Outcome = "committed", *, rollout: int = 0, attempt: int = 0) -> None:
        """This rank's ``step_outcome``: ``committed``, or ``discarded`` / ``failed`` for an attempt
        that made no optimizer step (a retry keeps ``step`` and raises ``attempt``)."""
        self.flush()
        if outcome == "committed":
            self._committed = {step: attempt}
        emit.step_outcome(
            self.log,
            rollout=rollout,
            step=step,
            attempt=attempt,
            epoch=self.epoch,
            cell=self.rank,
            rank=0,
            outcome=outcome,
            micro_shards=[self.rank],
        )

    def fingerprint(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        rollout: int = 0,
        attempt: int = 0,
    ) -> str:
        """Log the ``state_fingerprint`` of ``model`` (wrappers removed) and ``optimizer``'s state
        after a committed step; returns the total (the analyzer compares it across ranks, FT101)."""
        from ftkit.evidence.fingerprint import fingerprint_state, unwrap

        total, params, optim = fingerprint_state(unwrap(model), optimizer)
        emit.state_fingerprint(
            self.log,
            rollout=rollout,
            step=step,
            attempt=attempt,
            cell=self.rank,
            rank=0,
            total=total,
            params=params,
            optimizer=optim,
        )
        self._fingerprinted = (step, total)
        return total

    def fingerprint_at(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, rollout: int = 0
    ) -> str:
        """The state fingerprint this rank logged for committed step ``step``, or, when it logged
        none (a cadence that skips the step), ``fingerprint`` now (logged with the step's attempt):
        what ``publish_checkpoint`` compares across ranks and ``verify-checkpoint`` finds in the log."""
        if self._fingerprinted is not None and self._fingerprinted[0] == step:
            return self._fingerprinted[1]
        attempt = self._committed.get(step, 0)
        return self.fingerprint(step, model, optimizer, rollout=rollout, attempt=attempt)

    def witness_counts(
        self,
        step: int,
        samples: Iterable[int],
        *,
        rollout: int = 0,
        attempt: int = 0,
        counted: tuple[list[int], list[int], list[float]] | None = None,
        defer: bool = False,
    ) -> None:
        """Log the step's global per-sample counts. From ``samples`` (the ids this rank trained in
        the step, a sample twice if it was trained twice): every rank's ids are gathered (one
        collective) and every rank logs the same global counts; the contribution channel is 1.0 per
        occurrence (the sample was in a trained batch). ``defer``: the gather runs in the
        background and its line is written by the next ``flush`` (``step``, ``publish_checkpoint``
        and ``close`` flush first). ``counted``: ``(ids, counts, contributions)`` read from a
        reduced witness gradient (``WitnessTable.read``) instead; no collective."""
        self.flush()
        where = {"rollout": rollout, "step": step, "attempt": attempt}
        if counted is not None:
            self._emit_counts(where, *counted)
            return
        self._pending = (self._ids.start([int(i) for i in samples]), where)
        if not defer:
            self.flush()

    def flush(self) -> None:
        """Finish a deferred witness gather and write its line (no-op when none is pending)."""
        if self._pending is None:
            return
        import torch

        handle, where = self._pending
        self._pending = None
        ids, counts = torch.unique(torch.cat(self._ids.wait(handle)), return_counts=True)  # sorted
        self._emit_counts(where, ids, counts, counts.double())

    def _emit_counts(
        self,
        where: dict[str, int],
        ids: torch.Tensor | list[int],
        counts: torch.Tensor | list[int],
        contributions: torch.Tensor | list[float],
    ) -> None:
        """Tally (rank 0) and log one step's counts: three aligned 1-d tensors or sequences."""
        tally = self._tally.get(where["rollout"])
        if tally is not None:
            tally.add(ids, counts)
        emit.witness_counts(
            self.log, **where, cell=self.rank, rank=0,
            ids=_listed(ids), counts=_listed(counts), contributions=_listed(contributions),
        )  # fmt: skip

    def metric(self, step: int | None, *, rollout: int = 0, **values: float | None) -> None:
        """The run's scalar metrics of ``step`` (``None``: per rollout); rank 0 logs them (pass
        values already averaged over ranks), the others ignore the call."""
        if self.driver is not None:
            emit.metric(self.driver, rollout=rollout, step=step, values={k: _scalar(v) for k, v in values.items()})

    def weights_sent(self, rollout: int, version: int, weights: Weights) -> str | None:
        """Log ``weights_sent`` for weights ``version`` pushed to the engines (rank 0 logs it; the
        others ignore the call and get None): a module or ``{name: tensor}``
        (``ftkit.evidence.engines``). Every engine of ``engines=`` must then report it (FT102)."""
        if self.driver is None:
            return None
        from ftkit.evidence.engines import weights_fingerprint

        total, params = weights_fingerprint(weights)
        emit.weights_sent(self.driver, rollout=rollout, version=version, total=total, params=params)
        self.driver.sync()
        return total

    def observe_grads(self, step: int, model: torch.nn.Module, *, rollout: int = 0) -> bool:
        """Check every gradient of ``model`` for NaN / Inf (after ``backward``, before
        ``optimizer.step``): each non-finite one is logged (``grad_nonfinite``) and recorded in this
        rank's non-finite guard, which ``publish_checkpoint`` consumes (a gradient whose finite
        values sum past the float32 range counts as non-finite: the guard errs on the safe side).
        Returns whether all were finite; if not, the caller should skip the optimizer step and log
        the attempt as ``discarded`` (and retry it)."""
        import torch

        from ftkit.evidence.fingerprint import unwrap

        named = [(n, p.grad) for n, p in unwrap(model).named_parameters() if p.grad is not None]
        if not named:
            return True
        # One reduction per gradient: NaN and Inf survive a sum (so does an overflow: counted too).
        finite = torch.stack([g.detach().sum(dtype=torch.float32) for _, g in named]).isfinite()
        if bool(finite.all()):
            return True
        for (name, _), ok in zip(named, finite.tolist()):
            if not ok:
                self.guard.observe(step, f"gradient {name}", False)
                emit.grad_nonfinite(self.log, rollout=rollout, step=step, cell=self.rank, rank=0, where=name)
        return False

    def rollout_complete(self, rollout: int) -> bool | None:
        """Rank 0: whether every sample allocated to ``rollout`` was counted as often as expected
        by the steps logged so far (None: not allocated, or another rank). Recorded in each
        checkpoint's ``meta.json``: a resume takes only a checkpoint that ends its rollout."""
        tally = self._tally.get(rollout)
        return None if tally is None else tally.complete()

    # ------------------------------------------------------------------ dumps and checkpoints
    def dump(self, step: int, module: torch.nn.Module, **options: Any) -> StepDump:
        """A context manager capturing ``module``'s tensors during one forward and backward, written
        on exit as a per-step dump in ftkit's layout (``ftkit.evidence.dumps.StepDump``)."""
        from ftkit.evidence.dumps import StepDump

        return StepDump(self, step, module, **options)

    def publish_checkpoint(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, **options: Any
    ) -> bool:
        """Guarded publication of ``model`` + ``optimizer`` at ``step`` (a collective):
        ``ftkit.evidence.checkpoints.publish``. Returns whether it was published (on every rank)."""
        from ftkit.evidence.checkpoints import publish

        self.flush()
        return publish(self, step, model, optimizer, **options)

    # ------------------------------------------------------------------ end
    def close(self, status: RunStatus = "completed", reason: str | None = None) -> None:
        """Close this rank's log; rank 0 then logs ``run_finished`` (``completed``, ``failed`` or
        ``interrupted``) and closes the driver log. A collective when a process group is up (call it
        on every rank, before ``destroy_process_group``): it returns, on every rank, once
        ``run_finished`` is written and no work of the API's collectives is left. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        self.log.close()
        gather_json(self.rank)  # every rank's log is closed before the run is declared finished
        if self.driver is not None:
            for cell in range(self.world_size):
                emit.cell_state(self.driver, cell=cell, old="alive", new="stopped", reason="run end")
            emit.run_finished(self.driver, status=status, reason=reason)
            self.driver.close()
        barrier()  # after every earlier work: gloo's workers have let go of all of them
        release()

    def __enter__(self) -> EvidenceRun:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close("completed" if exc_type is None else "failed", None if exc_type is None else exc_type.__name__)


def _scalar(value: Any) -> float | None:
    """A metric value as a float (tensors and numpy scalars too); ``None`` stays ``None``."""
    return None if value is None else float(value.item() if hasattr(value, "item") else value)


def _listed(values: torch.Tensor | list[Any]) -> list[Any]:
    """A 1-d tensor or a sequence as a list of Python numbers."""
    return values.tolist() if hasattr(values, "tolist") else list(values)
