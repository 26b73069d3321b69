"""Checkpoint files written or read in one pass, their records computed on every core.

``write_files`` serialises ``{name: tensor}`` maps in the safetensors format (8-byte header
length, JSON header padded to 8 bytes, data in header order; tensors sorted by name, so the
same state gives the same bytes). Each file is one job (``digest.FileWriter``): it is written
straight from the tensors' memory (no copy) in 1 MiB pieces, each piece fed to the file's
sha256, the tensor's fingerprint and the NaN/Inf scan while it is in cache, and fsynced once as
soon as it is written; the files run in parallel on every core.

``digest_files`` (the verifier): ``ftkit.tensors.st.read_header`` validates each file's
structure, then each file is read once, sequentially, its sha256, fingerprints and scan fed
from the same 1 MiB pieces (``digest.FileReader``), the files in parallel. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftkit.checkpoint.digest import FileReader, FileRecord, FileWriter, TensorRecord, run_digests
from ftkit.checkpoint.scan import CHUNK_BYTES, host_bytes
from ftkit.errors import InputError
from ftkit.tensors.fingerprint import SCHEME

__all__ = [
    "FileRecord",
    "TensorRecord",
    "StLayout",
    "layout_st",
    "payload_nbytes",
    "tensor_nbytes",
    "write_files",
    "write_plain",
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
    """Write every file and return their records: one job per file (``digest.FileWriter``)
    writes it straight from the tensors' memory in 1 MiB pieces, feeds each piece to its
    sha256, fingerprint and scan, and fsyncs it (once, as soon as it is written); the files in
    parallel, the largest first.

    Raises the first ``OSError`` of a writer (e.g. ENOSPC) once no job runs any more, so
    nothing touches the files after it returns or raises.
    """
    writers = [FileWriter(p, files[p].head, files[p].items, files[p].size, fsync) for p in files]
    for _ in run_digests(writers):
        pass
    return {w.path: w.record() for w in writers}


def write_plain(path: Path, layout: StLayout, fsync: bool = True) -> None:
    """Write ``layout`` to ``path`` straight from the tensors' memory (no copy) and without any
    digest (a file no manifest lists, such as an exported model's shard); fsynced unless
    ``fsync`` is false. Throughput is a raw write's."""
    with open(path, "wb") as fh:
        fh.write(layout.head)
        for *_, flat in layout.items:
            fh.write(flat.data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def write_st(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> FileRecord:
    """Write one safetensors file (no fsync); returns its record."""
    return write_files({path: layout_st(tensors, metadata)}, fsync=False)[path]


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


def digest_files(
    files: Sequence[tuple[Path, bool]], scheme: str = SCHEME
) -> Iterator[tuple[Path, FileRecord | InputError]]:
    """Re-derive the records of ``(path, is_safetensors)`` files from disk (tensor fingerprints
    in ``scheme``, the manifest's ``fingerprint_scheme``), yielding each as it
    is done: a safetensors file's header is validated first (``read_header`` fails closed on
    every structural error; its ``InputError`` is yielded instead of a record); then each file
    is read once (``digest.FileReader``), all files at once, the largest
    first. An unreadable file yields an ``InputError`` too."""
    from ftkit.tensors.st import read_header

    todo: list[FileReader] = []
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
        todo.append(FileReader(path, size, None if header is None else list(header.tensors.values()), scheme))
    for i in run_digests(todo):
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
