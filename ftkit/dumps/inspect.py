"""What a dump (or any tree of safetensors files) holds: the library side of ``ftkit dump``.

``inspect_path(path, pattern, stats)`` lists prefixes, phases, rollouts, writers and tensors
(id as in compare-dumps, shape, dtype, sharding, fingerprint) with, when ``stats`` is true,
``min``/``max``/``mean``/``std`` over the finite elements (float64 accumulation, streamed in
chunks) and NaN/Inf counts. Reading the data also verifies dump tensors against their index
fingerprints (``InputError`` on a mismatch). ``pattern`` (a regex, ``re.search``) filters
tensor ids; writers and files without a matching tensor are left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.dumps.loader import TensorLoader, fingerprint_verified
from ftkit.dumps.pairing import dump_id, entry_order, file_id
from ftkit.dumps.sources import Source, TensorRef, open_source
from ftkit.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

CHUNK = 1 << 20


@dataclass
class Inventory:
    path: Path
    kind: str
    writers: list[dict[str, Any]] = field(default_factory=list)  # dump writers (one per index file)
    files: list[dict[str, Any]] = field(default_factory=list)  # plain safetensors files
    tensors: list[dict[str, Any]] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)

    @property
    def prefixes(self) -> list[str]:
        return sorted({w["prefix"] for w in self.writers})

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "prefixes": self.prefixes,
            "writers": self.writers,
            "files": self.files,
            "tensors": self.tensors,
            "orphans": self.orphans,
        }


def inspect_path(
    path: str | Path,
    pattern: str | None = None,
    stats: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Inventory:
    """Everything ``path`` holds; ``InputError`` when it holds no dump and no safetensors file.

    ``progress(done, total)`` is called as the tensors are read (for a progress bar)."""
    src = open_source(path)
    if src.empty and not src.orphans:
        raise InputError(
            f"nothing to inspect: no dumps or safetensors files in {path}",
            "pass a run directory, a dump directory or .safetensors files",
        )
    regex = re.compile(pattern) if pattern else None
    inv = Inventory(Path(path), src.kind, orphans=list(src.orphans))
    loader = TensorLoader()
    try:
        _collect(src, inv, regex, stats, loader, progress or (lambda done, total: None))
    finally:
        loader.close()
    return inv


def _collect(
    src: Source,
    inv: Inventory,
    regex: re.Pattern[str] | None,
    stats: bool,
    loader: TensorLoader,
    progress: Callable[[int, int], None],
) -> None:
    writers: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    entries = sorted(src.entries, key=entry_order)
    for done, e in enumerate(entries, start=1):
        progress(done, len(entries))
        item_id, _ = dump_id(e)
        wkey = (e.prefix, e.phase, e.rollout, e.writer)
        if wkey not in writers:
            writers[wkey] = {
                "prefix": e.prefix,
                "phase": e.phase,
                "rollout": e.rollout,
                "writer": e.writer,
                "cell": e.cell,
                "file": str(e.ref.file),
                "bytes": e.ref.file.stat().st_size,
                "tensors": 0,
                "listed": 0,
            }
        writers[wkey]["tensors"] += 1
        if regex is None or regex.search(item_id):
            writers[wkey]["listed"] += 1
            inv.tensors.append(_row(item_id, e.name, e.kind, e.writer, e.sharding.to_dict(), e.ref, stats, loader))
    inv.writers = [w for w in writers.values() if w["listed"]]
    for rel, header in sorted(src.files.items()):
        listed = 0
        for info in header.tensors.values():
            item_id = file_id(rel, info.name)
            if regex is None or regex.search(item_id):
                listed += 1
                ref = TensorRef(header.path, info)
                inv.tensors.append(
                    _row(item_id, info.name, "tensor", rel or header.path.name, None, ref, stats, loader)
                )
        if listed:
            inv.files.append(
                {
                    "path": rel or header.path.name,
                    "bytes": header.size,
                    "tensors": len(header.tensors),
                    "listed": listed,
                    "metadata": header.metadata,
                }
            )


def _row(
    item_id: str,
    name: str,
    kind: str,
    origin: str,
    sharding: dict[str, Any] | None,
    ref: TensorRef,
    stats: bool,
    loader: TensorLoader,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": item_id,
        "name": name,
        "kind": kind,
        "origin": origin,
        "dtype": ref.info.dtype,
        "shape": list(ref.info.shape),
        "sharding": sharding,
        "fingerprint": ref.fingerprint,
    }
    if stats:
        t = loader.load(ref)
        row["fingerprint"] = fingerprint_verified(ref)
        row["stats"] = tensor_stats(t)
    return row


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """min, max, mean, std (population) over finite elements, plus NaN/Inf counts and numel."""
    import torch

    flat = (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)
    n = s = ss = 0.0
    lo, hi = math.inf, -math.inf
    nan = inf = 0
    for i in range(0, flat.numel(), CHUNK):
        c = flat[i : i + CHUNK].to(torch.float64)
        if c.is_floating_point():
            bad_nan, bad_inf = torch.isnan(c), torch.isinf(c)
            nan += int(bad_nan.sum())
            inf += int(bad_inf.sum())
            c = c[~(bad_nan | bad_inf)]
        if c.numel():
            n += c.numel()
            lo, hi = min(lo, float(c.min())), max(hi, float(c.max()))
            s += float(c.sum())
    mean = s / n if n else None
    if mean is not None:
        for i in range(0, flat.numel(), CHUNK):
            c = flat[i : i + CHUNK].to(torch.float64)
            c = c[torch.isfinite(c)]
            ss += float(((c - mean) ** 2).sum())
    return {
        "numel": t.numel(),
        "min": lo if n else None,
        "max": hi if n else None,
        "mean": mean,
        "std": math.sqrt(ss / n) if n else None,
        "nan": nan,
        "inf": inf,
    }
