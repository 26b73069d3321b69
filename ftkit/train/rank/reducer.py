"""Cross-cell gradient reduction: exact int64 fixed point (membership invariant) or plain float.

Every rank position (tp, pp) of every live cell holds, for each of its micro-shards, that
micro-shard's gradient of every local tensor, as one row of a ``[shards, numel]`` float32
buffer laid out by a ``GradLayout``. ``ExactReducer.reduce`` turns them into the sum over *all*
micro-shards of the step, bitwise identical whatever the alive set and whichever cell
computed which micro-shard:

1. per tensor, the exponent ``e`` with ``max|g_m| < 2**e`` over the cell's micro-shards;
   all-reduce MAX across cells -> the exponent over all ``M`` micro-shards (partition free);
   a non-finite flag rides in the same collective;
2. ``scale = 2**(52 - e - ceil(log2 M))`` (clamped to a normal float32); each micro-shard
   becomes ``q_m = round(g_m * scale)``, an integer (exact in float32: a power-of-two scale
   only moves the exponent); ``|q_m| <= 2**52 / M``, so no sum of ``M`` of them can exceed
   2**52 (no wrap, no rounding, by construction); the quantum is ``2**-49`` of the tensor's
   largest gradient for M = 8, far below float32's own resolution;
3. the cell's integer sum (accumulated in float64, which holds every such integer exactly,
   so without a ``[k, numel]`` int64 temporary), converted to int64, and an int64
   all-reduce SUM across cells (integer addition is associative: any grouping, any order
   gives the same integer);
4. ``float32(sum) / scale`` (one correctly rounded conversion, then an exact power of two).

A non-finite gradient anywhere, or a sum that does not fit float32, is a collective
decision: every cell sees the same flags and the same integers, so every cell returns
``None`` together (the step is discarded, never committed).

``reduce_float`` sums the cell's micro-shards in float32 and all-reduces SUM in float32: fast,
but the bits depend on the grouping (not invariant).

The collectives themselves (``allreduce(tensor, op)``) come from the caller: in training, a
``ftkit.train.rank.crosscell.CrossCellLink`` over the alive cells of the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftkit.train.rank.exact_kernels import column_tops, dequantize, per_element, quantize_sum

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import Tensor

# Exponent of an all-zero tensor: below any float32 exponent, so MAX ignores it.
ZERO_EXPONENT = -(1 << 20)
# Fixed-point range: |q_m| <= 2**(INT_BITS - ceil(log2 M)), so a sum of at most M of them is
# an integer of magnitude <= 2**52: exact in int64 and in float64 (53-bit significand) alike.
INT_BITS = 52
# The scale 2**shift must be a normal float32: a tensor whose largest gradient is below
# 2**(INT_BITS - MAX_SHIFT) (~1e-20) is quantised at 2**-127 instead of relative to its max.
MAX_SHIFT, MIN_SHIFT = 127, -126

AllReduce = Callable[[Any, str], None]  # allreduce(tensor, "sum" | "max"), in place, across cells


@dataclass(frozen=True)
class GradLayout:
    """Where each tensor lives in a flat gradient row: ``names[i]`` at ``offsets[i]``, ``shapes[i]``."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int

    @classmethod
    def of(cls, named_shapes: Sequence[tuple[str, Sequence[int]]]) -> GradLayout:
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

    def unflatten(self, flat: Tensor) -> dict[str, Any]:
        """Views of a flat ``[numel]`` tensor as ``{name: tensor of its shape}``."""
        return {n: flat[a:b].view(s) for n, s, (a, b) in zip(self.names, self.shapes, self.segments())}


def _ceil_log2(m: int) -> int:
    return (m - 1).bit_length()


class ExactReducer:
    """The exact reduction of one rank position, with its workspace kept between steps.

    ``reduce(shards, allreduce)`` returns the exact sum over all ``total_shards``
    micro-shards of the step (float32 ``[numel]`` on the rows' device), or ``None`` on every
    cell together when a gradient is non-finite or the sum overflows float32. ``shards`` is
    this cell's ``[k, numel]`` float32 buffer (k >= 1), only read. The result is valid until the
    next ``reduce`` (on CPU it is a workspace buffer). Collective: every cell of the group calls
    it for the same step with the same layout.

    Cost: one read pass over the rows for the exponents, one read of the rows and one write
    of the int64 sums for the quantisation, one pass over the sums for the result. On CPU the
    kernels are numpy ufuncs applied window by window (at most ``WINDOW`` elements; the
    exponents take one ``reduceat`` per window, the scaling one multiply per tensor piece), so
    the scaled, rounded and accumulated rows of a window stay in the core's cache between the
    operations instead of making a memory pass each; every large buffer is allocated once (a
    fresh one per step would page-fault it in again), and the integer sums are all-reduced a
    chunk of at most ``CHUNK`` elements at a time, so the int64 workspace and each collective
    are 64 MiB whatever the model's size (the float32 result is the only model-sized buffer).
    On other devices each pass is one fused kernel (``ftkit.train.rank.exact_kernels``) and the
    sums take one collective. Both kernel sets compute the same bits (``numpy_kernels=False``
    selects the fused ones on CPU; a test compares them).
    """

    def __init__(self, layout: GradLayout, total_shards: int, numpy_kernels: bool = True) -> None:
        self.layout, self.total_shards = layout, int(total_shards)
        self.segs = layout.segments()
        self.numpy_kernels = numpy_kernels
        self.windows = _windows(self.segs, WINDOW)
        self.chunks = _chunks(self.windows, CHUNK)
        self._work: dict[str, Any] = {}

    def _buf(self, name: str, dtype: torch.dtype, device: torch.device, size: int) -> Any:
        import torch

        buf = self._work.get(name)
        if buf is None or buf.device != device or buf.dtype != dtype or buf.numel() != size:
            buf = self._work[name] = torch.empty(size, dtype=dtype, device=device)
        return buf

    def _numpy(self, shards: Tensor) -> bool:
        return self.numpy_kernels and shards.device.type == "cpu"

    def _lengths(self, device: torch.device) -> Tensor:
        """The tensors' element counts, an int64 vector on ``device`` (made once per device)."""
        import torch

        key = f"lengths:{device}"
        if key not in self._work:
            self._work[key] = torch.tensor([b - a for a, b in self.segs], dtype=torch.int64, device=device)
        lengths: Tensor = self._work[key]
        return lengths

    def exponents(self, shards: Tensor) -> tuple[list[int], bool]:
        """Per tensor, ``e`` with every ``|g| < 2**e`` over the rows (``ZERO_EXPONENT`` for an
        all-zero tensor), and whether every value is finite."""
        import torch

        if self._numpy(shards):
            tops = torch.from_numpy(_np_tops(shards.numpy(), self.windows, len(self.segs)))
        else:
            # one fused pass over the rows, then one segmented max (both propagate NaN)
            tops = torch.segment_reduce(column_tops(shards), "max", lengths=self._lengths(shards.device), initial=0)
        finite = bool(torch.isfinite(tops).all())
        # frexp: top = mant * 2**exp with mant in [0.5, 1), so every |g| < 2**exp.
        exps = torch.frexp(tops).exponent.to(torch.int64)
        exps[(tops == 0) | ~torch.isfinite(tops)] = ZERO_EXPONENT
        return exps.tolist(), finite

    def reduce(self, shards: Tensor, allreduce: AllReduce, side: Tensor | None = None) -> Any | None:
        """The exact sum (see the class docstring), or ``None``.

        ``side``: an optional float64 CPU vector in which every slot has at most one non-zero
        contributor across the cells (the per-micro-shard losses: each set by the cell that
        computed the micro-shard, 0.0 elsewhere). It rides in the int64 SUM as raw bits (a
        sum with zeros is the contributor's bit pattern) and is overwritten with the merged
        values, saving a collective. Left untouched when the result is ``None``.
        """
        import torch

        dev = shards.device
        exps, finite = self.exponents(shards)
        head = torch.tensor(exps + [0 if finite else 1], dtype=torch.int64, device=dev)
        allreduce(head, "max")
        agreed = head.tolist()
        if agreed[-1]:
            return None
        log_m = _ceil_log2(self.total_shards)
        shifts = [
            0 if e == ZERO_EXPONENT else min(MAX_SHIFT, max(MIN_SHIFT, INT_BITS - log_m - e)) for e in agreed[:-1]
        ]
        n = self.layout.numel
        # g * 2**shift is exact in float32 (only the exponent moves) and round() is exact: every
        # row becomes integers of magnitude <= 2**INT_BITS / M. Their sums over any subset of the
        # M micro-shards are integers of magnitude <= 2**52, so float64 (numpy kernels) and int64
        # (fused kernels) add them exactly, in any order; and integer sums do not depend on how
        # the elements are cut into collectives.
        if self._numpy(shards):
            out = self._buf("out", torch.float32, dev, n)
            self._np_reduce(shards.numpy(), shifts, allreduce, out.numpy(), side)
        else:
            lengths = self._lengths(dev)
            tail = torch.zeros(0, dtype=torch.int64, device=dev) if side is None else side.view(torch.int64).to(dev)
            qbuf = quantize_sum(shards, per_element([2.0**k for k in shifts], lengths, n), tail)
            allreduce(qbuf, "sum")
            if side is not None:
                side.view(torch.int64).copy_(qbuf[n:])
            out = dequantize(qbuf[:n], per_element([2.0**-k for k in shifts], lengths, n))
        for (a, b), e in zip(self.segs, agreed[:-1]):
            # |sum| < M * 2**e: only a tensor that close to float32's limit can overflow
            if e != ZERO_EXPONENT and e + log_m > 127 and not bool(torch.isfinite(out[a:b]).all()):
                return None  # same integers everywhere, same decision
        return out

    def _np_reduce(
        self, x: np.ndarray, shifts: list[int], allreduce: AllReduce, out: np.ndarray, side: Tensor | None
    ) -> None:
        """The CPU kernels' quantise, integer all-reduce and dequantise, one chunk of at most
        ``CHUNK`` elements at a time (``side`` rides in the last chunk's collective): the int64
        buffer and each all-reduce are a chunk's, not the model's."""
        import torch

        extra = 0 if side is None else side.numel()
        width = max(end - base for base, end, _ in self.chunks)
        qbuf = self._buf("q", torch.int64, torch.device("cpu"), width + extra)
        for i, (base, end, windows) in enumerate(self.chunks):
            q = qbuf[: end - base]
            _np_quantize(x, shifts, windows, q.numpy(), base)
            buf = q
            if side is not None and i == len(self.chunks) - 1:
                buf = qbuf[: end - base + extra]
                buf[end - base :].copy_(side.view(torch.int64))
            allreduce(buf, "sum")
            if buf is not q:
                side.view(torch.int64).copy_(buf[end - base :])  # type: ignore[union-attr]  # side is set
            _np_dequantize(q.numpy(), shifts, windows, out, base)


# Elements per window of the CPU kernels: k float32 rows, a float64 and an int64 row of one
# window stay in a core's L2 cache for the few k (micro-shards per cell) of a step.
WINDOW = 1 << 15
# Elements per integer all-reduce of the CPU kernels (64 MiB of int64): the workspace and each
# collective stay this size whatever the model's (a 135M-parameter model's int64 sums are 1 GiB).
CHUNK = 1 << 23


class _Window:
    """A flat range ``[start, end)`` of at most ``WINDOW`` elements and the tensor ``pieces``
    ``(a, b, tensor index)`` in it (small tensors share a window, a large one spans several),
    with the pieces' ``starts`` relative to ``start`` (for ``reduceat``) and ``owners``."""

    __slots__ = ("start", "end", "pieces", "starts", "owners")

    def __init__(self, start: int, end: int, pieces: list[tuple[int, int, int]]) -> None:
        import numpy as np

        self.start, self.end, self.pieces = start, end, pieces
        self.starts = np.array([a - start for a, _, _ in pieces], dtype=np.intp)
        self.owners = np.array([i for _, _, i in pieces], dtype=np.intp)


def _windows(segs: Sequence[tuple[int, int]], width: int) -> list[_Window]:
    """The flat range cut into windows of at most ``width`` elements, at tensor boundaries
    where a tensor ends inside one."""
    cuts: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    for i, (a, b) in enumerate(segs):
        while a < b:
            if not cuts or cuts[-1][1] - cuts[-1][0] >= width:
                cuts.append((a, a, []))
            start, _, pieces = cuts[-1]
            stop = min(b, start + width)
            pieces.append((a, stop, i))
            cuts[-1] = (start, stop, pieces)
            a = stop
    return [_Window(*c) for c in cuts]


def _chunks(windows: list[_Window], width: int) -> list[tuple[int, int, list[_Window]]]:
    """Consecutive windows grouped into ``(start, end, windows)`` chunks of at most ``width``
    elements (at least one window each; one empty chunk when there are no windows)."""
    out: list[tuple[int, int, list[_Window]]] = []
    for w in windows:
        if out and w.end - out[-1][0] <= width:
            start, _, ws = out[-1]
            out[-1] = (start, w.end, [*ws, w])
        else:
            out.append((w.start, w.end, [w]))
    return out or [(0, 0, [])]


def _np_tops(x: np.ndarray, windows: list[_Window], count: int) -> Any:
    """Per tensor ``max(max(g), -min(g))`` over the rows of ``x`` (NaN propagates)."""
    import numpy as np

    his, los = [], []
    for w in windows:
        blk = x[:, w.start : w.end]
        his.append(np.maximum.reduceat(blk, w.starts, axis=1).max(axis=0))
        los.append(np.minimum.reduceat(blk, w.starts, axis=1).min(axis=0))
    owners = np.concatenate([w.owners for w in windows]) if windows else np.zeros(0, dtype=np.intp)
    hi = np.zeros(count, dtype=np.float32)  # max(0, max g) and min(0, min g): an empty
    lo = np.zeros(count, dtype=np.float32)  # tensor tops at 0, like an all-zero one
    if windows:
        np.maximum.at(hi, owners, np.concatenate(his))  # np.maximum / np.minimum propagate NaN
        np.minimum.at(lo, owners, np.concatenate(los))
    return np.maximum(hi, -lo)


def _np_quantize(x: np.ndarray, shifts: list[int], windows: list[_Window], q: np.ndarray, base: int = 0) -> None:
    """``q[i - base] = sum_rows(round(x[:, i] * 2**shift))`` as int64 over the windows' elements
    ``i``, window by window (in cache)."""
    import numpy as np

    k = x.shape[0]
    width = max((w.end - w.start for w in windows), default=0)
    scaled = np.empty((k, width), dtype=np.float32)
    acc = np.empty(width, dtype=np.float64)
    scale = np.ldexp(np.float32(1), np.array(shifts, dtype=np.int32))  # exact powers of two
    for w in windows:
        n = w.end - w.start
        buf = scaled[:, :n]
        for a, b, i in w.pieces:  # a scalar per piece: cheaper than gathering a per-element scale
            np.multiply(x[:, a:b], scale[i], out=buf[:, a - w.start : b - w.start])
        np.rint(buf, out=buf)  # half to even, like torch.round
        dst = q[w.start - base : w.end - base]
        if k == 1:
            np.copyto(dst, buf[0], casting="unsafe")  # an integer-valued float32: exact
        else:
            a64 = acc[:n]
            np.copyto(a64, buf[0])
            for row in buf[1:]:
                np.add(a64, row, out=a64)
            np.copyto(dst, a64, casting="unsafe")


def _np_dequantize(q: np.ndarray, shifts: list[int], windows: list[_Window], out: np.ndarray, base: int = 0) -> None:
    """``out[i] = float32(q[i - base]) * 2**-shift`` over the windows' elements, window by window."""
    import numpy as np

    inverse = np.ldexp(np.float32(1), -np.array(shifts, dtype=np.int32))
    for w in windows:
        np.copyto(out[w.start : w.end], q[w.start - base : w.end - base], casting="unsafe")
        for a, b, i in w.pieces:
            if shifts[i]:
                np.multiply(out[a:b], inverse[i], out=out[a:b])


def reduce_float(shards: Tensor, allreduce: AllReduce) -> Any | None:
    """Float32 sum of the rows of ``shards`` (``[k, numel]``, the cell's micro-shards or one
    row they accumulated into; overwritten), float all-reduce SUM; ``None`` if non-finite.

    Not membership invariant (float addition is not associative). The finiteness decision
    is collective: all cells see the same all-reduced sum.
    """
    local = (shards.sum(dim=0) if shards.shape[0] > 1 else shards[0]).contiguous()
    allreduce(local, "sum")
    import torch

    return local if bool(torch.isfinite(local).all()) else None
