"""The record of a checkpoint file, computed in the same pass that writes or reads it.

A file's record (``FileRecord``: size, sha256, and for safetensors each tensor's
``TensorRecord``: dtype, shape, fingerprint, NaN/Inf count) is fed piece by piece
(``Recorder``): the header bytes, then each tensor's bytes in pieces of at most ``PIECE``
(1 MiB; pieces never straddle a tensor, so no element is split), each piece going to the
sha256, the tensor's fingerprint and the NaN/Inf scan while it is in the core's cache.

* ``FileWriter`` (the publisher): ONE job per file writes each piece straight from the tensor's
  memory, feeds it to the recorder, and fsyncs the file at the end.
* ``FileReader`` (the verifier): ONE job per file reads it once, sequentially, into a reused
  buffer (``readinto``; the disk is asked ``WILLNEED`` 64 MiB ahead, 16 MiB at a time).

``run_digests`` runs the jobs of many files together on threads, the largest file first; the
parallelism comes from the files (a checkpoint's payload groups are sharded,
``ftkit.checkpoint.shards``). hashlib's sha256 on a buffer over 2 KiB, xxh3 through ctypes
(``ftkit.tensors.xxh3``), numpy's ufuncs, ``write`` and ``readinto`` all release the GIL.

Why this shape (measured on the 2-core VM, CPU seconds per GB, min of interleaved runs; see
docs/checkpoints.md "Speed"): fusing the passes per piece cut publication from ~2.4 (one writer
thread per file beside separate sha256 and per-tensor jobs over the same memory) to ~1.25, and
verification from ~1.2 (jobs over an ``mmap`` of each file) to ~1.0; sha256 is fed ``SHA_SLICE``
(32 KiB) at a time, where OpenSSL's SHA-NI sha256 runs at ~1.35-1.4 GB/s per core against
~1.05 GB/s on 1 MiB or larger buffers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftkit.checkpoint.scan import count_nonfinite, dtype_of
from ftkit.tensors.fingerprint import SCHEME, fingerprint_hasher

THREADS = 2 * max(1, min(16, os.cpu_count() or 1))  # one may wait on the disk while another hashes
Job = tuple[int, Callable[[], None]]  # (bytes it covers, work)
PIECE = 1 << 20  # fingerprint + scan (and read) granularity: stays in the core's cache for all passes
SHA_SLICE = 32 << 10  # what sha256 is fed at a time (module docstring)
AHEAD = 64 << 20  # how far ahead of the reader the disk is asked to read (``POSIX_FADV_WILLNEED``) ...
AHEAD_STEP = 16 << 20  # ... in requests of this size


def sha_update(sha: Any, buf: Any) -> None:
    """Feed ``buf`` to ``sha`` in ``SHA_SLICE`` slices (the fastest size measured)."""
    view = memoryview(buf).cast("B")
    for i in range(0, len(view), SHA_SLICE):
        sha.update(view[i : i + SHA_SLICE])


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


class Recorder:
    """A file's record, fed in order: ``header(bytes)``, then each tensor's pieces; tensor
    fingerprints in ``scheme`` (a manifest's ``fingerprint_scheme``)."""

    def __init__(self, size: int, safetensors: bool, scheme: str = SCHEME) -> None:
        self.size, self._scheme = size, scheme
        self._sha = hashlib.sha256()
        self._found: dict[str, TensorRecord] | None = {} if safetensors else None

    def header(self, buf: Any) -> None:
        """Bytes that belong to no tensor (a safetensors header; a whole non-tensor file)."""
        sha_update(self._sha, buf)

    def tensor(self, name: str, code: str, shape: tuple[int, ...], pieces: Iterable[Any]) -> None:
        """One tensor's bytes, in order, in pieces whose sizes are multiples of its item size."""
        h, bad = fingerprint_hasher(dtype_of(code), shape, self._scheme), 0
        for piece in pieces:
            sha_update(self._sha, piece)
            h.update(piece)
            bad += count_nonfinite(code, piece)
        assert self._found is not None
        self._found[name] = TensorRecord(dtype_of(code), shape, h.hexdigest(), bad)

    def record(self) -> FileRecord:
        return FileRecord(self.size, self._sha.hexdigest(), None if self._found is None else dict(self._found))


def pieces(flat: Any) -> Iterator[memoryview]:
    """``flat`` (a tensor's bytes) in ``PIECE`` slices."""
    view = memoryview(flat).cast("B")
    for i in range(0, len(view), PIECE):
        yield view[i : i + PIECE]


class FileWriter:
    """Writes one safetensors file from memory and computes its record in the same pass.

    ``head`` is the header bytes, ``items`` ``(name, code, shape, flat uint8 bytes)`` in file
    order. An ``OSError`` (e.g. ENOSPC) propagates out of the job (``run_digests`` raises it)."""

    def __init__(self, path: Path, head: bytes, items: Sequence[tuple[str, str, tuple[int, ...], Any]],
                 size: int, fsync: bool) -> None:  # fmt: skip
        self.path, self.size = path, size
        self._head, self._items, self._fsync = head, items, fsync
        self._record: FileRecord | None = None

    def jobs(self) -> list[Job]:
        return [(self.size, self._run)]

    def _run(self) -> None:
        rec = Recorder(self.size, True)
        with open(self.path, "wb", buffering=0) as fh:

            def written(views: Iterable[memoryview]) -> Iterator[memoryview]:
                for view in views:
                    rest = view
                    while rest:
                        rest = rest[fh.write(rest) :]
                    yield view

            rec.header(next(written([memoryview(self._head)])))
            for name, code, shape, flat in self._items:
                rec.tensor(name, code, shape, written(pieces(flat)))
            if self._fsync:
                os.fsync(fh.fileno())
        self._record = rec.record()

    def record(self) -> FileRecord:
        assert self._record is not None, "record() before the job ran"
        return self._record


class FileReader:
    """Reads one file on disk once and computes its record (module docstring).

    ``tensors`` is the validated safetensors header's tensors (``TensorInfo``: absolute
    ``start`` / ``end``, contiguous, covering the file after the header) or None for a file
    that is not safetensors. An ``OSError`` while reading (e.g. the file changed under us) is
    kept and raised by ``record``. Tensor fingerprints are computed in ``scheme``.
    """

    def __init__(self, path: Path, size: int, tensors: Sequence[Any] | None, scheme: str = SCHEME) -> None:
        self.path, self.size, self._tensors, self._scheme = path, size, tensors, scheme
        self._record: FileRecord | None = None
        self._error: OSError | None = None

    def jobs(self) -> list[Job]:
        return [(self.size, self._run)]

    def _run(self) -> None:
        try:
            self._record = self._read()
        except OSError as exc:
            self._error = exc

    def _read(self) -> FileRecord:
        rec = Recorder(self.size, self._tensors is not None, self._scheme)
        buf = memoryview(bytearray(PIECE))
        with open(self.path, "rb", buffering=0) as fh:
            fd = fh.fileno()
            _advise(fd, 0, 0, "POSIX_FADV_SEQUENTIAL")
            pos = asked = 0

            def read(end: int) -> Iterator[memoryview]:  # the bytes up to ``end``, piece by piece
                nonlocal pos, asked
                while pos < end:
                    while asked < min(self.size, pos + AHEAD):  # keep AHEAD bytes asked for
                        _advise(fd, asked, AHEAD_STEP, "POSIX_FADV_WILLNEED")
                        asked += AHEAD_STEP
                    n, got = min(PIECE, end - pos), 0
                    while got < n:
                        k = fh.readinto(buf[got:n])
                        if not k:
                            raise OSError(f"{self.path}: file shorter than its {self.size} bytes")
                        got += k
                    pos += n
                    yield buf[:n]

            tensors = sorted(self._tensors or (), key=lambda t: t.start)
            for piece in read(tensors[0].start if tensors else self.size):
                rec.header(piece)
            for t in tensors:
                rec.tensor(t.name, t.code, t.shape, read(t.end))
            if pos != self.size or fh.read(1):
                raise OSError(f"{self.path}: file longer than its {self.size} bytes")
        return rec.record()

    def record(self) -> FileRecord:
        """The record, once the job ran; the ``OSError`` it met, if any."""
        if self._error is not None:
            raise self._error
        assert self._record is not None, "record() before the job ran"
        return self._record


def _advise(fd: int, offset: int, length: int, what: str) -> None:
    """A ``posix_fadvise`` hint, where the platform has it (never fails)."""
    if hasattr(os, what):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, getattr(os, what))


def run_digests(digests: Sequence[FileWriter | FileReader], workers: int = THREADS) -> Iterator[int]:
    """Run every job of ``digests`` on ``workers`` threads, longest first; yield the index of
    each digest as its last job ends. The first job error is raised once nothing runs."""
    jobs = sorted(((cost, i, fn) for i, d in enumerate(digests) for cost, fn in d.jobs()), key=lambda j: -j[0])
    left = [0] * len(digests)
    for _, i, _ in jobs:
        left[i] += 1
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs) or 1), thread_name_prefix="ftkit-ckpt-digest") as pool:
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
