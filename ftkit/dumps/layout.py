"""Dump layout: directory and file names, writer names, tensor kinds, the index schema.

```
dumps/<prefix>/<phase>/rollout_<id:06d>/<writer>.safetensors
dumps/<prefix>/<phase>/rollout_<id:06d>/<writer>.index.json
```
The index is written after the safetensors file and is the commit marker of a writer's
dump. Its schema (``INDEX_SCHEMA``, version ``INDEX_VERSION``) is documented in
docs/dumps.md; readers reject other versions. Its fingerprints are ``DUMP_SCHEME``
(``ftkit-fp1``), the format version 1 was defined with, whatever scheme event logs use.
"""

from __future__ import annotations

import re
from pathlib import Path

INDEX_SCHEMA = "ftkit.dump-index"
INDEX_VERSION = 1
# Index fingerprints stay ftkit-fp1: index version 1 pins that format (docs/dumps.md).
DUMP_SCHEME = "ftkit-fp1"
INDEX_SUFFIX = ".index.json"
DATA_SUFFIX = ".safetensors"
ROLLOUT_RE = re.compile(r"^rollout_(\d{6,})$")
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]*$")

# Tensor kinds, the last meaningful component of a canonical name "<module path>.<kind>[.<i>]".
KINDS = ("param", "input", "output", "output_grad", "grad")


def check_component(what: str, value: str) -> str:
    """A prefix, phase or writer name must be one safe path component; ``ValueError`` if not."""
    if not isinstance(value, str) or not _COMPONENT_RE.match(value) or value.endswith(INDEX_SUFFIX):
        raise ValueError(f"{what} {value!r} must match {_COMPONENT_RE.pattern} (one path component)")
    return value


def rollout_dirname(rollout: int) -> str:
    return f"rollout_{int(rollout):06d}"


def rollout_dir(dumps_root: str | Path, prefix: str, phase: str, rollout: int) -> Path:
    check_component("prefix", prefix)
    check_component("phase", phase)
    return Path(dumps_root) / prefix / phase / rollout_dirname(rollout)


def microshard_writer(step: int, micro_shard: int, tp: int, pp: int, cell: int | None = None) -> str:
    """Writer name of a micro-shard's captures; ``cell`` only with ``--dump-cells all``."""
    name = f"step{step:06d}-ms{micro_shard:03d}-tp{tp}-pp{pp}"
    return name if cell is None else f"{name}-cell{cell}"


def replicated_writer(tp: int, pp: int, cell: int | None = None) -> str:
    """Writer name of replicated state (weights, reduced gradients) of one (tp, pp) rank."""
    name = f"replicated-tp{tp}-pp{pp}"
    return name if cell is None else f"{name}-cell{cell}"


def kind_of(name: str) -> str:
    """The kind of a canonical tensor name (``decoder.layers.0.mlp.output.0`` -> ``output``);
    ``tensor`` when the name carries none of ``KINDS``."""
    parts = name.split(".")
    for part in parts[-1:-3:-1]:  # the last component, or the one before a tuple index / kwarg
        if part in KINDS:
            return part
    return "tensor"


def storage_key(name: str, step: int, micro_shard: int | None) -> str:
    """Key of a tensor inside a writer's safetensors file (unique per name, step, micro-shard)."""
    ms = "-" if micro_shard is None else str(int(micro_shard))
    return f"{int(step)}/{ms}/{name}"
