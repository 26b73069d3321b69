"""Helpers to build small real dump trees with DumpWriter."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.sharding import Sharding


def write_dump(
    root: Path,
    tensors: Iterable[tuple],
    *,
    writer: str = "step000000-ms000-tp0-pp0",
    rollout: int = 0,
    prefix: str = "actor",
    phase: str = "fwd_bwd",
    cell: int | None = 0,
) -> DumpWriter:
    """``tensors``: ``(name, tensor[, step[, micro_shard[, sharding]]])`` in capture order."""
    dw = DumpWriter(root, prefix, phase, rollout, writer, meta={"cell": cell, "rank": 0})
    for spec in tensors:
        name, t, step, ms, sharding = (*spec, *(None,) * (5 - len(spec)))
        dw.add(name, t, step=step or 0, micro_shard=ms, sharding=sharding or Sharding.replicated())
    dw.write()
    return dw


@pytest.fixture
def dump():
    return write_dump
