"""Lazy tensor loading as numpy arrays over read-only file mappings (no torch, no full reads).

``TensorLoader.load(ref)`` returns a read-only numpy array backed by a mapping of the file
(``ftkit.tensors.arrays.MappedFile``); pages are read when the array is touched, so memory
follows what is being compared, not the dump size. A few files stay mapped (least recently
used first out; arrays handed out keep their mapping alive until released). Headers were
validated by ``ftkit.tensors.st.read_header`` before any ``TensorRef`` exists.

``fingerprint_verified(ref, loader)`` fingerprints a stored tensor straight from its bytes and
checks it against the index fingerprint of a dump tensor. Safetensors data is contiguous
little-endian row-major bytes, exactly the bytes ``ftkit.tensors.fingerprint`` hashes, so the
result equals ``fingerprint(tensor)`` of the tensor that was written.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import partial
from pathlib import Path

import numpy as np

from ftkit.dumps.sources import TensorRef
from ftkit.errors import InputError
from ftkit.tensors.arrays import MappedFile


class TensorLoader:
    """Maps files on demand and hands out arrays; safe to call from several threads."""

    def __init__(self, max_open: int = 8) -> None:
        self._open: OrderedDict[Path, MappedFile] = OrderedDict()
        self._max_open = max_open
        self._lock = threading.Lock()

    def load(self, ref: TensorRef) -> np.ndarray:
        """The stored tensor of ``ref`` as a read-only array (``InputError`` if unreadable)."""
        return self._file(ref.file).array(ref.info)

    def release(self, refs: list[TensorRef]) -> None:
        """Unmap the pages of ``refs`` (done with them; see ``MappedFile.release``)."""
        with self._lock:
            for ref in refs:
                mf = self._open.get(ref.file)
                if mf is not None:
                    mf.release(ref.info)

    def _file(self, path: Path) -> MappedFile:
        with self._lock:
            if path in self._open:
                self._open.move_to_end(path)
                return self._open[path]
            mf = MappedFile(path)
            self._open[path] = mf
            while len(self._open) > self._max_open:
                self._open.popitem(last=False)[1].close()
            return mf

    def close(self) -> None:
        with self._lock:
            for mf in self._open.values():
                mf.close()
            self._open.clear()


def fingerprint_verified(ref: TensorRef, loader: TensorLoader) -> str:
    """The stored tensor's fingerprint from its bytes; ``InputError`` if ``ref`` carries an
    index fingerprint that differs."""
    from ftkit.dumps.layout import DUMP_SCHEME
    from ftkit.tensors.fingerprint import fingerprint_array

    return check_fingerprint(ref, fingerprint_array(loader.load(ref), DUMP_SCHEME))


def fingerprint_all(refs: list[TensorRef], loader: TensorLoader) -> list[str]:
    """``fingerprint_verified`` of every ref, hashed on the shared thread pool (one tensor per
    task; the hasher releases the GIL, so a file of several tensors hashes on every core)."""
    from ftkit.tensors.parallel import map_ordered

    return map_ordered(partial(fingerprint_verified, loader=loader), refs)


def check_fingerprint(ref: TensorRef, fp: str) -> str:
    """``fp`` (computed from the stored bytes); ``InputError`` if the index recorded another."""
    if ref.fingerprint is not None and fp != ref.fingerprint:
        raise InputError(
            f"tensor {ref.info.name!r} in {ref.file} does not match the fingerprint in its index",
            "the dump data is corrupt (changed after it was written); re-create it",
        )
    return fp
