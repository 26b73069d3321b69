"""The trainer's policy log-probs outside the loss: the logits it reads, the canary set, the
rest of a rollout's log-prob check (docs/rl.md, "The on-policy proof").

``PolicyScoring(ctx)`` holds, for one rank, the run's task and the policy's response tokens
(built once) and computes:

- ``logits(model, tokens, pos, mask, emb)``: ``[b, r, V]`` logits at the positions that predict
  the response tokens only (``window``, ``ftkit.model.output_positions``), gathered over TP ranks:
  the GRPO loss, the reference, the canaries and the checks read nothing else, and the megatron
  engine scores the same positions, so its log-probs stay bitwise the trainer's;
- ``score_canaries(task)``: ``canary_logprobs`` at a rollout's first step;
- ``score_rest(batch, mine, slices, reused)``: the log-probs of the rollout's micro-shards that
  the step's own forward passes do not cover.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.rank.context import RankContext
    from ftkit.train.rank.step_types import StepTask


class PolicyScoring:
    """The trainer's policy scoring of one rank (see the module docstring)."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self._policy_tokens: tuple[Any, Any] | None = None
        self._task_obj: Any = None

    def logits(self, model: Any, tokens: Tensor, pos: Tensor, mask: Tensor | None, emb: Tensor | None) -> Any:
        """``[b, r, V]`` logits of the whole (padded) vocabulary at the ``r`` positions that predict
        the response tokens (``_window``), gathered over TP ranks; ``mask``: the attention mask of
        the rows (``ftkit.train.rl.masks``) or None."""
        from ftkit.model.output_positions import output_positions

        with output_positions(model, self.window()):
            logits = model(tokens, pos, mask, decoder_input=emb)
        if self.cfg.layout.tp > 1:
            from ftkit.train.rank.tp_gather import gather_vocab

            logits = gather_vocab(logits)
        return logits

    def window(self) -> slice | None:
        """The positions whose logits are read (``ftkit.model.output_positions.scored``): those
        that predict a row's ``response_len`` response tokens, where every loss, log-prob check
        and canary reads; the engines' scoring keeps the same ones."""
        from ftkit.model.output_positions import scored

        return scored(self.task().response_len)

    def policy(self) -> tuple[Any, Any]:
        """The task's response tokens and their index (``ftkit.engines.policy``), built once."""
        if self._policy_tokens is None:
            import torch

            from ftkit.engines.policy import allowed_index

            allowed = self.task().response_tokens
            vocab = self.ctx.model.vocab_size
            self._policy_tokens = (torch.tensor(allowed, dtype=torch.int64), allowed_index(allowed, vocab))
        return self._policy_tokens

    def task(self) -> Any:
        """The run's task (through the model's tokenizer for a model path), built once."""
        if self._task_obj is None:
            self._task_obj = self.ctx.plan.task.build()
        return self._task_obj

    def score_canaries(self, task: StepTask) -> None:
        """``canary_logprobs`` of this cell at a rollout's first step: the canary set scored
        under the weights the engines generated the rollout with (``ftkit.train.rl.canary``).
        Collective over the TP group (the logits are gathered), so every TP rank calls it."""
        import torch

        from ftkit.engines.policy import policy_logprobs
        from ftkit.train.rl.canary import canary_fields, canary_tokens
        from ftkit.train.rl.engines import GEN_CHUNK
        from ftkit.train.rl.masks import sequence_mask

        allowed, index = self.policy()
        tokens, mask = canary_tokens(self.task(), self.cfg.rng.seed, GEN_CHUNK)
        tokens = tokens.to(self.ctx.device)
        pos = torch.arange(tokens.shape[1], device=self.ctx.device).unsqueeze(0).expand_as(tokens)
        attention = sequence_mask(self.task(), tokens)
        with torch.no_grad():
            lp = policy_logprobs(self.logits(self.ctx.model, tokens, pos, attention, None), tokens, allowed, index)
        if self.ctx.tp_rank == 0:
            emit.canary_logprobs(
                self.ctx.events,
                rollout=task.rollout,
                version=task.rollout,
                cell=self.ctx.cell,
                rank=self.ctx.rank,
                **canary_fields(lp, mask),
            )

    def score_rest(
        self, batch: dict[str, Tensor], mine: list[int], slices: list[slice], reused: set[int]
    ) -> list[tuple[Any, Any, Any, Any]]:
        """At a rollout's first step, also score (no gradient, no witness: nothing is trained)
        this step's micro-shards reused from a discarded attempt (their forward did not run) and
        this rank's micro-shards of the rollout's later steps (unless the batch holds one step
        only): the weights are still the ones the engines sampled with, so every sample of the
        rollout is compared once the cells' shares are put together. Returns ``(trainer
        log-probs, recorded, mask, ids)`` per micro-shard scored, for ``logprob_check``."""
        import torch

        from ftkit.engines.policy import policy_logprobs
        from ftkit.train.rl.masks import sequence_mask

        cfg, checks = self.cfg, []
        whole = batch["tokens"].shape[0] == cfg.batch.samples_per_rollout
        allowed, index = self.policy()
        n = cfg.batch.step_samples
        for k in range(cfg.batch.steps_per_rollout if whole else 1):
            for m in mine if k else sorted(reused):
                rows = slice(k * n + slices[m].start, k * n + slices[m].stop)
                tokens = batch["tokens"][rows].to(self.ctx.device)
                pos = torch.arange(tokens.shape[1], device=self.ctx.device).unsqueeze(0).expand_as(tokens)
                attention = sequence_mask(self.task(), tokens)
                with torch.no_grad():
                    logits = self.logits(self.ctx.model, tokens, pos, attention, None)
                    lp = policy_logprobs(logits, tokens, allowed, index, cfg.sampling.temperature)
                checks.append((lp.cpu(), batch["logprobs"][rows], batch["loss_mask"][rows], batch["witness_ids"][rows]))
        return checks
