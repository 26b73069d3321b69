"""Bounded-memory sort of log lines by (source, seq): in memory when small, on disk when large.

``LineSorter(sort_keys, budget, tmpdir)`` takes ``add(sid, seq, line, loc)`` calls in any order and
hands back, per ``sid``, the lines ordered by ``(seq, line)`` (``segments()``). Lines are held in
memory until they take ``budget`` bytes (line bytes plus ``OVERHEAD`` per line for the Python
objects); then the buffer is sorted and written to a *run* file under ``tmpdir``. At the end the
runs are merged (at most ``FAN_IN`` at a time, so a merge holds ``FAN_IN`` read buffers) into one
file sorted by (source, seq, line) and each source's byte range in it is recorded. Peak memory is
therefore about ``budget`` (default 64 MiB) plus ``FAN_IN`` x ``BUFFER`` bytes, whatever the input
size; disk use is at most twice the input's uncompressed size, released by ``close()``.

Records on disk are ``<sid u32><seq i64><loc u64><len u32>`` followed by the line's bytes.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

SPILL_BYTES = 64 << 20
OVERHEAD = 120  # Python object bytes per buffered line (tuple, bytes header, ints)
FAN_IN = 64
BUFFER = 256 << 10
_HEAD = struct.Struct("<IqQI")
Record = tuple[int, int, int, bytes]  # (sid, seq, loc, line)


class LineSorter:
    """Collect lines, then give each source's lines sorted by ``(seq, line)``."""

    def __init__(
        self, sort_keys: list[tuple[str, bytes]], budget: int = SPILL_BYTES, tmpdir: str | None = None
    ) -> None:
        self.sort_keys = sort_keys  # shared with the SourceTable: grows as sources appear
        self.budget = budget
        self._tmpdir = tmpdir
        self._dir: str | None = None
        self._buffer: list[Record] = []
        self._held = 0
        self._runs: list[Path] = []
        self._files = 0
        self.spilled = 0  # bytes written to runs

    def add(self, sid: int, seq: int, line: bytes, loc: int) -> None:
        self._buffer.append((sid, seq, loc, line))
        self._held += len(line) + OVERHEAD
        if self._held > self.budget:
            self._spill()

    def _key(self, record: Record) -> tuple[tuple[str, bytes], int, bytes]:
        return self.sort_keys[record[0]], record[1], record[3]

    def _new_file(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="ftkit-events-", dir=self._tmpdir)
        self._files += 1
        return Path(self._dir) / f"part{self._files}"

    def _spill(self) -> None:
        self._buffer.sort(key=self._key)
        path = self._new_file()
        with open(path, "wb", buffering=BUFFER) as fh:
            self.spilled += _write(fh, self._buffer)
        self._runs.append(path)
        self._buffer, self._held = [], 0

    def segments(self) -> dict[int, Iterator[Record]]:
        """Per sid, an iterator of its records ordered by ``(seq, line)``; call once, after the last ``add``."""
        if not self._runs:
            self._buffer.sort(key=self._key)
            return _split_in_memory(self._buffer)
        if self._buffer:
            self._spill()
        runs = self._runs
        while len(runs) > FAN_IN:  # intermediate passes: each merge holds FAN_IN read buffers
            merged = []
            for start in range(0, len(runs), FAN_IN):
                out = self._new_file()
                self._merge(runs[start : start + FAN_IN], out)
                merged.append(out)
            self._runs = runs = merged
        final = self._new_file()
        ranges = self._merge(runs, final)
        self._runs = []
        return {sid: _read_range(final, start, end) for sid, (start, end) in ranges.items()}

    def _merge(self, group: list[Path], out: Path) -> dict[int, tuple[int, int]]:
        """Merge sorted runs into ``out``; returns each sid's byte range in it."""
        ranges: dict[int, tuple[int, int]] = {}
        files = [open(p, "rb", buffering=BUFFER) for p in group]  # noqa: SIM115 - closed below
        try:
            with open(out, "wb", buffering=BUFFER) as fh:
                pos, current, start = 0, -1, 0
                for record in heapq.merge(*(_records(f) for f in files), key=self._key):
                    if record[0] != current:
                        if current >= 0:
                            ranges[current] = (start, pos)
                        current, start = record[0], pos
                    pos += _write(fh, (record,))
                if current >= 0:
                    ranges[current] = (start, pos)
        finally:
            for f in files:
                f.close()
            for path in group:
                path.unlink()
        return ranges

    def close(self) -> None:
        """Delete the spill files (idempotent)."""
        self._buffer = []
        if self._dir is not None:
            for name in os.listdir(self._dir):
                os.unlink(os.path.join(self._dir, name))
            os.rmdir(self._dir)
            self._dir = None


def _write(fh: BinaryIO, records: Iterator[Record] | list[Record] | tuple[Record, ...]) -> int:
    written, pack, write = 0, _HEAD.pack, fh.write
    for sid, seq, loc, line in records:
        write(pack(sid, seq, loc, len(line)))
        write(line)
        written += _HEAD.size + len(line)
    return written


def _records(fh: BinaryIO, end: int | None = None) -> Iterator[Record]:
    unpack, size, read = _HEAD.unpack, _HEAD.size, fh.read
    pos = fh.tell()
    while end is None or pos < end:
        head = read(size)
        if len(head) < size:
            return
        sid, seq, loc, n = unpack(head)
        yield sid, seq, loc, read(n)
        pos += size + n


def _read_range(path: Path, start: int, end: int) -> Iterator[Record]:
    """The records of ``path`` in ``[start, end)``, read lazily (opened on first use)."""
    with open(path, "rb", buffering=64 << 10) as fh:
        fh.seek(start)
        yield from _records(fh, end)


def _split_in_memory(records: list[Record]) -> dict[int, Iterator[Record]]:
    groups: dict[int, list[Record]] = {}
    for record in records:
        groups.setdefault(record[0], []).append(record)
    return {sid: iter(group) for sid, group in groups.items()}
