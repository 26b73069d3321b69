"""One pass over a checkpoint file's bytes: write or read, hashing and scanning as it goes.

``write_st`` serialises ``{name: tensor}`` in the safetensors format (8-byte header length,
JSON header padded to 8 bytes, data in header order; tensors sorted by name, so the same
state gives the same bytes) and, chunk by chunk while the bytes are hot in cache, feeds the
file's sha256, each tensor's fingerprint (``ftkit.tensors.fingerprint``) and the NaN/Inf scan.
It does not fsync (the publisher fsyncs every file in its own phase). No pickle anywhere.

``digest_st`` recomputes the same record from a file on disk (the verifier): the sha256 of
the whole file runs on a helper thread (hashlib releases the GIL) while this thread parses
the header with ``ftkit.tensors.st.read_header`` (which fails closed on every structural
error) and fingerprints and scans each tensor from a memory map.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import queue
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ftkit.checkpoint.scan import CHUNK_BYTES, count_nonfinite, dtype_of, host_bytes
from ftkit.tensors.fingerprint import fingerprint_buffers


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


def payload_nbytes(tensors: Mapping[str, Any]) -> int:
    """Bytes of tensor data ``write_st`` will write for ``tensors`` (without the header)."""
    total = 0
    for t in tensors.values():
        total += int(t.nbytes) if isinstance(t, np.ndarray) else int(t.numel() * t.element_size())
    return total


def write_st(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> FileRecord:
    """Write ``tensors`` to ``path`` as safetensors; returns the file's record (no fsync).

    The bytes are written chunk by chunk on this thread while a helper thread (``_Digester``)
    feeds the same chunks, in order, to the file's sha256, the tensor's fingerprint and the
    NaN/Inf count, so hashing overlaps the write instead of adding to it.
    """
    items = [(name, *host_bytes(tensors[name])) for name in sorted(tensors)]
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    pos = 0
    for name, code, shape, flat in items:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [pos, pos + flat.size]}
        pos += flat.size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    digester = _Digester(head, [(name, code, shape) for name, code, shape, _ in items])
    try:
        with open(path, "wb") as fh:
            fh.write(head)
            for _, _, _, flat in items:
                for i in range(0, flat.size, CHUNK_BYTES):
                    piece = flat[i : i + CHUNK_BYTES].data
                    digester.feed(piece)
                    fh.write(piece)
                digester.feed(None)
    except BaseException:
        digester.abort()
        raise
    sha, records = digester.result()
    return FileRecord(size=len(head) + pos, sha256=sha, tensors=records)


class _Digester:
    """A helper thread that hashes and scans the chunks of ``write_st`` in order.

    ``feed(chunk)`` queues a chunk of the current tensor, ``feed(None)`` ends the tensor;
    ``result()`` waits and returns ``(sha256 hex, {name: TensorRecord})`` or re-raises the
    thread's error; ``abort()`` stops it (the write failed).
    """

    _ABORT = object()

    def __init__(self, head: bytes, tensors: list[tuple[str, str, tuple[int, ...]]]) -> None:
        self.sha = hashlib.sha256(head)
        self.records: dict[str, TensorRecord] = {}
        self.error: BaseException | None = None
        self.queue: queue.Queue[object] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._run, args=(tensors,), daemon=True, name="ftkit-ckpt-digest")
        self.thread.start()

    def feed(self, chunk: memoryview | None) -> None:
        self.queue.put(chunk)

    def abort(self) -> None:
        self.queue.put(self._ABORT)
        self.thread.join()

    def result(self) -> tuple[str, dict[str, TensorRecord]]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.sha.hexdigest(), self.records

    def _run(self, tensors: list[tuple[str, str, tuple[int, ...]]]) -> None:
        self.ended = 0  # end-of-tensor markers consumed
        try:
            for name, code, shape in tensors:
                bad = [0]
                fp = fingerprint_buffers(dtype_of(code), shape, self._chunks(code, bad))
                self.records[name] = TensorRecord(dtype_of(code), shape, fp, bad[0])
        except _Aborted:
            return
        except BaseException as exc:  # re-raised by result(); drain so the writer never blocks
            self.error = exc
            while self.ended < len(tensors):
                item = self.queue.get()
                if item is self._ABORT:
                    return
                self.ended += item is None

    def _chunks(self, code: str, bad: list[int]) -> Iterator[memoryview]:
        while True:
            chunk = self.queue.get()
            if chunk is None:
                self.ended += 1
                return
            if chunk is self._ABORT:
                raise _Aborted
            assert isinstance(chunk, memoryview)
            self.sha.update(chunk)
            bad[0] += count_nonfinite(code, chunk)
            yield chunk


class _Aborted(Exception):
    pass


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


def digest_st(path: Path, on_bytes: Any = None) -> FileRecord:
    """Re-derive a safetensors file's record from disk; ``InputError`` when it is malformed.

    ``on_bytes(n)`` is called as tensor bytes are processed (progress).
    """
    from ftkit.tensors.st import read_header

    header = read_header(path)  # structural checks before anything trusts an offset
    result: dict[str, str] = {}
    records: dict[str, TensorRecord] = {}
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            hasher = threading.Thread(target=_sha_into, args=(view, result), daemon=True)
            hasher.start()
            try:
                for info in header.tensors.values():
                    data = view[info.start : info.end]
                    pieces = (data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES))
                    fp = fingerprint_buffers(info.dtype, info.shape, pieces)
                    records[info.name] = TensorRecord(info.dtype, info.shape, fp, count_nonfinite(info.code, data))
                    del data
                    if on_bytes is not None:
                        on_bytes(info.nbytes)
            finally:
                hasher.join()
                view.release()
    return FileRecord(size=size, sha256=result["sha256"], tensors=records)


def _sha_into(view: memoryview, out: dict[str, str]) -> None:
    sha = hashlib.sha256()
    for i in range(0, len(view), CHUNK_BYTES):
        sha.update(view[i : i + CHUNK_BYTES])
    out["sha256"] = sha.hexdigest()
