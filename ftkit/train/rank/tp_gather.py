"""The full-vocabulary logits of a TP shard's ``[b, s, V/tp]`` output, on CPU (gloo) and CUDA.

megatron-core's ``gather_from_tensor_model_parallel_region`` allocates its buffer on
``torch.cuda.current_device()``, so it cannot run on a CPU cell. ``gather_vocab(logits)``
all-gathers the last dimension over the tensor-parallel group in rank order (the vocabulary
split of megatron's output layer); its backward hands each rank the gradient of its own slice,
the gradient the output layer would get had it computed the full logits itself.
"""

from __future__ import annotations

from typing import Any

import torch


class _GatherVocab(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        size = ps.get_tensor_model_parallel_world_size()
        ctx.rank, ctx.width = ps.get_tensor_model_parallel_rank(), shard.shape[-1]
        parts = [torch.empty_like(shard) for _ in range(size)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width].contiguous()


def gather_vocab(logits: torch.Tensor) -> Any:
    """``[..., V]`` from this TP rank's ``[..., V/tp]`` (see the module docstring)."""
    return _GatherVocab.apply(logits)
