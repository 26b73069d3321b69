"""``RankWorker``: one megatron rank of one cell (the driver wraps it with ``ray.remote``).

Lifecycle (docs/architecture.md, "Training"; the exactness design is docs/training.md, the
fault handling docs/faults.md)::

    w = RankWorker(plan, run_dir, cell, rank, incarnation)   # cheap, no side effects
    w.init_cell(host, port) -> pid   # the cell's world, megatron state, model, optimizer, witness, events
    w.configure(epoch, alive)        # the rank position's cross-cell group over the alive cells
    w.compute_reduce(StepTask, batch) -> Reduced     # phase 1: compute + cross-cell reduction
    w.commit(step, attempt, write_dumps) -> Committed  # phase 2, when every live cell reduced
    w.discard(step, attempt)                           # phase 2, when anything failed
    w.serve_state(key) / w.load_state(key, ...)  # heal: the state codec, streamed from a live donor
    w.restore_checkpoint(files, meta)      # resume: a published checkpoint into this rank
    w.export_weights(version) / w.save_final(run_dir) / w.shutdown()

The checkpoint methods (``checkpoint_preflight``, ``checkpoint_state``, ``restore_checkpoint``,
``save_final``) are inherited from ``ftkit.train.rank.checkpoints.RankCheckpoints``.

``compute_reduce`` is collective twice over: inside the cell (megatron TP all-reduces) and
across cells (the reducer). Every rank of every alive cell must call it for the same step
with the same ``epoch``; a cross-cell failure raises ``CollectiveError`` (the driver then
discards and reconfigures). ``batch`` is the rollout's batch (``samples_per_rollout`` rows;
the worker takes step ``step % steps_per_rollout``'s slice) or already that step's slice.
Nothing is stepped until ``commit``: the reduced gradient waits in the rank, and ``discard``
drops it, leaving parameters and optimizer state untouched. A non-finite reduction is a
collective decision (``Reduced.finite`` is the same on every cell; ``grad_nonfinite`` is
emitted). Nothing is imported at module level beyond the standard library and ftkit's light
modules, so Ray can pickle the class cheaply.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.train.rank.checkpoints import RankCheckpoints
from ftkit.train.rank.step_types import Committed, HealReport, Reduced, StepTask

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.engines.protocol import WeightsFormat
    from ftkit.tensors.transfer import PackedTensors
    from ftkit.train.plan.run_plan import RunPlan
    from ftkit.train.rank.compute import Pending


class RankWorker(RankCheckpoints):
    """One rank (``rank`` = its rank in the cell's world of ``tp * pp``) of cell ``cell``:
    the actor's remote face over its ``RankContext`` (``self.ctx``, from ``init_cell``) and
    the collaborators built on it (reducer, dumps, pipeline, guard)."""

    def __init__(self, plan: RunPlan, run_dir: str, cell: int, rank: int, incarnation: int) -> None:
        self.plan, self.cfg = plan, plan.config  # planned once, by the command
        self.run_dir = str(run_dir)
        self.cell, self.rank, self.incarnation = int(cell), int(rank), int(incarnation)
        self._open = False  # init_cell built self.ctx, shutdown has not closed it yet
        self._pending: Pending | None = None
        self._started: StepTask | None = None  # the attempt compute_reduce last began
        self._heal_moments: dict[str, Any] = {}  # a restarted rank's optimizer moments, heal_room
        self.counters = {"step": -1, "rollout": -1}  # the last committed step and its rollout

    # --- setup -----------------------------------------------------------------------
    def init_cell(self, store_host: str, store_port: int) -> int:
        """Join the cell's world and build this rank's ``RankContext`` (``open_context``:
        megatron state, model, optimizer, witness, event writer, fault injector, cross-cell
        link), then the step's collaborators over it; returns this process's pid."""
        import torch

        from ftkit.train.rank.context import open_context
        from ftkit.train.rank.reducer import ExactReducer, GradLayout

        cfg = self.cfg
        ctx = self.ctx = open_context(
            self.plan, self.run_dir, self.cell, self.rank, self.incarnation, store_host, store_port
        )
        self._open = True
        shapes = [(n, tuple(p.shape)) for n, p in self.ctx.params]
        if self.ctx.witness is not None:
            shapes.append(("witness", tuple(self.ctx.witness.param.shape)))
        self.layout = GradLayout.of(shapes)
        self.reducer = ExactReducer(self.layout, cfg.batch.micro_shards)
        if ctx.device != "cpu" and cfg.reduction.reduce == "exact":
            from ftkit.train.rank.exact_kernels import warm_up

            warm_up(ctx.device)  # the fused kernels compiled before the first step, not in it
        from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

        segments = zip(self.layout.segments(), ctx.params)
        counted = [seg for seg, (_, p) in segments if param_is_not_tensor_parallel_duplicate(p)]
        self.norm_ranges = _merge_ranges(counted)  # flat ranges the grad norm counts
        from ftkit.train.rank.dumps import RankDumps

        self.dumps = RankDumps(ctx)
        from ftkit.train.rank.pipeline import StagePipeline

        self.pipe = StagePipeline(self.ctx.model, self.ctx.device) if cfg.layout.pp > 1 else None
        from ftkit.train.rank.compute import StepCompute

        self.compute = StepCompute(ctx, self.reducer, self.layout, self.dumps, self.pipe)
        from ftkit.checkpoint.guard import NonFiniteGuard

        self.guard = NonFiniteGuard()  # consumed at every checkpoint boundary (checkpoint_preflight)
        if self.incarnation > 0 and self.ctx.device == "cpu":  # a restart: it will be healed
            self._heal_moments = {
                f"optimizer/{n}.{k}": torch.zeros_like(p, memory_format=torch.contiguous_format)
                for n, p in self.ctx.params
                for k in ("exp_avg", "exp_avg_sq")
            }
        return os.getpid()

    def configure(self, epoch: int, alive: list[int]) -> None:
        """Join the cross-cell group of ``epoch`` over ``alive`` (``CrossCellLink.configure``);
        a step still held from an older epoch is dropped."""
        self._pending = self._started = None
        self.ctx.link.configure(epoch, alive)

    # --- one optimizer step: phase 1 --------------------------------------------------
    def compute_reduce(self, task: StepTask, batch: dict[str, Tensor]) -> Reduced:
        """Compute ``task.shards`` and reduce across cells; hold the result for phase 2.

        ``Reduced.loss`` is the step's loss summed over all micro-shards (the same on every
        cell). Raises ``CollectiveError`` when the cross-cell reduction fails. Any other
        error drops this rank's cross-cell group first, so that its peers' collectives fail
        at once instead of waiting out the collective timeout.
        """
        from ftkit.train.rank.crosscell import CollectiveError

        try:
            return self._compute_reduce(task, batch)
        except CollectiveError:
            raise
        except BaseException:
            self.ctx.link.abort()
            raise

    def _compute_reduce(self, task: StepTask, batch: dict[str, Tensor]) -> Reduced:
        if task.epoch != self.ctx.link.epoch:
            raise RuntimeError(
                f"step {task.step} for epoch {task.epoch} but the cross-cell group is for "
                f"epoch {self.ctx.link.epoch}: call configure first"
            )
        self._pending, self._started = None, task
        reduced, self._pending = self.compute.run(task, batch, self.guard)
        return reduced

    # --- one optimizer step: phase 2 --------------------------------------------------
    def commit(self, step: int, attempt: int, write_dumps: bool = True) -> Committed:
        """Step the optimizer with the held reduced gradient; emit ``witness_counts``,
        ``step_outcome`` committed and ``state_fingerprint``. ``write_dumps``: this cell writes
        the rollout's replicated dump (when it is the rollout's last step)."""
        from ftkit.evidence.phases import PhaseTimer

        clock = PhaseTimer()
        pend = self._take(step, attempt)
        self.compute.forget()
        if pend.reduced is None:
            raise RuntimeError(f"step {step} attempt {attempt} was not finite everywhere: it cannot commit")
        task, ev = pend.task, self.ctx.events
        grads = self.layout.unflatten(pend.reduced)
        for name, p in self.ctx.params:
            p.grad = grads[name]
        if self.ctx.witness is not None:
            ids, counts, contribs = self.ctx.witness.read(grads["witness"], pend.witness_ids)
            emit.witness_counts(
                ev,
                rollout=task.rollout,
                step=step,
                attempt=attempt,
                cell=self.cell,
                rank=self.rank,
                ids=ids,
                counts=counts,
                contributions=contribs,
            )
        clock.lap("witness")
        grad_norm = self._grad_norm(pend.reduced)
        clock.lap("grad_norm")
        self.dumps.replicated(task.rollout, step, task.dump_replicated, before_step=True)
        clock.lap("dumps")
        self.ctx.optimizer.step()
        self.ctx.recast()  # bf16: the weights the next step computes with, from the stepped masters
        clock.lap("optimizer")
        self.counters = {"step": step, "rollout": task.rollout}
        self._outcome(task, "committed")
        total = None
        if self.cfg.reduction.bookkeeping:
            total = self._fingerprint(task.rollout, step, attempt)
        clock.lap("fingerprint")
        self.dumps.replicated(
            task.rollout, step, task.dump_replicated, before_step=False, write=write_dumps, attempt=attempt
        )
        clock.lap("dumps")
        ev.sync(wait=False)  # the next emit waits for this fsync
        clock.lap("log")
        return Committed(self.cell, self.rank, step, attempt, grad_norm, total, clock.seconds)

    def _outcome(self, task: StepTask, outcome: emit.Outcome) -> None:
        """Log this rank's ``step_outcome`` for ``task`` (a ``StepTask``)."""
        emit.step_outcome(
            self.ctx.events,
            rollout=task.rollout,
            step=task.step,
            attempt=task.attempt,
            epoch=task.epoch,
            cell=self.cell,
            rank=self.rank,
            outcome=outcome,
            micro_shards=list(task.shards),
        )

    def discard(self, step: int, attempt: int) -> None:
        """Drop the attempt (if this rank began it): ``step_outcome`` discarded, nothing stepped."""
        task, self._started, self._pending = self._started, None, None
        self.compute.discarded(step)
        if task is None or task.step != step or task.attempt != attempt:
            return
        self._outcome(task, "discarded")
        self.ctx.events.sync(wait=False)

    def _take(self, step: int, attempt: int) -> Pending:
        pend, self._pending, self._started = self._pending, None, None
        if pend is None or pend.task.step != step or pend.task.attempt != attempt:
            held = None if pend is None else (pend.task.step, pend.task.attempt)
            raise RuntimeError(f"commit of step {step} attempt {attempt}, but this rank holds {held}")
        return pend

    def _fingerprint(self, rollout: int, step: int, attempt: int) -> str:
        """Emit ``state_fingerprint`` of the state now; returns its total."""
        from ftkit.train.rank.state import fingerprint_state

        total, pfp, ofp = fingerprint_state(self.ctx.model, self.ctx.optimizer, self.ctx.params)
        weights = None
        if self.ctx.weights is not None:  # bf16: the weights cast from the masters, as the engines get them
            weights = fingerprint_state(self.ctx.model, None, self.ctx.weights)[1]
        emit.state_fingerprint(
            self.ctx.events,
            rollout=rollout,
            step=step,
            attempt=attempt,
            cell=self.cell,
            rank=self.rank,
            total=total,
            params=pfp,
            optimizer=ofp,
            weights=weights,
        )
        return total

    def _grad_norm(self, reduced: Tensor) -> float:
        """L2 norm of the reduced gradient of the whole model (TP shards counted once)."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        sq = torch.zeros(1, dtype=torch.float64, device=reduced.device)
        for a, b in self.norm_ranges:
            sq += float(torch.linalg.vector_norm(reduced[a:b])) ** 2
        group = ps.get_model_parallel_group()
        if group.size() > 1:
            dist.all_reduce(sq, group=group)
        return float(sq.sqrt())

    # --- state -------------------------------------------------------------------------
    def export_weights(
        self, version: int, fmt: WeightsFormat | None = None
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | PackedTensors]:
        """Weights version ``version`` (the state after ``version`` rollouts) in the TP=1/PP=1
        layout (TP shards and pipeline stages gathered, no witness): ``(sent, tensors)``, on
        rank 0; others ``(None, {})``. With ``fmt`` (what the engines take) the tensors are in
        the engines' names (``ftkit.train.rl.engines.engine_tensors``), packed for Ray's object
        store without a copy of the parameters (``ftkit.tensors.transfer.PackedTensors``), and
        ``sent`` is ``{"total", "params"}``, their fingerprints as the engines must hold them
        (``expected_weights``); without, copies in the megatron-core names and ``sent`` None.
        The driver calls it with two returns (``Cell.export_weights``), so the tensors go to
        the engines through Ray's object store without passing through the driver. Collective
        inside the cell. Fault point ``during_weight_sync`` with
        ``step = version * steps_per_rollout``."""
        from ftkit.train.rank.pipeline import export_cell

        self.ctx.faults.at("during_weight_sync", step=version * self.cfg.batch.steps_per_rollout, rollout=version)
        if fmt is None:
            return None, export_cell(self.ctx.model)
        tensors = export_cell(self.ctx.model, copy=False)  # packed and stored by Ray before the next call
        if not tensors:
            return None, {}
        from ftkit.engines.protocol import expected_weights
        from ftkit.tensors.transfer import PackedTensors
        from ftkit.train.rl.engines import engine_tensors

        tensors = engine_tensors(tensors, fmt, self.ctx.plan.model)
        total, params = expected_weights(tensors, fmt.dtype, fmt.signed_zeros)
        return {"total": total, "params": params}, PackedTensors.of(tensors)

    def donor_state(self) -> tuple[dict[str, Any], dict[str, str], str]:
        """``(tensors, meta, total)``: this rank's complete state through the codec
        (``state_codec.encode``, views, no copy) and its fingerprint total (the
        ``state_fingerprint`` total of the same state)."""
        from ftkit.train.rank.state import fingerprint_state
        from ftkit.train.rank.state_codec import capture, encode

        witness = self.ctx.witness_param
        tensors, meta = encode(capture(self.ctx.params, self.ctx.optimizer, witness, self.counters))
        total, _, _ = fingerprint_state(self.ctx.model, self.ctx.optimizer, self.ctx.params)
        return tensors, meta, total

    def serve_state(self, key: str) -> int:
        """Heal donor: stream ``donor_state()`` to the recipient that connects through
        ``key`` of the driver's TCPStore (``heal_stream.serve``, every wait bounded by the
        collective timeout); the fingerprint total follows the bytes. Returns the bytes sent."""
        from ftkit.train.rank import heal_stream
        from ftkit.train.rank.state import fingerprint_state
        from ftkit.train.rank.state_codec import capture, encode

        witness = self.ctx.witness_param
        tensors, meta = encode(capture(self.ctx.params, self.ctx.optimizer, witness, self.counters))
        return heal_stream.serve(
            self.ctx.link.store,
            key,
            tensors,
            meta,
            lambda: fingerprint_state(self.ctx.model, self.ctx.optimizer, self.ctx.params)[0],
            self.cfg.recovery.collective_timeout,
        )

    def heal_room(self) -> dict[str, Any]:
        """Tensors a heal receives into, under their codec names: the parameters and, on a
        restarted CPU rank, AdamW moments allocated (and touched) while it started, so that
        the transfer does not page-fault fresh memory (``heal.destinations``)."""
        room = {f"param/{n}": p.detach() for n, p in self.ctx.params}
        room.update(self._heal_moments)
        return room

    def load_state(self, key: str, donor: int, epoch: int, step: int, attempt: int = 0) -> HealReport:
        """Heal: receive the state a donor serves under ``key`` (``serve_state`` of the same
        rank position of a live cell), fingerprint what this rank now holds and compare with
        the donor's total (``ftkit.train.rank.heal.receive``). Emits ``heal`` when they are equal
        (``HealReport.accepted``); a mismatch is returned, not raised. ``step``: the step the
        cell joins before; ``attempt``: the heal attempt (fault point ``during_heal``)."""
        from ftkit.checkpoint.guard import NonFiniteGuard
        from ftkit.train.rank.heal import receive

        report, self.counters = receive(self.ctx, self.heal_room(), key, donor, epoch, step, attempt)
        if report.accepted:
            self._heal_moments = {}  # they are the optimizer's state now
        # the guard of a healed rank covers what it computes from here on: the steps its donor
        # saw before are the donor's to report (a guard from step 0 would reach back into
        # intervals consumed at earlier boundaries)
        self.guard = NonFiniteGuard(first_step=self.counters["step"] + 1)
        return report

    def shutdown(self) -> None:
        """Close the event log and leave the cell's world (idempotent)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self._open:
            self._open = False
            self.ctx.events.close()
            self.ctx.link.abort()
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent ``(start, end)`` ranges merged: fewer, larger slices for the grad norm."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
