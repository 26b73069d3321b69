"""``DumpWriter``: one writer's tensors of one rollout, written atomically with their index.

Usage (training drives it)::

    dw = DumpWriter(run_dir / "dumps", prefix="actor", phase="fwd_bwd", rollout=3,
                    writer="step000004-ms003-tp0-pp0", meta={"cell": 0, "rank": 0})
    dw.add("decoder.layers.0.mlp.output", t, step=4, micro_shard=3, sharding=Sharding(...))
    info = dw.write()

Contract:
- ``add`` snapshots the tensor (detached, copied to CPU unless ``copy=False`` is passed for a
  tensor the caller already owns); capture order is the order of ``add`` calls; the same
  (name, step, micro_shard) twice is a ``ValueError``.
- ``write`` writes everything added so far as ``<writer>.safetensors`` plus
  ``<writer>.index.json``. Commit protocol: both are written into a hidden staging directory
  next to them and fsynced; an existing index is removed (uncommitting the old pair), the data
  temp is renamed over the data file, then the index temp over the index, and the directory
  is fsynced. Every visible file is therefore complete, and an index (the commit marker)
  always describes the data file next to it; a process killed between the renames leaves a
  data file without index, which readers report as an uncommitted orphan (CD011).
- ``write`` may be called again after more ``add`` calls and then replaces both files. It
  only ever creates, replaces or removes this writer's own two files (and this writer's
  stale temp files left by dead processes); it never touches anything else, so a retried or
  healed rollout replaces only that writer's files.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.dumps.layout import (
    DATA_SUFFIX,
    DUMP_SCHEME,
    INDEX_SCHEMA,
    INDEX_SUFFIX,
    INDEX_VERSION,
    check_component,
    kind_of,
    rollout_dir,
    storage_key,
)
from ftkit.tensors.sharding import Sharding
from ftkit.version import __version__

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class WriteInfo:
    path: Path  # the safetensors file
    index_path: Path
    tensors: int
    bytes: int  # size of the safetensors file


class DumpWriter:
    def __init__(
        self,
        dumps_root: str | Path,
        prefix: str,
        phase: str,
        rollout: int,
        writer: str,
        meta: dict[str, Any] | None = None,
    ) -> None:
        check_component("writer", writer)
        self.directory = rollout_dir(dumps_root, prefix, phase, rollout)
        self.prefix, self.phase, self.rollout, self.writer = prefix, phase, int(rollout), writer
        self.meta = dict(meta or {})
        json.dumps(self.meta)  # fail early on metadata that cannot go into the index
        self._tensors: dict[str, torch.Tensor] = {}
        self._entries: list[dict[str, Any]] = []

    @property
    def path(self) -> Path:
        return self.directory / f"{self.writer}{DATA_SUFFIX}"

    @property
    def index_path(self) -> Path:
        return self.directory / f"{self.writer}{INDEX_SUFFIX}"

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        name: str,
        tensor: torch.Tensor,
        *,
        step: int,
        micro_shard: int | None = None,
        sharding: Sharding | None = None,
        copy: bool = True,
    ) -> None:
        """Record ``tensor`` under ``name`` for (step, micro_shard); see the module contract."""
        from ftkit.dumps.metrics import nonfinite_counts
        from ftkit.tensors.arrays import from_torch
        from ftkit.tensors.fingerprint import dtype_name, fingerprint
        from ftkit.tensors.st import TORCH_TO_ST

        key = storage_key(name, step, micro_shard)
        if key in self._tensors:
            raise ValueError(f"{name!r} was already added for step {step}, micro-shard {micro_shard}")
        if dtype_name(tensor.dtype) not in TORCH_TO_ST:
            raise ValueError(f"{name!r}: dtype {tensor.dtype} cannot be stored in a dump")
        t = tensor.detach()
        t = t.to("cpu", copy=True) if copy else t.to("cpu")
        t = t.contiguous()
        sharding = sharding or Sharding.replicated()
        if sharding.kind == "split" and (sharding.dim or 0) >= max(t.dim(), 1):
            raise ValueError(f"{name!r}: split dim {sharding.dim} out of range for shape {tuple(t.shape)}")
        self._tensors[key] = t
        nan, inf = nonfinite_counts(from_torch(t), threads=False)  # no extra threads in a training rank
        self._entries.append(
            {
                "order": len(self._entries),
                "name": name,
                "key": key,
                "kind": kind_of(name),
                "step": int(step),
                "micro_shard": None if micro_shard is None else int(micro_shard),
                "dtype": dtype_name(t.dtype),
                "shape": list(t.shape),
                "fingerprint": fingerprint(t, scheme=DUMP_SCHEME),
                "sharding": sharding.to_dict(),
                "nan": nan,
                "inf": inf,
            }
        )

    def write(self) -> WriteInfo:
        """Write (or replace) this writer's safetensors file and index; see the commit protocol."""
        from ftkit.fsutil import fsync_dir
        from ftkit.tensors.st import remove_stale_temps, save_safetensors, staging_dir, write_durable

        self.directory.mkdir(parents=True, exist_ok=True)
        for target in (self.path, self.index_path):
            remove_stale_temps(target)
        st_meta = {
            "ftkit.schema": f"{INDEX_SCHEMA}/{INDEX_VERSION}",
            "prefix": self.prefix,
            "phase": self.phase,
            "rollout": str(self.rollout),
            "writer": self.writer,
        }
        with staging_dir(self.path) as stage:
            size = save_safetensors(stage / self.path.name, self._tensors, metadata=st_meta)
            index = {
                "schema": INDEX_SCHEMA,
                "schema_version": INDEX_VERSION,
                "ftkit_version": __version__,
                "prefix": self.prefix,
                "phase": self.phase,
                "rollout": self.rollout,
                "writer": self.writer,
                "file": self.path.name,
                "file_bytes": size,
                "cell": self.meta.get("cell"),
                "rank": self.meta.get("rank"),
                "meta": self.meta,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
                "tensors": self._entries,
            }
            write_durable(stage / self.index_path.name, (json.dumps(index, indent=1) + "\n").encode())
            if self.index_path.exists():  # uncommit the old pair before replacing its data
                self.index_path.unlink()
                fsync_dir(self.directory)
            os.replace(stage / self.path.name, self.path)
            os.replace(stage / self.index_path.name, self.index_path)
        fsync_dir(self.directory)
        return WriteInfo(self.path, self.index_path, len(self._entries), size)
