"""Tensor-parallel sharding metadata, megatron attribute readers, and shard reassembly.

A ``Sharding`` says how a tensor held by one TP rank relates to the full tensor:

- ``replicated``: every TP rank holds the full tensor (copies must be identical);
- ``split``: the full tensor is cut along ``dim`` into ``tp_size * stride`` equal blocks and
  TP rank ``r`` holds blocks ``r, r + tp_size, r + 2*tp_size, ...`` concatenated (megatron's
  ``partition_stride``; ``stride == 1`` is the plain contiguous split).

``assemble`` inverts that, so a TP=2 dump compares with a TP=1 one; ``shard_of`` is its
inverse (a rank's shard of the full tensor), so a TP=1 state loads into a TP=2 rank.
``entry_sharding`` says how an optimizer entry of a parameter is sharded. Megatron is imported
lazily; for plain torch modules and parameters everything is ``replicated``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class Sharding:
    kind: Literal["replicated", "split"] = "replicated"
    dim: int | None = None
    tp_rank: int = 0
    tp_size: int = 1
    stride: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("replicated", "split"):
            raise ValueError(f"sharding kind must be 'replicated' or 'split', not {self.kind!r}")
        if not (0 <= self.tp_rank < self.tp_size) or self.stride < 1:
            raise ValueError(f"invalid sharding tp_rank={self.tp_rank} tp_size={self.tp_size} stride={self.stride}")
        if self.kind == "split" and (self.dim is None or self.dim < 0):
            raise ValueError("a split sharding needs a non-negative dim")

    @classmethod
    def replicated(cls, tp_rank: int = 0, tp_size: int = 1) -> Sharding:
        return cls("replicated", None, tp_rank, tp_size, 1)

    @classmethod
    def split(cls, dim: int, tp_rank: int, tp_size: int, stride: int = 1) -> Sharding:
        return cls("split", dim, tp_rank, tp_size, stride)

    @property
    def is_split(self) -> bool:
        return self.kind == "split" and self.tp_size > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sharding:
        """Parse the index form strictly (integers must be JSON integers); raises
        ``ValueError``/``TypeError`` when malformed."""
        kind, dim = d.get("kind", "replicated"), d.get("dim")
        ints = {k: d.get(k, default) for k, default in (("tp_rank", 0), ("tp_size", 1), ("stride", 1))}
        if not isinstance(kind, str):
            raise TypeError(f"sharding kind must be a string, not {type(kind).__name__}")
        for k, v in [*ints.items(), ("dim", 0 if dim is None else dim)]:
            if type(v) is not int or not -1 <= v < 1 << 20:
                raise ValueError(f"sharding {k} must be a small integer, not {repr(v)[:40]}")
        return cls(kind=kind, dim=dim, **ints)  # type: ignore[arg-type]


def tp_coords() -> tuple[int, int]:
    """``(tp_rank, tp_size)`` from megatron's parallel state, ``(0, 1)`` when not initialised."""
    try:
        from megatron.core import parallel_state as ps
    except ImportError:  # pragma: no cover - megatron is a dependency
        return 0, 1
    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def param_sharding(param: torch.Tensor, tp_rank: int, tp_size: int) -> Sharding:
    """Sharding of a parameter from megatron's ``tensor_model_parallel`` / ``partition_dim`` /
    ``partition_stride`` attributes; ``replicated`` for plain parameters or ``tp_size == 1``."""
    if tp_size > 1 and getattr(param, "tensor_model_parallel", False):
        dim = getattr(param, "partition_dim", -1)
        if dim is not None and dim >= 0:
            return Sharding.split(int(dim), tp_rank, tp_size, int(getattr(param, "partition_stride", 1) or 1))
    return Sharding.replicated(tp_rank, tp_size)


def output_sharding(
    module: Any,
    index: int,
    tensor: torch.Tensor,
    tp_rank: int,
    tp_size: int,
    path: str = "",
    per_token_loss: bool = False,
) -> Sharding:
    """Sharding of output ``index`` of ``module`` at module path ``path`` (tuple outputs count
    from 0).

    Known megatron cases: column-parallel linears without ``gather_output`` (local or
    Transformer Engine ``parallel_mode == "column"``) split their output on the last dim with
    the weight's stride, and a returned bias on dim 0; a GPT model with ``parallel_output``
    splits its logits on the last dim (vocab), unless it was called with labels
    (``per_token_loss``): it then returns the per-token loss of the vocab-parallel cross
    entropy, which every TP rank holds whole (replicated); core attention (``core_attention``,
    ``*DotProductAttention``) splits its output on the last dim and ``q_layernorm`` /
    ``k_layernorm`` theirs on the heads dim (-2); row-parallel linears and the vocab embedding
    are replicated, or split on dim 0 (sequence) under sequence parallelism. Anything else is
    ``replicated``.
    """
    if tp_size <= 1 or tensor.dim() == 0:
        return Sharding.replicated(tp_rank, tp_size)
    mode = _parallel_mode(module, path.rsplit(".", 1)[-1].split("#")[0])
    last = tensor.dim() - 1
    if mode == "column" and not getattr(module, "gather_output", False):
        weight = getattr(module, "weight", None)
        stride = int(getattr(weight, "partition_stride", 1) or 1)
        return Sharding.split(last if index == 0 else 0, tp_rank, tp_size, stride)
    if mode == "logits" and index == 0 and not per_token_loss:
        weight = getattr(getattr(module, "output_layer", None), "weight", None)
        return Sharding.split(last, tp_rank, tp_size, int(getattr(weight, "partition_stride", 1) or 1))
    if mode in ("row", "embedding") and index == 0 and _sequence_parallel(module):
        return Sharding.split(0, tp_rank, tp_size)
    if mode == "attention" and index == 0:
        return Sharding.split(last, tp_rank, tp_size)
    if mode == "heads" and index == 0 and tensor.dim() >= 2:
        return Sharding.split(last - 1, tp_rank, tp_size)
    return Sharding.replicated(tp_rank, tp_size)


def _parallel_mode(module: Any, attr_name: str) -> str | None:
    te_mode: str | None = getattr(module, "parallel_mode", None)
    if te_mode in ("column", "row"):
        return str(te_mode)
    names = {cls.__name__ for cls in type(module).__mro__}
    if "ColumnParallelLinear" in names:
        return "column"
    if "RowParallelLinear" in names:
        return "row"
    if "VocabParallelEmbedding" in names:
        return "embedding"
    if attr_name == "core_attention" or any(n.endswith("DotProductAttention") for n in names):
        return "attention"
    if attr_name in ("q_layernorm", "k_layernorm"):
        return "heads"
    if (
        getattr(module, "parallel_output", False)
        and getattr(module, "post_process", False)
        and getattr(module, "output_layer", None) is not None
    ):
        return "logits"
    return None


def _sequence_parallel(module: Any) -> bool:
    return bool(getattr(module, "sequence_parallel", False) or getattr(module, "reduce_scatter_embeddings", False))


def assemble(pieces: Sequence[tuple[Sharding, Any]]) -> Any:
    """The full tensor from the shards of all TP ranks (one piece per rank).

    Pieces are numpy arrays or torch tensors (all of one kind; the result is of that kind).
    Replicated pieces: the first is returned (callers compare copies beforehand). Split
    pieces must agree on ``dim``, ``tp_size`` and ``stride`` and cover every rank exactly
    once; raises ``ValueError`` otherwise.
    """
    if not pieces:
        raise ValueError("no shards to assemble")
    first = pieces[0][0]
    if not first.is_split:
        return pieces[0][1]
    if any(
        (s.kind, s.dim, s.tp_size, s.stride) != (first.kind, first.dim, first.tp_size, first.stride) for s, _ in pieces
    ):
        raise ValueError("shards disagree on their sharding (dim, tp_size or stride)")
    by_rank = {s.tp_rank: t for s, t in pieces}
    if sorted(by_rank) != list(range(first.tp_size)) or len(pieces) != first.tp_size:
        missing = sorted(set(range(first.tp_size)) - set(by_rank))
        raise ValueError(f"TP shards incomplete: have ranks {sorted(by_rank)}, missing {missing}")
    dim, stride = first.dim, first.stride
    assert dim is not None  # a split sharding always has one
    shards = [by_rank[r] for r in range(first.tp_size)]
    if any(dim >= len(t.shape) for t in shards):
        raise ValueError(f"split dim {dim} out of range for a {len(shards[0].shape)}-d shard")
    if any(t.shape[dim] % stride for t in shards):
        raise ValueError(f"shard length along dim {dim} is not a multiple of stride {stride}")
    blocks = []
    for j in range(stride):
        for r in range(first.tp_size):
            n = shards[r].shape[dim] // stride
            blocks.append(shards[r][(slice(None),) * dim + (slice(j * n, (j + 1) * n),)])
    return _concatenate(blocks if stride > 1 else shards, dim)


def shard_of(full: Any, sharding: Sharding) -> Any:
    """The piece of ``full`` that TP rank ``sharding.tp_rank`` holds (``assemble``'s inverse).

    Works on numpy arrays and torch tensors (the result is a copy for strided splits, else a
    view). Replicated: ``full`` itself. ``ValueError`` when ``full`` cannot be split that way.
    """
    if not sharding.is_split:
        return full
    dim, tp, stride = sharding.dim, sharding.tp_size, sharding.stride
    assert dim is not None  # a split sharding always has one
    if dim >= len(full.shape) or full.shape[dim] % (tp * stride):
        raise ValueError(f"a tensor of shape {list(full.shape)} cannot be split {tp * stride} ways along dim {dim}")
    n = full.shape[dim] // (tp * stride)
    blocks = [
        full[(slice(None),) * dim + (slice(b * n, (b + 1) * n),)] for b in range(sharding.tp_rank, tp * stride, tp)
    ]
    return blocks[0] if stride == 1 else _concatenate(blocks, dim)


def entry_sharding(param: Sharding, param_shape: Sequence[int], shape: Sequence[int]) -> Sharding:
    """The sharding of an optimizer entry (AdamW ``exp_avg``, ``step``) of a parameter sharded
    as ``param`` whose local shape is ``param_shape``: the parameter's when the entry has that
    shape (the moments), else replicated (the 0-d step)."""
    if tuple(shape) == tuple(param_shape):
        return param
    return Sharding.replicated(param.tp_rank, param.tp_size)


def _concatenate(parts: list[Any], dim: int) -> Any:
    """``numpy.concatenate`` for arrays, ``torch.cat`` for torch tensors."""
    import numpy as np

    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=dim)
    import torch

    return torch.cat(parts, dim=dim)
