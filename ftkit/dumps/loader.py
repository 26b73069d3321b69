"""Lazy tensor loading through safetensors' ``safe_open`` (memory-mapped, no full-file read).

``TensorLoader.load(ref)`` returns a CPU tensor backed by the file mapping; pages are read
when the tensor is touched, so memory follows what is being compared, not the dump size.
A few files stay open (least recently used first out). Headers were validated by
``ftkit.tensors.st.read_header`` before any ``TensorRef`` exists; any error safetensors still
raises becomes an ``InputError`` (exit 2).

``fingerprint_verified(ref)`` fingerprints a stored tensor straight from its byte range in the
file (a read-only mapping that is closed right after, so hashed pages do not stay mapped) and
checks it against the index fingerprint of a dump tensor. Safetensors data is contiguous
little-endian row-major bytes, exactly the bytes
``ftkit.tensors.fingerprint`` hashes, so the result equals ``fingerprint(tensor)``.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.dumps.sources import TensorRef
from ftkit.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch


class TensorLoader:
    def __init__(self, max_open: int = 4) -> None:
        self._open: OrderedDict[Path, Any] = OrderedDict()
        self._max_open = max_open

    def load(self, ref: TensorRef) -> torch.Tensor:
        handle = self._handle(ref.file)
        try:
            t: torch.Tensor = handle.get_tensor(ref.info.name)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type
            raise InputError(
                f"cannot read tensor {ref.info.name!r} from {ref.file}: {exc}",
                "the file is corrupt or changed while reading; re-create it",
            ) from exc
        if tuple(t.shape) != ref.info.shape:
            raise InputError(
                f"tensor {ref.info.name!r} in {ref.file} changed while reading",
                "do not modify dumps while comparing them",
            )
        return t

    def _handle(self, path: Path) -> Any:
        from safetensors import safe_open

        if path in self._open:
            self._open.move_to_end(path)
            return self._open[path]
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:  # noqa: BLE001
            raise InputError(
                f"cannot open {path} as safetensors: {exc}", "the file is corrupt or truncated; re-create it"
            ) from exc
        self._open[path] = handle
        while len(self._open) > self._max_open:
            self._open.popitem(last=False)
        return handle

    def close(self) -> None:
        self._open.clear()


def fingerprint_verified(ref: TensorRef) -> str:
    """The stored tensor's fingerprint, hashed from a private read-only mapping of its byte
    range (unmapped right after); ``InputError`` if ``ref`` carries an index fingerprint that
    differs."""
    from ftkit.tensors.fingerprint import fingerprint_buffers

    info = ref.info
    try:
        with open(ref.file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if len(mm) < info.end:
                raise InputError(
                    f"{ref.file} shrank to {len(mm)} bytes while reading tensor {info.name!r}",
                    "do not modify dumps while comparing them",
                )
            with memoryview(mm) as view, view[info.start : info.end] as data:
                fp = fingerprint_buffers(info.dtype, info.shape, [data])
    except OSError as exc:
        raise InputError(f"cannot read {ref.file}: {exc.strerror or exc}", "check the path and permissions") from exc
    if ref.fingerprint is not None and fp != ref.fingerprint:
        raise InputError(
            f"tensor {ref.info.name!r} in {ref.file} does not match the fingerprint in its index",
            "the dump data is corrupt (changed after it was written); re-create it",
        )
    return fp
