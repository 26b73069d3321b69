"""Cross-cell gradient reduction: exact int64 fixed point (membership invariant) or plain float.

Every rank position (tp, pp) of every live cell holds, for each of its micro-shards, that
micro-shard's gradient of every local tensor, as one row of a ``[shards, numel]`` float32
buffer laid out by a ``GradLayout``. ``reduce_exact`` turns them into the sum over *all*
micro-shards of the step, bitwise identical whatever the alive set and whichever cell
computed which micro-shard:

1. per tensor, the exponent ``e`` with ``max|g_m| < 2**e`` over the cell's micro-shards;
   all-reduce MAX across cells -> the exponent over all ``M`` micro-shards (partition free);
   a non-finite flag rides in the same collective;
2. ``scale = 2**(61 - e - ceil(log2 M))`` (clamped to a normal float32); each micro-shard
   becomes ``q_m = round(g_m * scale)`` (exact in float32: a power-of-two scale only moves
   the exponent) cast to int64; ``|q_m| <= 2**61 / M``, so no sum of ``M`` of them can leave
   int64 (no wrap, by construction);
3. integer sum of the cell's ``q_m``, int64 all-reduce SUM across cells (integer addition
   is associative: any grouping, any order gives the same integer);
4. ``float32(sum) / scale`` (one correctly rounded conversion, then an exact power of two).

A non-finite gradient anywhere, or a sum that does not fit float32, is a collective
decision: every cell sees the same flags and the same integers, so every cell returns
``None`` together (the step is discarded, never committed).

``reduce_float`` sums the cell's micro-shards in float32 and all-reduces SUM in float32: fast,
but the bits depend on the grouping (not invariant).

``CrossCellGroup`` is the per-rank-position group over the alive cells, built directly on a
``PrefixStore(f"xcell/e{epoch}/r{rank}", store)`` (gloo on CPU, NCCL on CUDA): it is outside
the cell's own torch.distributed world, so ``new_group`` cannot make it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

# Exponent of an all-zero tensor: below any float32 exponent, so MAX ignores it.
ZERO_EXPONENT = -(1 << 20)
# int64 headroom: |q| <= 2**(INT_BITS - ceil(log2 M)), so a sum of M values stays < 2**62.
INT_BITS = 61
# The scale 2**shift must be a normal float32: a tensor whose largest gradient is below
# 2**(INT_BITS - MAX_SHIFT) (~1e-20) is quantised at 2**-127 instead of relative to its max.
MAX_SHIFT, MIN_SHIFT = 127, -126

AllReduce = Callable[[Any, str], None]   # allreduce(tensor, "sum" | "max"), in place, across cells


@dataclass(frozen=True)
class GradLayout:
    """Where each tensor lives in a flat gradient row: ``names[i]`` at ``offsets[i]``, ``shapes[i]``."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int

    @classmethod
    def of(cls, named_shapes: Sequence[tuple[str, Sequence[int]]]) -> "GradLayout":
        names, shapes, offsets, off = [], [], [], 0
        for name, shape in named_shapes:
            n = 1
            for d in shape:
                n *= int(d)
            names.append(name)
            shapes.append(tuple(int(d) for d in shape))
            offsets.append(off)
            off += n
        return cls(tuple(names), tuple(shapes), tuple(offsets), off)

    def segments(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each tensor in a flat row."""
        ends = list(self.offsets[1:]) + [self.numel]
        return list(zip(self.offsets, ends))

    def unflatten(self, flat: Any) -> dict[str, Any]:
        """Views of a flat ``[numel]`` tensor as ``{name: tensor of its shape}``."""
        return {n: flat[a:b].view(s) for n, s, (a, b) in zip(self.names, self.shapes, self.segments())}


def _ceil_log2(m: int) -> int:
    return (m - 1).bit_length()


def reduce_exact(shards: Any, layout: GradLayout, total_shards: int, allreduce: AllReduce) -> Any | None:
    """Exact sum over all micro-shards of the step: a float32 ``[numel]`` tensor, or ``None``.

    ``shards`` is this cell's ``[k, numel]`` float32 buffer on any device (k >= 1
    micro-shards; it is used as scratch space and overwritten; the result is on its device); ``total_shards`` is ``M`` of the config (the same on
    every cell). Collective: every cell of the group must call it for the same step with the
    same layout. Returns ``None`` on every cell when any gradient is non-finite or the sum
    overflows float32.
    """
    import torch

    dev = shards.device
    segs = layout.segments()
    amax = shards.abs().amax(dim=0)
    tops = torch.stack([amax[a:b].max() for a, b in segs])
    finite = bool(torch.isfinite(tops).all())
    # frexp: top = mant * 2**exp with mant in [0.5, 1), so every |g| of the tensor < 2**exp.
    exps = torch.frexp(tops).exponent.to(torch.int64)
    exps[(tops == 0) | ~torch.isfinite(tops)] = ZERO_EXPONENT
    head = torch.cat([exps, torch.tensor([0 if finite else 1], dtype=torch.int64, device=dev)])
    allreduce(head, "max")
    if int(head[-1]):
        return None

    e = head[:-1]
    shift = (INT_BITS - _ceil_log2(total_shards) - e).clamp(MIN_SHIFT, MAX_SHIFT)
    shift[e == ZERO_EXPONENT] = 0
    lengths = torch.tensor([b - a for a, b in segs], dtype=torch.int64, device=dev)
    ones = torch.ones(len(segs), dtype=torch.float32, device=dev)
    scale = torch.repeat_interleave(torch.ldexp(ones, shift.float()), lengths)
    # g * 2**shift is exact in float32 (only the exponent moves), round() is exact, and the
    # sum casts every element to int64 before adding.
    q = torch.sum(shards.mul_(scale).round_(), dim=0, dtype=torch.int64)
    allreduce(q, "sum")
    out = q.to(torch.float32).mul_(torch.repeat_interleave(torch.ldexp(ones, -shift.float()), lengths))
    if not bool(torch.isfinite(out).all()):
        return None  # the float32 sum overflowed: same integers everywhere, same decision
    return out


def reduce_float(shards: Any, allreduce: AllReduce) -> Any | None:
    """Float32 sum of the rows of ``shards`` (``[k, numel]``, the cell's micro-shards or one
    row they accumulated into; overwritten), float all-reduce SUM; ``None`` if non-finite.

    Not membership invariant (float addition is not associative). The finiteness decision
    is collective: all cells see the same all-reduced sum.
    """
    local = (shards.sum(dim=0) if shards.shape[0] > 1 else shards[0]).contiguous()
    allreduce(local, "sum")
    import torch

    return local if bool(torch.isfinite(local).all()) else None


class CrossCellGroup:
    """The process group of one rank position (tp, pp) across the alive cells of an epoch.

    ``alive`` is the set of live cells; this cell's rank in the group is its index in the
    sorted alive list. On CPU a ``ProcessGroupGloo``; on CUDA a ``ProcessGroupNCCL`` (host
    tensors are copied to the device for the collective and back).
    """

    def __init__(self, store: Any, epoch: int, rank: int, cell: int, alive: Sequence[int],
                 device: str = "cpu", timeout_s: float = 300.0) -> None:
        import datetime

        import torch.distributed as dist

        members = sorted(set(alive))
        if cell not in members:
            raise ValueError(f"cell {cell} is not in the alive set {members}")
        self.members = members
        self.device = device
        prefixed = dist.PrefixStore(f"xcell/e{epoch}/r{rank}", store)
        timeout = datetime.timedelta(seconds=timeout_s)
        if device == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, members.index(cell), len(members), opts)
        else:
            self.pg = dist.ProcessGroupGloo(prefixed, members.index(cell), len(members), timeout)

    def allreduce(self, tensor: Any, op: str) -> None:
        """In-place all-reduce of ``tensor`` with ``op`` ("sum" or "max") across the group."""
        import torch.distributed as dist

        opts = dist.AllreduceOptions()
        opts.reduceOp = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        if self.device == "cuda" and not tensor.is_cuda:   # NCCL needs device memory
            dev = tensor.cuda()
            self.pg.allreduce([dev], opts).wait()
            tensor.copy_(dev.cpu())
        else:
            self.pg.allreduce([tensor], opts).wait()
