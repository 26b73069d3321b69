"""Checkpoint files written or read in one pass, their records computed on every core.

``write_files`` serialises ``{name: tensor}`` maps in the safetensors format (8-byte header
length, JSON header padded to 8 bytes, data in header order; tensors sorted by name, so the
same state gives the same bytes). Each file is written by its own thread straight from the
tensors' memory (no copy, one ``write`` per tensor) and fsynced once by that thread as soon as
it is written, while the ``ftkit.checkpoint.digest`` jobs (sha256 per file, fingerprint + NaN/Inf
scan per tensor) run over the same memory on every core.

``digest_files`` (the verifier): ``ftkit.tensors.st.read_header`` validates each file's
structure, then each file is read once, sequentially, its sha256, fingerprints and scan fed
from the same 1 MiB pieces (``digest.FileDigest``), the files in parallel. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftkit.checkpoint.digest import READERS, Digest, FileDigest, FileRecord, TensorRecord, run_digests
from ftkit.checkpoint.scan import CHUNK_BYTES, host_bytes
from ftkit.errors import InputError

__all__ = [
    "FileRecord",
    "TensorRecord",
    "StLayout",
    "layout_st",
    "payload_nbytes",
    "tensor_nbytes",
    "write_files",
    "write_st",
    "write_json",
    "fsync_file",
    "sha256_file",
    "digest_files",
    "digest_st",
]


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


def tensor_nbytes(t: Any) -> int:
    """Bytes of data of one tensor (torch tensor or numpy array)."""
    return int(t.nbytes) if isinstance(t, np.ndarray) else int(t.numel() * t.element_size())


def payload_nbytes(tensors: Mapping[str, Any]) -> int:
    """Bytes of tensor data a file of ``tensors`` holds (without the header)."""
    return sum(tensor_nbytes(t) for t in tensors.values())


def write_files(files: Mapping[Path, StLayout], fsync: bool = True) -> dict[Path, FileRecord]:
    """Write every file, fsync it (once, by its writer, as soon as it is written, while the
    digest jobs of the others go on) and return their records.

    Raises the first ``OSError`` of a writer (e.g. ENOSPC) once every writer and job ended, so
    nothing touches the files after it returns or raises.
    """
    paths = list(files)
    digests = [Digest(files[p].size, [files[p].head, *(f for *_, f in files[p].items)], files[p].items) for p in paths]
    with ThreadPoolExecutor(max_workers=max(1, len(paths)), thread_name_prefix="ftkit-ckpt-write") as writers:
        written = [writers.submit(_write_file, p, files[p], fsync) for p in paths]
        try:
            for _ in run_digests(digests):
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
    every structural error; its ``InputError`` is yielded instead of a record); then each file
    is read once (``digest.FileDigest``), all files at once on ``READERS`` threads, the largest
    first. An unreadable file yields an ``InputError`` too."""
    from ftkit.tensors.st import read_header

    todo: list[FileDigest] = []
    for path, is_st in files:
        try:
            header = read_header(path) if is_st else None
            size = path.stat().st_size
        except InputError as exc:
            yield path, exc
            continue
        except (OSError, ValueError) as exc:
            yield path, InputError(f"cannot read {path}: {exc}", "check the path and permissions")
            continue
        if header is not None and header.size != size:
            yield path, InputError(f"{path} changed while it was read", "verify again")
            continue
        todo.append(FileDigest(path, size, None if header is None else list(header.tensors.values())))
    for i in run_digests(todo, workers=READERS):
        try:
            yield todo[i].path, todo[i].record()
        except OSError as exc:
            yield todo[i].path, InputError(f"cannot read {todo[i].path}: {exc}", "check the file and verify again")


def digest_st(path: Path) -> FileRecord:
    """Re-derive one safetensors file's record from disk; ``InputError`` when it is malformed."""
    (_, rec), *_ = digest_files([(path, True)])
    if isinstance(rec, InputError):
        raise rec
    return rec
