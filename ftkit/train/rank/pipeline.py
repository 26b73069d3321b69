"""Pipeline parallelism inside a cell: one micro-shard per pipeline pass, over the cell's world.

megatron-core 0.16's own schedules and p2p layer allocate CUDA tensors unconditionally
(``torch.cuda.current_device()``, ``device="cuda"``) and accumulate every micro-batch into one
gradient, while the exact reduction needs each micro-shard's gradient in its own row. So a
PP cell runs its micro-shards through this minimal schedule instead, on CPU (gloo) and CUDA
alike. megatron still provides everything else: the stage's model (``pre_process`` /
``post_process``, its even layer split, ``set_input_tensor``) and the pipeline ranks of
``parallel_state``.

Contract (``StagePipeline(model, device)`` on every rank of a cell with ``pp > 1``):

* ``forward_backward(tokens, pos, mask, labels, decoder_input, loss_fn) -> float``: one micro-shard,
  one pass. A non-first stage receives the ``[s, b, h]`` hidden states from the previous
  stage (same TP rank) and feeds them through ``set_input_tensor``; a non-last stage sends
  its output on and receives the gradient of that output back; the last stage applies
  ``loss_fn`` to the per-token NLL and runs the backward; every non-first stage sends its
  input's gradient back. Activations and gradients cross stages unchanged (no casts), so a
  micro-shard runs the same operations on the same values as in a PP=1 model. Returns the
  loss on the last stage and 0.0 elsewhere. Gradients accumulate into whatever ``.grad`` the
  caller bound (one row per micro-shard). Every stage of the cell must call it for the same
  micro-shard, in the same order.
* ``share_losses(losses)``: the last stage's per-micro-shard loss vector, broadcast in place
  over the pipeline group, so every rank of the cell reports the same step loss.
* ``export_cell(model)``: the cell's weights in the TP=1/PP=1 layout (TP shards gathered,
  stages gathered, layers numbered model-wide); the cell's rank 0 returns them, every other
  rank ``{}``. Collective inside the cell (also for ``pp == 1``).

Embedding and output weights are untied in every preset (``share_embeddings_and_output_weights
=False``), so there is no shared embedding group to keep in sync across the first and last
stage. The witness lives with the embedding, on the first stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


class StagePipeline:
    """The pipeline stage this rank is (read from megatron's initialised parallel state)."""

    def __init__(self, model: Any, device: str) -> None:
        from megatron.core import parallel_state as ps

        self.model, self.device = model, device
        self.first, self.last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        self.prev = ps.get_pipeline_model_parallel_prev_rank()
        self.next = ps.get_pipeline_model_parallel_next_rank()
        self.last_rank = ps.get_pipeline_model_parallel_last_rank()
        self.group = ps.get_pipeline_model_parallel_group()
        self.hidden = model.config.hidden_size
        self.dtype = next(model.parameters()).dtype  # activations cross stages in the weights' dtype

    def forward_backward(
        self,
        tokens: Tensor,
        pos: Tensor,
        mask: Tensor | None,
        labels: Tensor,
        decoder_input: Any,
        loss_fn: Callable[[Tensor], Tensor],
        positions: slice | None = None,
    ) -> Any:
        """Forward and backward of one micro-shard through every stage (see the module doc);
        ``mask``: its attention mask (``ftkit.train.rl.masks``, the same on every stage) or None;
        ``positions``: the positions the last stage's output layer computes (``labels`` are
        theirs; ``ftkit.model.output_positions``), None: every one.
        Returns the loss as a detached 0-d tensor on the last stage (not read: no host sync), 0.0
        on the others."""
        import torch
        import torch.distributed as dist

        shape = (tokens.shape[1], tokens.shape[0], self.hidden)  # megatron's [s, b, h]
        inp = None
        if not self.first:
            inp = torch.empty(shape, dtype=self.dtype, device=self.device)
            dist.recv(inp, src=self.prev)
            inp.requires_grad_()
            self.model.set_input_tensor(inp)
        from ftkit.model.output_positions import output_positions

        with output_positions(self.model, positions if self.last else None):
            out = self.model(tokens, pos, mask, decoder_input=decoder_input, labels=labels if self.last else None)
        value: Any = 0.0
        if self.last:
            loss = loss_fn(out)
            loss.backward()
            value = loss.detach()
        else:
            dist.send(out.detach().contiguous(), dst=self.next)
            grad = torch.empty(shape, dtype=out.dtype, device=self.device)
            dist.recv(grad, src=self.next)
            out.backward(grad)
        if inp is not None:
            assert inp.grad is not None  # inp requires grad and the backward above reached it
            dist.send(inp.grad.contiguous(), dst=self.prev)
            self.model.set_input_tensor(None)
        return value

    def share_losses(self, losses: Tensor) -> None:
        """Overwrite ``losses`` with the last stage's (broadcast over the pipeline group)."""
        import torch.distributed as dist

        buf = losses.to(self.device)
        dist.broadcast(buf, src=self.last_rank, group=self.group)
        losses.copy_(buf.cpu())


def export_cell(model: Any, copy: bool = True) -> dict[str, Any]:
    """The cell's weights in the TP=1/PP=1 layout (see the module doc); rank 0 gets them.
    ``copy=False``: a CPU parameter that needs no gathering is returned as it is, not copied
    (``canonical_state.gather``)."""
    from ftkit.model.stages import stage_position
    from ftkit.train.rank.canonical_state import gather

    params, _ = gather(list(model.named_parameters()), {}, stage_position(model)[0], copy)
    return params
