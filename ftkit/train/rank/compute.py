"""Phase 1 of an optimizer step on one rank: ``StepCompute.run(task, batch, guard)``.

The rank's micro-shards of the step (``task.shards``) are computed one by one, each with its
seed from (seed, rollout, step, micro-shard) and its gradient accumulated straight into its own
zeroed row (one shared row without bookkeeping), the ``before_forward`` / ``mid_backward`` /
``before_reduce`` / ``during_reduce`` / ``after_reduce`` fault points armed on the way; then the
rows are reduced across cells (the exact int64 reduction, or the plain float one) with the
per-micro-shard losses riding along. Nothing is stepped: the result is a ``Reduced`` for the
driver and a ``Pending`` the worker holds until ``commit`` or ``discard``. A survivor of a
discarded attempt reuses the micro-shard rows it computed then (``ShardCache``: ``forget``
drops them, ``discarded(step)`` keeps them for the retry). Collaborators are given at
construction: the rank's ``RankContext``, its reducer and gradient layout, dumps and pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.evidence.phases import PhaseTimer
from ftkit.train.rank.precision import GradStage
from ftkit.train.rank.scoring import PolicyScoring
from ftkit.train.rank.shard_cache import ShardCache
from ftkit.train.rank.step_metrics import StepMetrics
from ftkit.train.rank.step_types import Reduced, StepTask

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.checkpoint.guard import NonFiniteGuard
    from ftkit.train.rank.context import RankContext
    from ftkit.train.rank.dumps import RankDumps
    from ftkit.train.rank.pipeline import StagePipeline
    from ftkit.train.rank.reducer import ExactReducer, GradLayout


#: The rollout tensors a step reads (``ftkit.train.rl.rollouts``); ``logprobs`` only where recorded
#: (a rollout of an ftkit before it, replayed from a checkpoint by ``ftkit dump``, trained REINFORCE).
_STEP_KEYS = ("tokens", "loss_mask", "advantages", "witness_ids", "logprobs")


@dataclass
class Pending:
    """A reduced step waiting for the driver's decision."""

    task: StepTask
    reduced: Any  # the flat reduced gradient, None when non-finite
    witness_ids: list[int]
    loss: float
    tokens: int


class StepCompute:
    """Phase 1 of the steps of one rank (see the module docstring)."""

    def __init__(
        self,
        ctx: RankContext,
        reducer: ExactReducer,
        layout: GradLayout,
        dumps: RankDumps,
        pipe: StagePipeline | None,
    ) -> None:
        self.ctx, self.cfg, self.reducer, self.layout, self.dumps, self.pipe = (
            ctx, ctx.cfg, reducer, layout, dumps, pipe
        )  # fmt: skip
        self._shards = ShardCache()  # a discarded attempt's micro-shard rows, for its retry
        self._stage = GradStage(layout, ctx.plan.precision, ctx.device)
        self._rows_buf: Any = None
        self.scoring = PolicyScoring(ctx)
        # GRPO at a rollout's first step: (trainer log-probs, recorded, mask, ids) per micro-shard
        self._checks: list[tuple[Any, Any, Any, Any]] | None = None
        self._metrics: StepMetrics | None = None  # GRPO: this attempt's metric tables

    def forget(self) -> None:
        """Drop the micro-shard rows kept for a retry (the step committed, or another began)."""
        self._shards.clear()

    def discarded(self, step: int) -> None:
        """``step``'s attempt was discarded: its kept rows wait for the retry."""
        if self._shards.discarded(step):
            self._rows_buf = None  # the kept rows are the cache's now

    def run(self, task: StepTask, batch: dict[str, Tensor], guard: NonFiniteGuard) -> tuple[Reduced, Pending]:
        """Phase 1 of ``task`` (the epoch already checked): see the module docstring."""
        import torch

        from ftkit.train.rank.loss import step_tokens
        from ftkit.train.rank.reducer import reduce_float
        from ftkit.train.rl.grpo import loss_norm
        from ftkit.train.rl.microshards import shard_seed, shard_slices

        cfg, faults, ctx, clock = self.cfg, self.ctx.faults, self.ctx, PhaseTimer()
        at = {"step": task.step, "attempt": task.attempt, "rollout": task.rollout}
        data = self._step_batch(task.rollout, task.step, batch)
        mine = sorted(int(m) for m in task.shards)
        if not mine or mine[0] < 0 or mine[-1] >= cfg.batch.micro_shards or len(set(mine)) != len(mine):
            raise ValueError(f"micro-shards {task.shards} are not distinct indices in [0, {cfg.batch.micro_shards})")
        grpo = cfg.objective.loss == "grpo"
        norm = loss_norm(data["loss_mask"], cfg.objective.aggregation) if grpo else step_tokens(data["loss_mask"])
        # at a rollout's first step the trainer's weights are the ones the engines sampled with
        rollout_start = task.step % cfg.batch.steps_per_rollout == 0
        self._checks = [] if grpo and rollout_start else None
        self._metrics = StepMetrics.of(cfg, rollout_start, ctx.reference is not None, ctx.device)
        if rollout_start and cfg.layout.pp == 1:  # every attempt: a killed first attempt may have logged nothing
            self.scoring.score_canaries(task)
        if self.ctx.witness is not None:
            data["witness_rows"] = self.ctx.witness.rows(data["witness_ids"])
        slices = shard_slices(cfg.batch.step_samples, cfg.batch.micro_shards)
        keep = cfg.reduction.bookkeeping
        # exact per-micro-shard rows, not recorded: a retry may reuse them (shard_cache)
        reusable = keep and cfg.reduction.reduce == "exact" and not task.dump
        reuse = self._shards.take(task.step) if reusable else {}
        self._shards.clear()
        # Gradients accumulate straight into these rows: one zeroed row per micro-shard with
        # bookkeeping (kept apart for the exact reduction), one shared row without.
        rows = self._rows(len(mine) if keep else 1)
        # on the device until every micro-shard is done: one host sync per step, not one each
        losses = torch.zeros(cfg.batch.micro_shards, dtype=torch.float64, device=ctx.device)
        shard_seconds: dict[int, float] = {}
        poison = faults.at("before_forward", **at)
        first = True
        clock.lap("prepare")
        for i, m in enumerate(mine):
            if m in reuse:  # computed by this rank in a discarded attempt of this step
                rows[i].copy_(reuse[m][0])
                losses[m] = reuse[m][1]
                if self._metrics is not None:
                    self._metrics.shards[m] = reuse[m][2]
                clock.lap("reuse")
                continue
            self._bind_grads(rows[i if keep else 0])
            self._seed(shard_seed(cfg.rng.seed, task.rollout, task.step, m))
            part = {k: v[slices[m]] for k, v in data.items()}
            mid, first = (self._mid_backward(at) if first else None), False
            with self.dumps.micro_shard(task.rollout, task.step, m, task.dump, task.attempt):
                losses[m] = self._forward_backward(part, norm, m)  # f32 -> f64: exact
            if mid is not None:
                mid[1].remove()
                poison = poison or next((kind for kind in mid[0] if kind), None)
            self._check_bound(rows[i if keep else 0])
            self._stage.land(rows[i if keep else 0])
            shard_seconds[m] = clock.lap("forward_backward")
        losses = losses.cpu()  # the step's one wait for the device (docstring of ftkit.evidence.phases)
        clock.lap("forward_backward")
        if self._checks is not None:
            self._checks.extend(self.scoring.score_rest(batch, mine, slices, set(reuse) & set(mine)))
            self._emit_check(task)
            clock.lap("logprob_check")
        poison = poison or faults.at("before_reduce", **at)
        if poison == "nan-grad":  # that micro-shard's gradient turns non-finite
            rows[0, 0] = math.nan
        elif reusable:
            stats = None if self._metrics is None else self._metrics.shards
            self._shards.computed(task.step, mine, rows, losses, stats)
        if self.pipe is not None:  # only the last stage computed the losses
            self.pipe.share_losses(losses)
        # GRPO's metric tables ride with the losses (step_metrics); without them the losses alone
        side = losses if self._metrics is None else self._metrics.side(losses)
        allreduce = self._faulty_allreduce(at)
        # The loss vector has one non-zero slot per micro-shard, so its sum across cells is
        # exact; the exact reduction carries it in its own integer collective.
        if keep and cfg.reduction.reduce == "exact":
            reduced = self.reducer.reduce(rows, allreduce, side=side)
            if reduced is None:
                allreduce(side, "sum")
        else:
            reduced = reduce_float(rows, allreduce)
            allreduce(side, "sum")
        faults.at("after_reduce", **at)
        tokens = int(data["loss_mask"].sum())
        metrics = {} if self._metrics is None else self._metrics.unpack(side, losses, tokens)
        guard.observe(task.step, "reduced gradient", reduced is not None)
        guard.observe_value(task.step, "loss", float(losses.sum()))
        if reduced is None:
            emit.grad_nonfinite(
                self.ctx.events,
                rollout=task.rollout,
                step=task.step,
                cell=ctx.cell,
                rank=ctx.rank,
                where="reduced gradient",
            )
        ids = data["witness_ids"].tolist()
        pending = Pending(task, reduced, ids, float(losses.sum()), tokens)
        clock.lap("reduce")
        finite, loss = reduced is not None, float(losses.sum())
        return Reduced(
            ctx.cell, ctx.rank, task.step, task.attempt, finite, loss, tokens, clock.seconds, shard_seconds, metrics
        ), pending

    def _step_batch(self, rollout: int, step: int, batch: dict[str, Tensor]) -> dict[str, Any]:
        """This step's rows of ``batch`` (CPU tensors), see the module docstring."""
        cfg = self.cfg
        k, n = step % cfg.batch.steps_per_rollout, cfg.batch.step_samples
        if step // cfg.batch.steps_per_rollout != rollout:
            raise ValueError(
                f"step {step} is not a step of rollout {rollout} ({cfg.batch.steps_per_rollout} steps per rollout)"
            )
        rows = batch["tokens"].shape[0]
        if rows == cfg.batch.samples_per_rollout:
            return {key: batch[key][k * n : (k + 1) * n] for key in _STEP_KEYS if key in batch}
        if rows == n:
            return {key: batch[key] for key in _STEP_KEYS if key in batch}
        raise ValueError(
            f"a batch of {rows} samples is neither a rollout ({cfg.batch.samples_per_rollout}) nor a step ({n})"
        )

    def _forward_backward(self, part: dict[str, Tensor], norm: float, m: int) -> Any:
        """Forward and backward of micro-shard ``m``; returns its (normalised) loss, a detached
        0-d tensor on the device (0.0 on a pipeline stage that computes none), never read here."""
        import torch

        from ftkit.model.output_positions import output_positions, widen
        from ftkit.train.rank.loss import pg_loss, targets
        from ftkit.train.rl.masks import sequence_mask

        tokens = part["tokens"].to(self.ctx.device)
        pos = torch.arange(tokens.shape[1], device=self.ctx.device).unsqueeze(0).expand_as(tokens)
        mask = sequence_mask(self.scoring.task(), tokens)
        window = self.scoring.window()  # the output layer at the responses' positions only
        labels = targets(tokens) if window is None else targets(tokens)[:, window]
        emb = None
        if self.ctx.witness is not None:  # with PP > 1 only the first stage has one (and the embedding)
            emb = self.ctx.model.embedding(input_ids=tokens, position_ids=pos)
            emb = self.ctx.witness.apply(emb, part["witness_rows"])
        if self.cfg.objective.loss == "grpo":  # pp == 1 (TrainConfig)
            loss = self._grpo_loss(part, tokens, pos, mask, emb, norm, m)
        elif self.pipe is not None:
            s = tokens.shape[1]
            return self.pipe.forward_backward(
                tokens,
                pos,
                mask,
                labels,
                emb,
                lambda nll: pg_loss(widen(nll, s), part["loss_mask"], part["advantages"], norm),
                window,
            )
        else:
            with output_positions(self.ctx.model, window):
                nll = self.ctx.model(tokens, pos, mask, decoder_input=emb, labels=labels)
            loss = pg_loss(widen(nll, tokens.shape[1]), part["loss_mask"], part["advantages"], norm)
        loss.backward()
        return loss.detach()

    def _grpo_loss(
        self,
        part: dict[str, Tensor],
        tokens: Tensor,
        pos: Tensor,
        mask: Tensor | None,
        emb: Tensor | None,
        norm: float,
        m: int,
    ) -> Any:
        """Micro-shard ``m``'s GRPO loss (``ftkit.train.rl.grpo``) against the recorded behaviour
        log-probs and its metric sums (``step_metrics``); at a rollout's first step its log-probs
        are kept for the check."""
        import torch

        from ftkit.engines.policy import policy_logprobs, policy_logprobs_entropy
        from ftkit.train.rl.grpo import grpo_loss

        allowed, index = self.scoring.policy()
        learned = part["loss_mask"].to(self.ctx.device)
        logits = self.scoring.logits(self.ctx.model, tokens, pos, mask, emb)
        temperature = self.cfg.sampling.temperature  # the engines' (ftkit.engines.policy)
        logp, entropy = policy_logprobs_entropy(logits, tokens, allowed, index, learned > 0, temperature)
        ref = None
        if self.ctx.reference is not None:
            with torch.no_grad():
                ref_logits = self.scoring.logits(self.ctx.reference, tokens, pos, mask, None)
                ref = policy_logprobs(ref_logits, tokens, allowed, index, temperature)
        behaviour = part["logprobs"].to(logp.device)
        loss, terms = grpo_loss(logp, behaviour, part["advantages"], learned, norm, self.cfg.objective.grpo(), ref)
        if self._metrics is not None:
            self._metrics.add_shard(m, entropy, terms)
        if self._checks is not None:
            self._checks.append((logp.detach().cpu(), part["logprobs"], part["loss_mask"], part["witness_ids"]))
        return loss

    def _emit_check(self, task: StepTask) -> None:
        """``logprob_check``: this rank's recomputed log-probs of its micro-shards' samples (of
        every step of the rollout) vs the engines' recorded ones (``ftkit.train.rl.logprob_stats``),
        into the step's metric tables on every rank, logged by TP rank 0 only (every TP rank holds
        the same gathered logits)."""
        import torch

        from ftkit.train.rl.logprob_stats import compare_logprobs

        checks, self._checks = self._checks or [], None
        if not checks:
            return
        trainer, engine, mask, ids = (torch.cat([c[i] for c in checks]) for i in range(4))
        result = compare_logprobs(engine, trainer, mask)
        if self._metrics is not None:
            self._metrics.add_comparison(result, [int(i) % self.cfg.batch.samples_per_rollout for i in ids.tolist()])
        if self.ctx.tp_rank != 0:
            return
        emit.logprob_check(
            self.ctx.events,
            rollout=task.rollout,
            step=task.step,
            attempt=task.attempt,
            cell=self.ctx.cell,
            rank=self.ctx.rank,
            version=task.rollout,
            witness_ids=[int(i) for i in ids.tolist()],
            samples=[vars(x) for x in result.samples],
            positions=[vars(x) for x in result.positions],
            total=vars(result.step),
        )

    def _seed(self, seed: int) -> None:
        """Reseed this device's generator (``torch.manual_seed`` would also queue lazy seeds
        for every accelerator type, with a formatted stack each: ~0.5 ms per micro-shard)."""
        import torch

        torch.default_generator.manual_seed(seed)
        if self.ctx.device == "cuda":
            torch.cuda.manual_seed(seed)

    def _rows(self, k: int) -> Any:
        """A zeroed ``[k, numel]`` float32 gradient buffer, kept between steps (a fresh one
        per step would page-fault hundreds of MB in for a larger model)."""
        import torch

        buf = self._rows_buf
        if buf is None or buf.shape[0] != k:
            buf = self._rows_buf = torch.zeros(k, self.layout.numel, dtype=torch.float32, device=self.ctx.device)
            return buf
        return buf.zero_()

    def _bind_grads(self, row: Tensor) -> None:
        """Make every ``.grad`` (the witness's included) a view of the zeroed flat ``row`` (in
        bf16: of a zeroed bf16 staging row, landed in ``row`` after the backward,
        ``ftkit.train.rank.precision.GradStage``): autograd then accumulates in place."""
        self._stage.bind(row, self.ctx.model_params, self.ctx.witness_param)

    def _check_bound(self, row: Tensor) -> None:
        """Every gradient must still live in its buffer (autograd accumulated in place)."""
        if not self._stage.holds(row, self.ctx.model_params, self.ctx.witness_param):
            raise RuntimeError("a gradient left its micro-shard buffer (autograd replaced .grad)")

    def _mid_backward(self, at: dict[str, int]) -> tuple[list[str | None], Any] | None:
        """The ``mid_backward`` fault point as a gradient hook on the first parameter (its
        gradient comes last in the backward pass, so the rest is already computed): the
        kinds it returned and the hook handle. ``None`` when no fault is armed (no hook)."""
        from ftkit.train.faults.points import NoFaults

        if isinstance(self.ctx.faults, NoFaults):
            return None
        kinds: list[str | None] = []

        def hook(grad: Tensor) -> None:
            kinds.append(self.ctx.faults.at("mid_backward", **at))

        return kinds, self.ctx.model_params[0][1].register_hook(hook)

    def _faulty_allreduce(self, at: dict[str, int]) -> Any:
        """The link's all-reduce, with the ``during_reduce`` point before its second call
        (between the exact reduction's exponent and integer collectives)."""
        calls = [0]

        def allreduce(tensor: Tensor, op: str) -> None:
            calls[0] += 1
            if calls[0] == 2:
                self.ctx.faults.at("during_reduce", **at)
            self.ctx.link.allreduce(tensor, op)

        return allreduce
