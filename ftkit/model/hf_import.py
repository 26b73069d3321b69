"""Import: a Hugging Face directory's safetensors into this rank's megatron-core parameters.

``CheckpointFiles(model_dir)`` indexes the tensors: ``model.safetensors.index.json``'s
``weight_map`` when present, else the header of every ``*.safetensors`` file. Tensors are read
through safetensors' ``safe_open(...).get_slice``: only the rows or columns a rank holds are
read from the (memory-mapped) file, never a whole tensor another rank owns, and no full state
dict is ever built.

``rank_tensors(files, arch, names, r, t)`` yields ``(megatron name, tensor)`` for the model-wide
names asked for, one at a time; ``load_into(model, model_dir, arch)`` copies them into a built
model's parameters (``ftkit.model.hf_build.build_hf_gpt``), casting to the model's dtype.

Memory bound per rank: its own parameters (its slice of the model) plus the slice of the one
tensor being copied, twice for a fused tensor (the q, k and v or gate and up slices, then their
concatenation). Checkpoint tensors a family does not map (anything but a tied model's redundant
``lm_head.weight`` and ``rotary_emb.inv_freq`` buffers) and missing tensors are a
``ModelConfigError``; a slice whose shape is not the config's is an ``InputError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.errors import InputError
from ftkit.model.hf_config import HFArch, ModelConfigError
from ftkit.model.hf_layout import LM_HEAD, Entry, entries, hf_shapes, rank_slice

if TYPE_CHECKING:  # pragma: no cover
    import torch

INDEX = "model.safetensors.index.json"


class CheckpointFiles:
    """Where each tensor of a Hugging Face directory lives; opens files lazily, reads slices."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        self.where: dict[str, str] = {}
        index = self.dir / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InputError(f"cannot read {index}: {exc}", "it must be a JSON object with a weight_map") from None
            self.where = {str(k): str(v) for k, v in weight_map.items()}
        else:
            for path in sorted(self.dir.glob("*.safetensors")):
                for key in self._open(path.name).keys():  # noqa: SIM118 - safe_open is not iterable
                    self.where[key] = path.name
        if not self.where:
            raise InputError(
                f"{self.dir} holds no safetensors weights", "a Hugging Face model directory has *.safetensors"
            )
        self._handles: dict[str, Any] = {}

    def _open(self, file: str) -> Any:
        from safetensors import safe_open

        try:
            return safe_open(str(self.dir / file), framework="pt")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise InputError(
                f"cannot open {self.dir / file}: {exc}", "the checkpoint file is missing or damaged"
            ) from None

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of ``name``; all for ``dim`` None."""
        file = self.where.get(name)
        if file is None:
            raise ModelConfigError(f"the checkpoint has no tensor {name!r}", "is config.json the one of these weights?")
        handle = self._handles.get(file)
        if handle is None:
            handle = self._handles[file] = self._open(file)
        part = handle.get_slice(name)
        if dim is None:
            return part[:]
        return part[start:stop] if dim == 0 else part[:, start:stop]

    def shape(self, name: str) -> tuple[int, ...]:
        file = self.where[name]
        handle = self._handles.get(file) or self._handles.setdefault(file, self._open(file))
        return tuple(handle.get_slice(name).get_shape())


def check_tensors(files: CheckpointFiles, arch: HFArch) -> None:
    """``ModelConfigError`` for tensors missing or not mapped, ``InputError`` for wrong shapes."""
    want = hf_shapes(arch)
    extra = [
        n
        for n in files.where
        if n not in want and not n.endswith("rotary_emb.inv_freq") and not (arch.tied and n == LM_HEAD)
    ]
    if extra:
        raise ModelConfigError(
            f"the checkpoint has tensor(s) ftkit's {arch.family} mapping does not use: {', '.join(sorted(extra)[:5])}",
            "these weights are not a plain model of this family (biases, adapters, quantisation?)",
        )
    for name, shape in want.items():
        if name not in files.where:
            raise ModelConfigError(f"the checkpoint has no tensor {name!r}", "is config.json the one of these weights?")
        got = files.shape(name)
        if got != shape:
            raise InputError(f"tensor {name!r} has shape {list(got)}, config.json says {list(shape)}", "")


def rank_tensors(
    files: CheckpointFiles, arch: HFArch, names: Iterable[str], r: int, t: int, te: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(megatron name, rank r's tensor)`` for each model-wide megatron ``name``, one at a time."""
    table: dict[str, Entry] = {e.megatron: e for e in entries(arch, te)}
    for name in names:
        entry = table.get(name)
        if entry is None:
            raise ValueError(f"no Hugging Face mapping for megatron parameter {name!r}")
        yield name, rank_slice(entry, arch, files.read, r, t)


def load_into(model: Any, model_dir: Path, arch: HFArch, te: bool = False) -> None:
    """Copy this rank's share of ``model_dir``'s weights into ``model`` (module contract)."""
    import torch
    from megatron.core import parallel_state as ps

    from ftkit.model.gpt import global_param_name, stage_position

    files = CheckpointFiles(model_dir)
    check_tensors(files, arch)
    offset, _ = stage_position(model)
    params = dict(model.named_parameters())
    local = {global_param_name(n, offset): n for n in params}
    r, t = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    with torch.no_grad():
        for name, tensor in rank_tensors(files, arch, local, r, t, te):
            param = params[local[name]]
            if tuple(param.shape) != tuple(tensor.shape):
                raise InputError(
                    f"{name}: rank slice {list(tensor.shape)} does not fit parameter {list(param.shape)}", ""
                )
            param.copy_(tensor)
