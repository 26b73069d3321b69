"""The record of a checkpoint file, computed as jobs that keep every core busy.

A file's record (``FileRecord``: size, sha256, and for safetensors each tensor's
``TensorRecord``: dtype, shape, fingerprint, NaN/Inf count) comes from ``Digest`` jobs over
bytes already in memory (the tensors being written, or a mapped file being verified): the
sha256 of the whole file is one job (it is sequential), each tensor's fingerprint + scan
another, in one pass over each 1 MiB piece. ``run_digests`` runs the jobs of many files
together on ``WORKERS`` threads, longest first: hashlib's sha256 on a large buffer, xxh3
through ctypes (``ftkit.tensors.xxh3``) and numpy's ufuncs all release the GIL, so the
largest file's sha256 starts at once and the rest fills the other cores around it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from ftkit.checkpoint.scan import CHUNK_BYTES, count_nonfinite, dtype_of
from ftkit.tensors.fingerprint import fingerprint_hasher

WORKERS = max(1, min(16, os.cpu_count() or 1))  # digest threads (the work releases the GIL)
Job = tuple[int, Callable[[], None]]  # (bytes it covers, work)
_PIECE = 1 << 20  # fingerprint + scan granularity: the scan reads what the hash just read, from cache
AHEAD = 64 << 20  # how far ahead of its sha256 a mapped file is read in (``MADV_WILLNEED``)
Advise = Callable[[int, int], None]  # (offset, length) of a file's bytes about to be read


@dataclass(frozen=True)
class TensorRecord:
    """What the manifest says about one tensor."""

    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    fingerprint: str
    nonfinite: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "fingerprint": self.fingerprint,
            "nonfinite": self.nonfinite,
        }


@dataclass(frozen=True)
class FileRecord:
    """What the manifest says about one file: size, sha256, and its tensors (None: not safetensors)."""

    size: int
    sha256: str
    tensors: dict[str, TensorRecord] | None = None


class Digest:
    """The record of one file computed from its bytes in memory, as independent jobs.

    ``whole`` are the file's bytes in order (its sha256); ``tensors`` are ``(name, code, shape,
    bytes)`` (fingerprint and NaN/Inf count each), or None for a file that is not safetensors.
    ``advise(offset, length)`` (a mapped file) is told what the sha256 will read next, so the
    disk works ahead of the hash in a bounded window whatever the file's size.
    """

    def __init__(
        self,
        size: int,
        whole: Sequence[Any],
        tensors: Sequence[tuple[str, str, tuple[int, ...], Any]] | None,
        advise: Advise | None = None,
    ) -> None:
        self.size = size
        self._whole = whole
        self._tensors = tensors
        self._advise = advise
        self._sha = ""
        self._found: dict[str, TensorRecord] = {}

    def jobs(self) -> list[Job]:
        out: list[Job] = [(self.size, self._hash)]
        for name, code, shape, buf in self._tensors or ():
            out.append((len(buf), functools.partial(self._tensor, name, code, shape, buf)))
        return out

    def _hash(self) -> None:
        sha = hashlib.sha256()
        pos = 0
        for buf in self._whole:
            for i in range(0, len(buf), CHUNK_BYTES):
                if self._advise is not None and pos + AHEAD < self.size:
                    self._advise(pos + AHEAD, CHUNK_BYTES)
                piece = buf[i : i + CHUNK_BYTES]
                sha.update(piece)
                pos += len(piece)
        self._sha = sha.hexdigest()

    def _tensor(self, name: str, code: str, shape: tuple[int, ...], buf: Any) -> None:
        h = fingerprint_hasher(dtype_of(code), shape)
        bad = 0
        for i in range(0, len(buf), _PIECE):  # fingerprint and scan each piece while it is in cache
            piece = buf[i : i + _PIECE]
            h.update(piece)
            bad += count_nonfinite(code, piece)
        self._found[name] = TensorRecord(dtype_of(code), shape, h.hexdigest(), bad)

    def record(self) -> FileRecord:
        """The record, once every job ran."""
        names = None if self._tensors is None else [t[0] for t in self._tensors]
        return FileRecord(self.size, self._sha, None if names is None else {n: self._found[n] for n in names})

    def release(self) -> None:
        """Drop the references to the bytes (before the memory they view goes away)."""
        self._whole, self._tensors = (), None


def run_digests(digests: Sequence[Digest]) -> Iterator[int]:
    """Run every job of ``digests`` on ``WORKERS`` threads, longest first; yield the index of
    each digest as its last job ends. The first job error is raised once nothing runs."""
    jobs = sorted(((cost, i, fn) for i, d in enumerate(digests) for cost, fn in d.jobs()), key=lambda j: -j[0])
    left = [0] * len(digests)
    for _, i, _ in jobs:
        left[i] += 1
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(jobs) or 1), thread_name_prefix="ftkit-ckpt-digest") as pool:
        futures: dict[Future[None], int] = {pool.submit(fn): i for _, i, fn in jobs}
        try:
            for fut in as_completed(futures):
                fut.result()
                i = futures[fut]
                left[i] -= 1
                if not left[i]:
                    yield i
        finally:
            for fut in futures:
                fut.cancel()


def advisor(mm: mmap.mmap) -> Advise | None:
    """``MADV_WILLNEED`` over a range of ``mm`` (asynchronous read-ahead), where the platform has it."""
    if not hasattr(mmap, "MADV_WILLNEED"):
        return None

    def advise(offset: int, length: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # a hint: the mapping may be closing
            mm.madvise(mmap.MADV_WILLNEED, offset, length)

    return advise
