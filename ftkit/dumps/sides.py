"""One side of one comparison item: load its pieces, verify them, resolve copies and shards.

``load_pieces`` loads the pieces of both sides of an item (lazily, through ``TensorLoader``)
and fingerprints them all at once on the shared thread pool (``ftkit.tensors.xxh3`` releases
the GIL, so the two sides hash in parallel), verifying dump pieces against their index fingerprints.
``resolve_side`` then resolves one side:

- copies of the same data (replicated pieces from several TP ranks or cells, or the same TP
  shard from several cells) must be bitwise identical: distinct fingerprints give a CD007
  finding and the copy from the first origin (sorted) is used;
- split pieces must cover every TP rank with one layout (dim, tp_size, stride), mixing
  replicated and split pieces is not allowed: otherwise a CD008 finding and no value.

``SideValue.signature`` identifies the stored bits per layout: equal signatures on both sides
prove bitwise equality without assembling anything; otherwise ``full()`` assembles the TP
shards into the full tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ftkit.dumps.codes import finding
from ftkit.dumps.loader import TensorLoader, fingerprint_all
from ftkit.dumps.pairing import Piece
from ftkit.findings import Finding
from ftkit.tensors.sharding import Sharding, assemble


@dataclass
class SideValue:
    dtype: str
    shape: tuple[int, ...]
    chosen: list[tuple[Sharding, np.ndarray]]  # one piece per TP rank (or one replicated piece)
    signature: tuple[Any, ...]
    origins: list[str]
    counts: list[tuple[int, int] | None]  # (NaN, Inf) per chosen piece, from verified indexes

    def full(self) -> np.ndarray:
        return np.asarray(assemble(self.chosen))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def load_pieces(pieces: list[Piece], loader: TensorLoader) -> tuple[list[np.ndarray], list[str]]:
    """``(arrays, fingerprints)`` of ``pieces``, hashed in parallel; ``InputError`` if a dump
    piece does not match its index fingerprint."""
    arrays = [loader.load(p.ref) for p in pieces]  # lazy: nothing is read yet
    return arrays, fingerprint_all([p.ref for p in pieces], loader)


def resolve_side(
    item_id: str, side: str, pieces: list[Piece], tensors: list[np.ndarray], fps: list[str]
) -> tuple[SideValue | None, list[Finding]]:
    """The value of one side of ``item_id`` (``side`` is "A" or "B") from its loaded pieces,
    and any CD007/CD008 findings."""
    origins = sorted({p.origin for p in pieces})
    if len({p.sharding.is_split for p in pieces}) > 1:
        return None, [
            finding(
                "CD008",
                f"{item_id}: side {side} mixes replicated and split TP pieces",
                tensor=item_id,
                side=side,
                origins=origins,
            )
        ]
    split = pieces[0].sharding.is_split
    groups: dict[int | None, list[int]] = {}
    for i, p in enumerate(pieces):
        groups.setdefault(p.sharding.tp_rank if split else None, []).append(i)
    findings: list[Finding] = []
    chosen_idx = []
    for rank, members in sorted(groups.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        members.sort(key=lambda i: pieces[i].origin)
        distinct: dict[str, list[str]] = {}
        for i in members:
            distinct.setdefault(fps[i], []).append(pieces[i].origin)
        if len(distinct) > 1:
            what = "copies" if rank is None else f"copies of TP shard {rank}"
            findings.append(
                finding(
                    "CD007",
                    f"{item_id}: side {side} holds {len(distinct)} different {what} ({len(members)} copies)",
                    tensor=item_id,
                    side=side,
                    variants=[sorted(o) for o in distinct.values()],
                )
            )
        chosen_idx.append(members[0])
    chosen = [(pieces[i].sharding, tensors[i]) for i in chosen_idx]
    if split:
        layouts = {(s.dim, s.tp_size, s.stride) for s, _ in chosen}
        ranks = sorted(s.tp_rank for s, _ in chosen)
        tp_size = chosen[0][0].tp_size
        if len(layouts) > 1 or ranks != list(range(tp_size)):
            return None, findings + [
                finding(
                    "CD008",
                    f"{item_id}: side {side} has TP shards {ranks} of {tp_size}"
                    + (" with different layouts" if len(layouts) > 1 else ""),
                    tensor=item_id,
                    side=side,
                    origins=origins,
                )
            ]
        try:
            shape = _full_shape(chosen)
        except ValueError as exc:
            return None, findings + [finding("CD008", f"{item_id}: side {side}: {exc}", tensor=item_id, side=side)]
        sig: tuple[object, ...] = tuple(
            ((s.dim, s.tp_size, s.stride, s.tp_rank), fps[i]) for (s, _), i in zip(chosen, chosen_idx)
        )
    else:
        shape = tuple(chosen[0][1].shape)
        sig = (("replicated",), fps[chosen_idx[0]])
    dtype = pieces[chosen_idx[0]].ref.info.dtype
    counts = [pieces[i].ref.nonfinite for i in chosen_idx]
    return SideValue(dtype, shape, chosen, (dtype, shape, sig), origins, counts), findings


def _full_shape(chosen: list[tuple[Sharding, np.ndarray]]) -> tuple[int, ...]:
    s0, t0 = chosen[0]
    dim = s0.dim
    assert dim is not None  # split pieces only
    if any(dim >= t.ndim for _, t in chosen):
        raise ValueError(f"split dim {dim} out of range for a {t0.ndim}-d shard")
    rest = {tuple(d for j, d in enumerate(t.shape) if j != dim) for _, t in chosen}
    if len(rest) > 1:
        raise ValueError("TP shards differ in their non-split dimensions")
    shape = list(t0.shape)
    shape[dim] = sum(t.shape[dim] for _, t in chosen)
    return tuple(shape)
