"""The exact reduction's kernels on a torch device (CUDA; CPU tensors when asked, in tests).

``ExactReducer`` (``ftkit.train.rank.reducer``) runs numpy kernels on CPU and these anywhere
else. Each is one fused kernel made by ``torch.compile`` (Triton on CUDA, C++ on CPU), compiled
once per process with dynamic shapes, so any micro-shard count ``k`` and any model size use the
same kernel; each reads the micro-shard rows ``[k, n]`` (float32) once and leaves them
unchanged:

- ``column_tops(rows)``: ``max_rows |g|`` per element, ``[n]`` float32 (NaN propagates);
- ``quantize_sum(rows, scale, tail)``: ``sum_rows round(g * scale)`` per element as int64,
  followed by the int64 vector ``tail`` (``[n + len(tail)]``: what rides in the same collective),
  ``scale`` a ``[n]`` float32 vector of powers of two (``per_element``): ``g * scale`` is exact
  (only the exponent moves), ``round`` (half to even) gives an integer of magnitude at most
  ``2**52 / M`` held exactly by float32, its int64 conversion is exact and int64 sums of at
  most ``M`` of them cannot wrap, so the result does not depend on the order of the additions
  or on the device: the same bits as the numpy kernels;
- ``dequantize(q, inverse)``: ``float32(q) * inverse`` (one correctly rounded conversion, then a
  power of two).

``warm_up(device)`` compiles them ahead (a rank calls it when it starts on a device other than
the CPU), so no step waits for the compiler.

Per element, the three passes move ``8k + 20`` bytes (rows read twice, the int64 sums written
and read, the result written) against ``4k + 4`` for a float sum of the rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def _column_tops(rows: Tensor) -> Tensor:
    return rows.abs().amax(0)


def _quantize_sum(rows: Tensor, scale: Tensor, tail: Tensor) -> Tensor:
    import torch

    return torch.cat([torch.round(rows * scale).to(torch.int64).sum(0), tail])


def _dequantize(q: Tensor, inverse: Tensor) -> Tensor:
    import torch

    return q.to(torch.float32) * inverse


@functools.cache
def _compiled(name: str) -> Any:
    import torch
    import torch._inductor.config

    # compile in this process: a pool of compile workers would outlive a rank killed by a fault
    torch._inductor.config.compile_threads = 1

    fns: dict[str, Callable[..., Tensor]] = {"tops": _column_tops, "quantize": _quantize_sum, "dequantize": _dequantize}
    return torch.compile(fns[name], dynamic=True)


def column_tops(rows: Tensor) -> Tensor:
    """``[n]`` float32: the largest ``|g|`` of each element over the rows (NaN propagates)."""
    out: Tensor = _compiled("tops")(rows)
    return out


def quantize_sum(rows: Tensor, scale: Tensor, tail: Tensor) -> Tensor:
    """``[n + len(tail)]`` int64: ``sum_rows round(rows * scale)``, then ``tail`` (see the module
    docstring)."""
    out: Tensor = _compiled("quantize")(rows, scale, tail)
    return out


def dequantize(q: Tensor, inverse: Tensor) -> Tensor:
    """``[n]`` float32: ``float32(q) * inverse``."""
    out: Tensor = _compiled("dequantize")(q, inverse)
    return out


def per_element(values: list[float], lengths: Tensor, numel: int) -> Tensor:
    """The ``[numel]`` float32 vector holding ``values[i]`` over the ``lengths[i]`` elements of
    tensor ``i`` (on ``lengths``' device): each tensor's power of two, element by element."""
    import torch

    table = torch.tensor(values, dtype=torch.float32, device=lengths.device)
    return torch.repeat_interleave(table, lengths, output_size=numel)


def warm_up(device: Any) -> None:
    """Compile the kernels for ``device`` now, on tiny inputs of the sizes ``torch.compile``
    specialises (one row and several, with and without a tail): a cell that compiled them in
    its first step would reach the cross-cell collectives seconds after its peers, a restarted
    cell most of all, and be declared hung."""
    import torch

    scale = torch.ones(3, dtype=torch.float32, device=device)
    for k in (1, 2):
        rows = torch.zeros(k, 3, dtype=torch.float32, device=device)
        column_tops(rows)
        for extra in (0, 2):
            q = quantize_sum(rows, scale, torch.zeros(extra, dtype=torch.int64, device=device))
            dequantize(q[:3], scale)
