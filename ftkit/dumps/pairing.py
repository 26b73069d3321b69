"""Pair the tensors of two sources into comparison items, in capture order.

Dump tensors pair by (prefix, phase, rollout, step, micro_shard, name), never by writer: all
entries of one key on one side (TP shards, copies from several cells or TP ranks) form one
side of one item. Plain safetensors files pair by relative path, tensors by name, except a
run's ``final/`` files (one per TP/PP rank): they form one group and pair by tensor name, TP
shards as their ``sharding`` metadata says (``Source.shardings``), so the final state of a
TP=2 or PP=2 run pairs tensor for tensor with a TP=1/PP=1 run's (item ids ``final:<name>``).

Rollouts (prefix, phase, rollout) and files (groups) present on one side only are reported
whole (``missing_rollouts`` / ``missing_files``, by relative path), not tensor by tensor.

Capture order (the order of ``items``): dump items first, by rollout, step, stage
(parameters before the step's captures, parameter gradients after them), micro-shard, and
the writer's capture order; then plain files by path and tensor position in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftkit.dumps.sources import DumpEntry, Source, TensorRef, file_group
from ftkit.tensors.sharding import Sharding

_STAGE = {"param": 0, "grad": 2}


@dataclass(frozen=True)
class Piece:
    """One stored tensor on one side of an item: a TP shard or a copy."""

    sharding: Sharding
    ref: TensorRef
    origin: str  # writer name or relative file path, for messages


@dataclass
class Item:
    id: str  # "actor/fwd_bwd/rollout_000003/step000004/ms003:decoder.layers.0.output"
    order: tuple[Any, ...]
    group: str  # the writer group or file the item belongs to (missing tensors aggregate by it)
    name: str
    kind: str
    a: list[Piece] = field(default_factory=list)
    b: list[Piece] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(p.ref.info.nbytes for p in self.a + self.b)


@dataclass
class Pairing:
    items: list[Item]
    missing_rollouts: list[tuple[tuple[str, str, int], str]]  # ((prefix, phase, rollout), side lacking it: "A"|"B")
    missing_files: list[tuple[str, str]]


def rollout_label(prefix: str, phase: str, rollout: int) -> str:
    return f"{prefix}/{phase}/rollout_{rollout:06d}"


def pair(a: Source, b: Source) -> Pairing:
    items: dict[tuple[Any, ...], Item] = {}
    common = a.rollouts & b.rollouts
    for side, src in (("a", a), ("b", b)):
        for e in src.entries:
            if (e.prefix, e.phase, e.rollout) not in common:
                continue
            item = items.get(("d",) + e.key)
            if item is None:
                item = items[("d",) + e.key] = _dump_item(e)
            elif entry_order(e) < item.order:
                item.order = entry_order(e)
            getattr(item, side).append(Piece(e.sharding, e.ref, e.writer))
    missing_rollouts = sorted([(r, "B") for r in a.rollouts - b.rollouts] + [(r, "A") for r in b.rollouts - a.rollouts])
    groups_a, groups_b = _groups(a), _groups(b)
    missing_files = sorted(
        [(f, "B") for g in groups_a.keys() - groups_b.keys() for f in groups_a[g]]
        + [(f, "A") for g in groups_b.keys() - groups_a.keys() for f in groups_b[g]]
    )
    for group in sorted(groups_a.keys() & groups_b.keys()):
        for side, src, rels in (("a", a, groups_a[group]), ("b", b, groups_b[group])):
            for rel in rels:
                split = src.shardings.get(rel, {})
                for info in src.files[rel].tensors.values():
                    item = items.get(("f", group, info.name))
                    if item is None:
                        order = (1, group, info.start if group == rel else info.name)
                        item = items[("f", group, info.name)] = Item(
                            file_id(group, info.name), order, group, info.name, "tensor"
                        )
                    sharding = split.get(info.name, Sharding.replicated())
                    getattr(item, side).append(Piece(sharding, TensorRef(src.files[rel].path, info), rel))
    return Pairing(sorted(items.values(), key=lambda i: i.order), missing_rollouts, missing_files)


def _groups(src: Source) -> dict[str, list[str]]:
    """``{pairing group: [relative paths]}`` of a source's plain files (``file_group`` in a run
    directory; elsewhere each file is its own group)."""
    out: dict[str, list[str]] = {}
    for rel in sorted(src.files):
        out.setdefault(file_group(rel) if src.kind == "run" else rel, []).append(rel)
    return out


def file_id(rel: str, name: str) -> str:
    """Id of a tensor of a plain file: ``rollouts/rollout_000003.safetensors:tokens``."""
    return f"{rel}:{name}" if rel else name


def entry_order(e: DumpEntry) -> tuple[Any, ...]:
    """Sort key of a dump tensor in capture order (see the module docstring)."""
    ms = -1 if e.micro_shard is None else e.micro_shard
    return (0, e.rollout, e.step, _STAGE.get(e.kind, 1), ms, e.order, e.prefix, e.phase, e.name)


def dump_id(e: DumpEntry) -> tuple[str, str]:
    """``(id, group)`` of a dump tensor: ``actor/fwd_bwd/rollout_000003/step000004/ms003:<name>``."""
    where = f"{rollout_label(e.prefix, e.phase, e.rollout)}/step{e.step:06d}"
    if e.micro_shard is not None:
        where += f"/ms{e.micro_shard:03d}"
    return f"{where}:{e.name}", where


def _dump_item(e: DumpEntry) -> Item:
    item_id, group = dump_id(e)
    return Item(item_id, entry_order(e), group, e.name, e.kind)
