"""Micro-shards: the fixed units of work of an optimizer step, and their assignment to cells.

A step's batch of ``n`` samples is cut into ``M`` micro-shards of ``n / M`` consecutive samples
each, from the batch alone (``shard_slices``). The cut never depends on which cells are alive,
so a micro-shard holds the same samples, with the same shapes, whoever computes it.

``assign(M, alive)`` hands each live cell a contiguous range of micro-shards. It is a
deterministic function of the *sorted set* of alive cells: the i-th smallest cell id takes
range i, ranges are as equal as possible (the first ``M % k`` cells take one more), every
micro-shard is assigned to exactly one cell, and the order the cells are listed in does not
matter. With fewer micro-shards than cells it raises (a cell with nothing to do would still
have to join every collective; the config forbids it).
"""

from __future__ import annotations

from collections.abc import Iterable


def shard_slices(n: int, m: int) -> list[slice]:
    """The ``m`` equal, consecutive slices of a batch of ``n`` samples (``n % m == 0``)."""
    if m < 1 or n < 1:
        raise ValueError(f"need n >= 1 and m >= 1, got n={n}, m={m}")
    if n % m:
        raise ValueError(f"{n} samples cannot be cut into {m} equal micro-shards")
    size = n // m
    return [slice(i * size, (i + 1) * size) for i in range(m)]


def assign(m: int, alive: Iterable[int]) -> dict[int, list[int]]:
    """Contiguous micro-shard ranges per alive cell: ``{cell: [shard, ...]}``."""
    cells = sorted(set(alive))
    if not cells:
        raise ValueError("no alive cell to assign micro-shards to")
    k = len(cells)
    if m < k:
        raise ValueError(f"{m} micro-shards cannot be spread over {k} cells (need at least one each)")
    base, extra = divmod(m, k)
    out: dict[int, list[int]] = {}
    start = 0
    for i, cell in enumerate(cells):
        count = base + (1 if i < extra else 0)
        out[cell] = list(range(start, start + count))
        start += count
    return out


def shard_seed(seed: int, rollout: int, step: int, shard: int) -> int:
    """The RNG seed of one micro-shard, derived from (seed, rollout, step, shard).

    It never involves the cell, so a micro-shard draws the same numbers wherever it runs.
    """
    from ftkit.tensors.seeds import derive_seed

    return derive_seed("microshard", seed, rollout, step, shard)
