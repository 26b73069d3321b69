"""Checkpoint files, each hashed in one pass, with both cores on it: write or read.

Every file record (size, sha256, and for safetensors each tensor's fingerprint and NaN/Inf
count) comes from ``_Digest`` jobs over bytes already in memory: the sha256 of the whole file
is one job (it is sequential), each tensor's fingerprint + scan another. The jobs of all the
files run together on ``WORKERS`` threads, longest first (hashlib's sha256 on a large buffer,
xxh3 through ctypes and numpy's ufuncs all release the GIL), so the largest file's sha256 starts
at once and the rest fills the other cores around it.

``write_files`` serialises ``{name: tensor}`` maps in the safetensors format (8-byte header
length, JSON header padded to 8 bytes, data in header order; tensors sorted by name, so the
same state gives the same bytes). Each file is written by its own thread straight from the
tensors' memory (no copy), and its write-back is started at once (``sync_file_range``) so the
publisher's later fsync only waits for what is still in flight; the digest jobs run over the
same memory meanwhile. ``digest_files`` (the verifier) maps each file once (``mmap``, with a
read-ahead hint) after ``ftkit.tensors.st.read_header`` has validated its structure, and runs
the same jobs over the mapped bytes, the disk reading a bounded window ahead of each file's sha256
(``MADV_WILLNEED``). No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import mmap
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftkit.checkpoint.scan import CHUNK_BYTES, count_nonfinite, dtype_of, host_bytes
from ftkit.errors import InputError
from ftkit.tensors.fingerprint import fingerprint_hasher

WORKERS = max(1, min(16, os.cpu_count() or 1))  # digest threads (the work releases the GIL)
Job = tuple[int, Callable[[], None]]  # (bytes it covers, work)
_PIECE = 1 << 20  # fingerprint + scan granularity: the scan reads what the hash just read, from cache
_AHEAD = 64 << 20  # how far ahead of its sha256 a mapped file is read in (``MADV_WILLNEED``)
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


class _Digest:
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
                if self._advise is not None and pos + _AHEAD < self.size:
                    self._advise(pos + _AHEAD, CHUNK_BYTES)
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


def _run(digests: Sequence[_Digest]) -> Iterator[int]:
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


@dataclass(frozen=True)
class StLayout:
    """A safetensors file laid out over in-memory tensors: header bytes and each tensor's bytes."""

    head: bytes
    items: list[tuple[str, str, tuple[int, ...], np.ndarray]]  # name, code, shape, flat uint8 bytes

    @property
    def size(self) -> int:
        return len(self.head) + sum(flat.size for *_, flat in self.items)


def layout_st(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> StLayout:
    """Lay ``tensors`` out as safetensors (sorted by name; torch tensors moved to the host)."""
    items = [(name, *host_bytes(tensors[name])) for name in sorted(tensors)]
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    pos = 0
    for name, code, shape, flat in items:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [pos, pos + flat.size]}
        pos += flat.size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return StLayout(struct.pack("<Q", len(raw)) + raw, items)


def payload_nbytes(tensors: Mapping[str, Any]) -> int:
    """Bytes of tensor data a file of ``tensors`` holds (without the header)."""
    total = 0
    for t in tensors.values():
        total += int(t.nbytes) if isinstance(t, np.ndarray) else int(t.numel() * t.element_size())
    return total


def write_files(files: Mapping[Path, StLayout], fsync: bool = True) -> dict[Path, FileRecord]:
    """Write every file, fsync it (once, by its writer, as soon as it is written, while the
    digest jobs of the others go on) and return their records.

    Raises the first ``OSError`` of a writer (e.g. ENOSPC) once every writer and job ended, so
    nothing touches the files after it returns or raises.
    """
    paths = list(files)
    digests = [_Digest(files[p].size, [files[p].head, *(f for *_, f in files[p].items)], files[p].items) for p in paths]
    with ThreadPoolExecutor(max_workers=max(1, len(paths)), thread_name_prefix="ftkit-ckpt-write") as writers:
        written = [writers.submit(_write_file, p, files[p], fsync) for p in paths]
        try:
            for _ in _run(digests):
                pass
        finally:
            errors = [e for e in (w.exception() for w in written) if e is not None]
        if errors:
            raise errors[0]
    return {p: d.record() for p, d in zip(paths, digests)}


def write_st(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> FileRecord:
    """Write one safetensors file (no fsync); returns its record."""
    return write_files({path: layout_st(tensors, metadata)}, fsync=False)[path]


def _write_file(path: Path, layout: StLayout, fsync: bool) -> None:
    with open(path, "wb", buffering=0) as fh:
        for view in [memoryview(layout.head), *(flat.data for *_, flat in layout.items)]:
            while view:  # one system call per tensor unless the kernel writes less
                view = view[fh.write(view) :]
        if fsync:
            os.fsync(fh.fileno())


def write_json(path: Path, doc: Mapping[str, Any]) -> FileRecord:
    """Write a small JSON document (``meta.json``); returns its record (no fsync)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    with open(path, "wb") as fh:
        fh.write(data)
    return FileRecord(size=len(data), sha256=hashlib.sha256(data).hexdigest())


def fsync_file(path: Path) -> None:
    """fsync a file that was written without it."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def sha256_file(path: Path) -> str:
    """sha256 of a whole file, read in chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            sha.update(chunk)
    return sha.hexdigest()


def digest_files(files: Sequence[tuple[Path, bool]]) -> Iterator[tuple[Path, FileRecord | InputError]]:
    """Re-derive the records of ``(path, is_safetensors)`` files from disk, yielding each as it
    is done: a safetensors file's header is validated first (``read_header`` fails closed on
    every structural error; its ``InputError`` is yielded instead of a record); an unreadable
    file yields an ``InputError`` too."""
    from ftkit.tensors.st import read_header

    maps: list[mmap.mmap] = []
    views: list[memoryview] = []
    todo: list[tuple[Path, _Digest]] = []
    try:
        for path, is_st in files:
            try:
                header = read_header(path) if is_st else None
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            except InputError as exc:
                yield path, exc
                continue
            except (OSError, ValueError) as exc:
                yield path, InputError(f"cannot read {path}: {exc}", "check the path and permissions")
                continue
            view = memoryview(mm if mm is not None else b"")
            advise = None
            if mm is not None:
                maps.append(mm)
                views.append(view)
                advise = _advisor(mm)
                if advise is not None:
                    advise(0, _AHEAD)  # the first window; the sha256 job keeps asking ahead
            tensors = None
            if header is not None:
                tensors = [(t.name, t.code, t.shape, view[t.start : t.end]) for t in header.tensors.values()]
            todo.append((path, _Digest(size, [view], tensors, advise)))
        for i in _run([d for _, d in todo]):
            yield todo[i][0], todo[i][1].record()
    finally:
        for _, d in todo:
            d.release()
        try:
            for view in views:
                view.release()
            for mm in maps:
                mm.close()
        except BufferError:  # a slice is still referenced (an error mid-job): the collector closes it
            pass


def _advisor(mm: mmap.mmap) -> Advise | None:
    """``MADV_WILLNEED`` over a range of ``mm`` (asynchronous read-ahead), where the platform has it."""
    if not hasattr(mmap, "MADV_WILLNEED"):
        return None

    def advise(offset: int, length: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # a hint: the mapping may be closing
            mm.madvise(mmap.MADV_WILLNEED, offset, length)

    return advise


def digest_st(path: Path) -> FileRecord:
    """Re-derive one safetensors file's record from disk; ``InputError`` when it is malformed."""
    (_, rec), *_ = digest_files([(path, True)])
    if isinstance(rec, InputError):
        raise rec
    return rec
