"""Export: megatron-core per-rank state -> a Hugging Face model directory.

``export_hf(states, arch, out_dir, source_dir, dtype=None)``: ``states[r]`` is TP rank ``r``'s
parameters under model-wide megatron names (the union of its pipeline stages, ``hf_layout``
naming). Every Hugging Face tensor is merged from the ranks' pieces (``hf_layout.merge``: fused
QKV and gate/up split, vocabulary padding removed, replicated tensors checked equal across
ranks), cast once to ``dtype`` (a name of ``hf_config.DTYPES``; None: the source checkpoint's,
``arch.dtype``; float32 -> bfloat16 is ``Tensor.to``: round to nearest, ties to even),
assigned in checkpoint order to shards of at most ``max_shard_bytes``
(``model-00001-of-0000N.safetensors``, tensors sorted by name inside a shard, so the same state
gives the same bytes) with ``model.safetensors.index.json``. Shards are
written straight from the merged tensors (views of the states where the layout allows, no
serialisation copy: ``stfile.write_plain``) and fsynced, as is the directory.
``config.json`` is the source's (its dtype field set to the dtype written) and the tokenizer
files of ``source_dir`` are copied. A tied model writes no ``lm_head.weight`` (the embedding is
the output layer). The directory is built next to ``out_dir`` and renamed into place at the end;
an existing non-empty ``out_dir`` is a ``UsageError``. Memory: the states plus one shard.

The result loads with ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)``, and an
untouched import exports every source tensor bitwise, at any TP size.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.errors import UsageError
from ftkit.model.hf_config import HFArch, read_config
from ftkit.model.hf_import import INDEX
from ftkit.model.hf_layout import entries, hf_shapes, merge

if TYPE_CHECKING:  # pragma: no cover
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_SHARD_BYTES = 2 * 1024**3


def shard_plan(arch: HFArch, max_shard_bytes: int, dtype: str | None = None) -> list[list[str]]:
    """The Hugging Face tensor names of each shard, in the order export writes them in ``dtype``
    (None: ``arch.dtype``)."""
    shapes, size = hf_shapes(arch), ITEMSIZE[dtype or arch.dtype]
    order = [n for e in entries(arch) for n in e.hf if n in shapes and n not in _done(e, arch)]
    shards: list[list[str]] = [[]]
    used = 0
    for name in order:
        n = size
        for s in shapes[name]:
            n *= s
        if shards[-1] and used + n > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += n
    return shards


def _done(e: Any, arch: HFArch) -> tuple[str, ...]:
    """HF names an entry must not write: a tied model's output layer is the embedding."""
    return e.hf if arch.tied and e.megatron == "output_layer.weight" else ()


def hf_tensors(states: Sequence[Mapping[str, torch.Tensor]], arch: HFArch) -> dict[str, torch.Tensor]:
    """Every Hugging Face tensor merged from the TP ranks' states (in memory; tests and export)."""
    out: dict[str, torch.Tensor] = {}
    for e in entries(arch):
        if _done(e, arch):
            continue
        out.update(merge(e, arch, [s[e.megatron] for s in states]))
    return out


def check_out_dir(out_dir: Path) -> None:
    """``UsageError`` unless ``out_dir`` is new or an empty directory (callers check it before work)."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} exists and is not an empty directory", "choose a new output directory")


def export_hf(
    states: Sequence[Mapping[str, torch.Tensor]],
    arch: HFArch,
    out_dir: Path,
    source_dir: Path,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    dtype: str | None = None,
) -> list[Path]:
    """Write the Hugging Face directory ``out_dir`` (module contract); returns the shard paths."""
    from ftkit.checkpoint.stfile import fsync_file, layout_st, write_plain
    from ftkit.fsutil import fsync_dir
    from ftkit.model.hf_build import torch_dtype

    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    table = {e.megatron: e for e in entries(arch)}
    owner = {n: e.megatron for e in table.values() for n in e.hf if not _done(e, arch)}
    written = dtype or arch.dtype
    plan = shard_plan(arch, max_shard_bytes, written)
    cast, weight_map, total = torch_dtype(written), {}, 0
    paths = []
    for i, names in enumerate(plan, 1):
        shard: dict[str, torch.Tensor] = {}
        for name in names:
            if name not in shard:
                e = table[owner[name]]
                merged = merge(e, arch, [s[e.megatron] for s in states])
                shard.update({k: v.to(cast).contiguous() for k, v in merged.items() if k in names})
        file = f"model-{i:05d}-of-{len(plan):05d}.safetensors"
        write_plain(tmp / file, layout_st(shard, {"format": "pt"}))
        weight_map.update(dict.fromkeys(shard, file))
        total += sum(t.numel() * t.element_size() for t in shard.values())
        paths.append(out_dir / file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    config = read_config(source_dir)
    config["dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"] = written
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:
        if (Path(source_dir) / name).is_file():
            shutil.copyfile(Path(source_dir) / name, tmp / name)
    for path in tmp.iterdir():
        if path.suffix != ".safetensors":  # the shards were fsynced as they were written
            fsync_file(path)
    fsync_dir(tmp)
    if out_dir.exists():
        out_dir.rmdir()
    os.rename(tmp, out_dir)
    fsync_dir(out_dir.parent)
    return paths
