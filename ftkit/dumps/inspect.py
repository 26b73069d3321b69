"""What a dump (or any tree of safetensors files) holds: the library side of ``ftkit dump``.

``inspect_path(path, pattern, stats)`` lists prefixes, phases, rollouts, writers and tensors
(id as in compare-dumps, shape, dtype, sharding, fingerprint) with, when ``stats`` is true,
``min``/``max``/``mean``/``std`` over the finite elements (float64 accumulation, streamed in
chunks) and NaN/Inf counts. Reading the data also verifies dump tensors against their index
fingerprints (``InputError`` on a mismatch). ``pattern`` (a regex, ``re.search``) filters
tensor ids; writers and files without a matching tensor are left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.dumps.loader import TensorLoader, fingerprint_all
from ftkit.dumps.pairing import dump_id, entry_order, file_id
from ftkit.dumps.sources import Source, TensorRef, open_source
from ftkit.dumps.stats import tensor_stats
from ftkit.errors import InputError
from ftkit.tensors.parallel import workers


@dataclass
class Inventory:
    path: Path
    kind: str
    writers: list[dict[str, Any]] = field(default_factory=list)  # dump writers (one per index file)
    files: list[dict[str, Any]] = field(default_factory=list)  # plain safetensors files
    tensors: list[dict[str, Any]] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # special files not read

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
            "skipped": self.skipped,
        }


def inspect_path(
    path: str | Path,
    pattern: str | None = None,
    stats: bool = True,
    follow_symlinks: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Inventory:
    """Everything ``path`` holds; ``InputError`` when it holds no dump and no safetensors file
    (or a symlink leaves the tree, unless ``follow_symlinks``). ``progress(done, total)`` is
    called as the tensors' data is read (for a progress bar)."""
    src = open_source(path, follow_symlinks)
    if src.empty and not src.orphans:
        raise InputError(
            f"nothing to inspect: no dumps or safetensors files in {path}",
            "pass a run directory, a dump directory or .safetensors files",
        )
    regex = re.compile(pattern) if pattern else None
    inv = Inventory(Path(path), src.kind, orphans=list(src.orphans), skipped=list(src.skipped))
    refs = _collect(src, inv, regex)
    if stats:
        _read_data(inv.tensors, refs, progress or (lambda done, total: None))
    return inv


def _read_data(rows: list[dict[str, Any]], refs: list[TensorRef], progress: Callable[[int, int], None]) -> None:
    """Verified fingerprints and statistics of every row, in batches of one tensor per thread:
    the batch is hashed in parallel (tensor by tensor), then each tensor's statistics are
    computed (stripe by stripe, in parallel) and its pages unmapped, so resident memory stays
    near one batch of tensors."""
    loader = TensorLoader()
    step = workers()
    try:
        for i in range(0, len(refs), step):
            batch = refs[i : i + step]
            for row, ref, fp in zip(rows[i : i + step], batch, fingerprint_all(batch, loader)):
                row["fingerprint"] = fp
                row["stats"] = tensor_stats(loader.load(ref))
                loader.release([ref])
            progress(min(i + step, len(refs)), len(refs))
    finally:
        loader.close()


def _collect(src: Source, inv: Inventory, regex: re.Pattern[str] | None) -> list[TensorRef]:
    """Fill ``inv`` with the writers, files and tensor rows that match; the rows' refs."""
    refs: list[TensorRef] = []
    writers: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in sorted(src.entries, key=entry_order):
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
            inv.tensors.append(_row(item_id, e.name, e.kind, e.writer, e.sharding.to_dict(), e.ref))
            refs.append(e.ref)
    inv.writers = [w for w in writers.values() if w["listed"]]
    for rel, header in sorted(src.files.items()):
        listed = 0
        for info in header.tensors.values():
            item_id = file_id(rel, info.name)
            if regex is None or regex.search(item_id):
                listed += 1
                ref = TensorRef(header.path, info)
                inv.tensors.append(_row(item_id, info.name, "tensor", rel or header.path.name, None, ref))
                refs.append(ref)
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
    return refs


def _row(
    item_id: str,
    name: str,
    kind: str,
    origin: str,
    sharding: dict[str, Any] | None,
    ref: TensorRef,
) -> dict[str, Any]:
    return {
        "id": item_id,
        "name": name,
        "kind": kind,
        "origin": origin,
        "dtype": ref.info.dtype,
        "shape": list(ref.info.shape),
        "sharding": sharding,
        "fingerprint": ref.fingerprint,
    }
