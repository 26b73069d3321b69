"""Import: a Hugging Face directory's safetensors into this rank's megatron-core parameters.

``CheckpointFiles(model_dir)`` indexes the tensors: ``model.safetensors.index.json``'s
``weight_map`` when present, else every ``*.safetensors`` file; each file's header is read and
validated by ``ftkit.tensors.st.read_header`` (offsets that tile the file exactly, dtypes,
shapes). ``read_into(name, dim, start, stop, out)`` copies rows or columns of one tensor straight
into ``out``: a row range (and a whole tensor, and at TP = 1 every tensor) is one contiguous byte
range, read with ``os.preadv`` into ``out``'s memory; a column range (a row-parallel weight at
TP > 1) is copied from a memory map of the file, row by row, through a numpy view. A tensor
stored in another dtype than ``out``'s (bf16 / fp16 into a float32 model) is read into a buffer
of its own dtype, then cast into ``out``. A ``CheckpointFiles`` is a context manager; closing it
closes the files.

``fill(files, plan, out)`` makes ``out`` rank ``r``'s tensor of one entry
(``ftkit.model.hf_layout.rank_plan``): each part read into its place (the q, k and v rows of each
query group, the gate and up halves, the real vocabulary rows), the padding rows zeroed, nothing
else written. ``load_rank(files, arch, dests, r, t)`` fills every destination tensor given (by
megatron name); ``rank_tensors(files, arch, names, r, t)`` yields ``(megatron name, tensor)``
freshly allocated in the checkpoint's dtype, one at a time; ``load_into(model, model_dir, arch)``
fills a built model's parameters (``ftkit.model.hf_build.build_hf_gpt``) in place: one copy per
byte, as a raw read (a parameter off the CPU or not contiguous goes through one staging tensor).
``stored_dtype(model_dir, arch)`` is the dtype every tensor the family maps is stored in (its
name, ``"bfloat16"``), or None for a checkpoint of mixed dtypes: a model built in it is loaded
without any cast (``ftkit.model.hf_build.build_loaded``).

Memory bound per rank: its own parameters, plus, for a tensor stored in another dtype than the
parameter's, one part of it in the stored dtype (at most one parameter slice); plus one staging
parameter for a model off the CPU. No fused intermediate, no full tensor another rank owns, no
state dict. Checkpoint tensors a family does not map (anything but a tied model's redundant
``lm_head.weight`` and ``rotary_emb.inv_freq`` buffers) and missing tensors are a
``ModelConfigError``; a tensor whose shape is not the config's is an ``InputError``.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ftkit.errors import InputError
from ftkit.model.hf_config import HFArch, ModelConfigError
from ftkit.model.hf_layout import LM_HEAD, Entry, Plan, entries, hf_shapes, rank_plan
from ftkit.tensors.st import ST_DTYPES, Header, TensorInfo, read_header

if TYPE_CHECKING:  # pragma: no cover
    import torch

INDEX = "model.safetensors.index.json"


class CheckpointFiles:
    """Where each tensor of a Hugging Face directory lives; opens files lazily, reads parts."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        self.where: dict[str, str] = {}
        self._headers: dict[str, Header] = {}
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap] = {}
        index = self.dir / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InputError(f"cannot read {index}: {exc}", "it must be a JSON object with a weight_map") from None
            self.where = {str(k): str(v) for k, v in weight_map.items()}
        else:
            for path in sorted(self.dir.glob("*.safetensors")):
                for key in self._header(path.name).tensors:
                    self.where[key] = path.name
        if not self.where:
            raise InputError(
                f"{self.dir} holds no safetensors weights", "a Hugging Face model directory has *.safetensors"
            )

    def __enter__(self) -> CheckpointFiles:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        for fd in self._fds.values():
            os.close(fd)
        self._maps.clear()
        self._fds.clear()

    def _header(self, file: str) -> Header:
        header = self._headers.get(file)
        if header is None:
            header = self._headers[file] = read_header(self.dir / file)
        return header

    def info(self, name: str) -> TensorInfo:
        file = self.where.get(name)
        if file is None:
            raise ModelConfigError(f"the checkpoint has no tensor {name!r}", "is config.json the one of these weights?")
        info = self._header(file).tensors.get(name)
        if info is None:
            raise InputError(f"{self.dir / file} has no tensor {name!r}", f"{INDEX} names a tensor its file lacks")
        return info

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def dtype(self, name: str) -> torch.dtype:
        import torch

        dtype: torch.dtype = getattr(torch, self.info(name).dtype)
        return dtype

    def _fd(self, name: str) -> int:
        file = self.where[name]
        fd = self._fds.get(file)
        if fd is None:
            try:
                fd = self._fds[file] = os.open(self.dir / file, os.O_RDONLY)
            except OSError as exc:
                raise InputError(f"cannot open {self.dir / file}: {exc.strerror or exc}", "") from None
        return fd

    def read_into(self, name: str, dim: int | None, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of ``name``, or all of it
        (``dim`` None), into the contiguous CPU tensor ``out`` of that shape (cast to its dtype)."""
        import torch

        info = self.info(name)
        shape = list(info.shape)
        if dim is not None:
            shape[dim] = stop - start
        if list(out.shape) != shape:
            raise InputError(f"{name}: part {shape} does not fit its place {list(out.shape)}", "")
        src = getattr(torch, info.dtype)
        buf = out if out.dtype == src else torch.empty(shape, dtype=src)
        itemsize = ST_DTYPES[info.code][1]
        if dim == 1 and (start, stop) != (0, info.shape[1]):
            self._copy_columns(name, info, start * itemsize, stop * itemsize, buf)
        else:
            row = itemsize * (info.numel // info.shape[0] if info.shape and info.shape[0] else 0)
            first = start if dim == 0 else 0
            self._pread(name, info.start + first * row, buf)
        if buf is not out:
            out.copy_(buf)

    def _pread(self, name: str, offset: int, out: torch.Tensor) -> None:
        """``out.nbytes`` bytes of the file of ``name`` from ``offset`` into ``out``'s memory."""
        view = memoryview(_bytes(out))
        fd, done = self._fd(name), 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise InputError(f"{self.dir / self.where[name]}: short read at byte {offset + done}", "")
            done += n

    def _copy_columns(self, name: str, info: TensorInfo, lo: int, hi: int, out: torch.Tensor) -> None:
        """Byte columns ``[lo, hi)`` of every row of 2-D tensor ``name`` into ``out``."""
        import numpy as np

        file = self.where[name]
        m = self._maps.get(file)
        if m is None:
            m = self._maps[file] = mmap.mmap(self._fd(name), 0, access=mmap.ACCESS_READ)
        rows = info.shape[0]
        src = np.frombuffer(m, dtype=np.uint8, count=info.nbytes, offset=info.start).reshape(rows, -1)
        np.copyto(_bytes(out).reshape(rows, hi - lo), src[:, lo:hi])


def _bytes(t: torch.Tensor) -> Any:
    """The bytes of contiguous CPU tensor ``t`` as a writable flat numpy uint8 array (shared)."""
    import torch

    return t.detach().reshape(-1).view(torch.uint8).numpy()


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


def fill(files: CheckpointFiles, plan: Plan, out: torch.Tensor) -> None:
    """Make contiguous CPU tensor ``out`` (of ``plan.shape``) the planned rank tensor (module contract)."""
    for p in plan.parts:
        place = out if p.dim in (None, 1) else out[p.at : p.at + p.stop - p.start]
        files.read_into(p.hf, p.dim, p.start, p.stop, place)
    if plan.zero_from < plan.shape[0]:
        out[plan.zero_from :] = 0


def _plans(arch: HFArch, names: Iterable[str], r: int, t: int, te: bool) -> Iterator[tuple[str, Entry, Plan]]:
    table: dict[str, Entry] = {e.megatron: e for e in entries(arch, te)}
    for name in names:
        entry = table.get(name)
        if entry is None:
            raise ValueError(f"no Hugging Face mapping for megatron parameter {name!r}")
        yield name, entry, rank_plan(entry, arch, r, t)


def rank_tensors(
    files: CheckpointFiles, arch: HFArch, names: Iterable[str], r: int, t: int, te: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(megatron name, rank r's tensor)`` for each model-wide megatron ``name``, one at a time,
    each freshly allocated in the checkpoint's dtype."""
    import torch

    for name, entry, plan in _plans(arch, names, r, t, te):
        out = torch.empty(plan.shape, dtype=files.dtype(entry.hf[0]))  # a rank of padding rows only too
        fill(files, plan, out)
        yield name, out


def load_rank(
    files: CheckpointFiles, arch: HFArch, dests: Mapping[str, torch.Tensor], r: int, t: int, te: bool = False
) -> None:
    """Fill each tensor of ``dests`` (model-wide megatron name -> tensor) with rank ``r``'s share,
    in place, cast to its dtype; ``InputError`` for a tensor whose shape is not the share's."""
    import torch

    with torch.no_grad():
        for name, _, plan in _plans(arch, dests, r, t, te):
            dest = dests[name]
            if tuple(dest.shape) != plan.shape:
                raise InputError(f"{name}: rank slice {list(plan.shape)} does not fit parameter {list(dest.shape)}", "")
            direct = dest.device.type == "cpu" and dest.is_contiguous()
            out = dest if direct else torch.empty(plan.shape, dtype=dest.dtype)
            fill(files, plan, out)
            if not direct:
                dest.copy_(out)


def stored_dtype(model_dir: Path, arch: HFArch) -> str | None:
    """The dtype name every tensor ``arch`` maps is stored in, or None when they differ (module
    contract); reads the headers only."""
    with CheckpointFiles(model_dir) as files:
        check_tensors(files, arch)
        found = {str(files.dtype(name)).removeprefix("torch.") for name in hf_shapes(arch)}
    return found.pop() if len(found) == 1 else None


def load_into(model: Any, model_dir: Path, arch: HFArch, te: bool = False) -> None:
    """Fill ``model``'s parameters with this rank's share of ``model_dir``'s weights (module contract)."""
    from megatron.core import parallel_state as ps

    from ftkit.model.stages import global_param_name, stage_position

    offset, _ = stage_position(model)
    dests = {global_param_name(n, offset): p for n, p in model.named_parameters()}
    r, t = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    with CheckpointFiles(model_dir) as files:
        check_tensors(files, arch)
        load_rank(files, arch, dests, r, t, te)
