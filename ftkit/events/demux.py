"""``DemuxStream``: any interleaving of a run's lines, read back as the per-process streams.

A run's log may arrive as one file (``cat events/*.jsonl``, a log shipper's stream, a CI
artefact), split over several files, gzipped, on standard input, in any line order. Every line
carries its source and a gap-free ``seq`` per source (``ftkit.events.keys``), so the reader
demultiplexes by source, orders each source by ``seq`` and merges the sources by time exactly as
``EventStream`` merges per-process files: the replay sees the same events in the same order.

Two ways, chosen by a first, cheap pass over the keys only (no full decode):

- **sequential**: when the input is already in the merged order (each source's ``seq`` strictly
  rising and the lines sorted by ``(time, source file name)`` -- what ``write_merged_log`` and a
  time-ordered shipper produce), the lines are read once more and handed on in place. Memory:
  one entry per source, plus the source of each line spilled to a temporary file (4 bytes a line).
- **sorted**: otherwise (any other order, duplicates, standard input) the lines are sorted by
  (source, seq) with ``ftkit.events.spill.LineSorter``: in memory up to ``spill_bytes`` (64 MiB),
  on disk beyond, merged with a bounded fan-in. Each source is then read from its own range.

Duplicates (same source and ``seq``) can only meet in the sorted way: an identical copy is an
issue of kind ``duplicate`` (an FT111 warning) and is skipped; a different line with the same
source and ``seq`` is ``conflicting`` (an FT111 error), and only the first line in (seq, bytes)
order of a source's lines is used, so the choice does not depend on the input's order. Lines
without a usable key (``keys.line_key`` is None) form one more stream that sorts last; they can
only produce findings (malformed or invalid lines).

Items are located by ``loc = input_index << 40 | line_number``; ``locate`` turns it back into
``(file, line)`` of the input the line was read from.
"""

from __future__ import annotations

import array
import builtins
import math
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ftkit.events import reader
from ftkit.events.keys import ENVELOPE, SourceTable, line_key
from ftkit.events.reader import (
    _GZIP_MAGIC,
    BLOCK,
    SAFE_LEN,
    STDIN,
    IssueCallback,
    ReadCounts,
    decode,
    fast_loads,
    merge_by_time,
    read_blocks,
    read_lines,
    size_of,
)
from ftkit.events.spill import SPILL_BYTES, LineSorter, Record

LINE_BITS = 40
_LINE_MASK = (1 << LINE_BITS) - 1
_SIDS_BLOCK = 1 << 18
UNKEYED_LABEL = "(lines without a source)"
TICK_LINES = 4096  # lines between two progress calls in the partition pass


class DemuxStream(ReadCounts):
    """Per-source streams of ``files`` (any line order), merged by time; see the module docstring."""

    def __init__(
        self,
        files: list[Path],
        on_issue: IssueCallback,
        spill_bytes: int = SPILL_BYTES,
        tmpdir: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Runs the first pass (and, the sorted way, the partition); ``progress(done, total)`` is
        called as they read (see ``position``), so a bar moves before the first event is replayed."""
        self.files = files
        self.inputs = ["<stdin>" if p is STDIN else str(p) for p in files]
        self.on_issue = on_issue
        self.table = SourceTable()
        self.counts = [0, 0]  # lines, bytes read by the pass that reports issues
        self._tmpdir = tmpdir
        self._sids: Path | None = None
        self._last: dict[int, int] = {}
        self._unkeyed: int | None = None
        self._sorter: LineSorter | None = None
        self.size = sum(size_of(p) for p in files)
        self._on_progress = progress
        self._passes, self._before, self._phase, self._scanned, self._replayed = 2, 0, "scan", 0, 0
        sequential = STDIN not in files and self._scan()
        if not sequential:
            self._drop_sids()
            self._sorter = LineSorter(self.table.sort_keys, spill_bytes, tmpdir)
            self._passes, self._before, self._phase = 3, self.size, "partition"
            self._partition()
        self._before, self._phase = self.size * (self._passes - 1), "replay"
        self.mode = "sequential" if sequential else "sorted"
        self._index = self.table.order()
        self.names = [""] * len(self._index)
        for sid, si in enumerate(self._index):
            self.names[si] = self.table.labels[sid]

    def position(self) -> int:
        """Bytes of all passes so far, each capped at the inputs' size: the keys-only scan, the
        partition (the sorted way), then the replay's pass (the lines read, or handed on from the
        sorted runs); ``work`` is the inputs' size times the passes (2, or 3 the sorted way)."""
        if self._phase == "scan":
            current = self._scanned
        elif self._phase == "partition" or self._sorter is None:
            current = self.counts[1]
        else:
            current = self._replayed
        return self._before + min(current, self.size)

    def work(self) -> int:
        return self.size * self._passes

    def _tick(self) -> None:
        if self._on_progress is not None:
            self._on_progress(*self.progress())

    def _scan_tick(self, scanned: int) -> None:
        self._scanned = scanned
        self._tick()

    def locate(self, stream: int, loc: int) -> tuple[str, int]:
        """(input file, line number) of an item this stream yielded."""
        return self.inputs[loc >> LINE_BITS], loc & _LINE_MASK

    def _unkeyed_sid(self) -> int:
        if self._unkeyed is None:
            self._unkeyed = len(self.table)
            self.table.sort_keys.append(("\U0010ffff", b""))
            self.table.labels.append(UNKEYED_LABEL)
        return self._unkeyed

    # ------------------------------------------------------------------ first pass
    def _scan(self) -> bool:
        """Keys only: is the input already in merged order? Records each line's source (spilled to a
        temporary file) and each source's last line. Silent: the pass that follows reports issues."""
        sort_keys, last = self.table.sort_keys, self._last
        last_seq: dict[int, int] = {}
        last_time: dict[int, float] = {}
        prev_t, prev_sid, unkeyed = -math.inf, -1, -1
        sids = array.array("i")
        fd, name = tempfile.mkstemp(prefix="ftkit-sids-", dir=self._tmpdir)
        self._sids = Path(name)
        tick = None if self._on_progress is None else self._scan_tick
        scanned = 0  # bytes of the files scanned before this one
        with os.fdopen(fd, "wb") as out:
            for fi, path in enumerate(self.files):
                at = None if tick is None else (lambda pos, before=scanned: tick(before + pos))
                scanned += size_of(path)
                for lineno, sid, seq, t in _file_keys(path, fi << LINE_BITS, self.table, at):
                    if sid < 0:
                        sid = unkeyed = self._unkeyed_sid()
                    else:
                        if t is None:
                            t = last_time.get(sid, -math.inf)
                        elif t != t:
                            return False  # NaN: the sorted way merges it exactly as EventStream does
                        if seq <= last_seq.get(sid, seq - 1) or t < prev_t:
                            return False  # out of seq order, a duplicate, or not in merged order
                        if (
                            t == prev_t
                            and sid != prev_sid
                            and prev_sid != unkeyed
                            and sort_keys[sid] < sort_keys[prev_sid]
                        ):
                            return False
                        last_seq[sid], last_time[sid], prev_t, prev_sid = seq, t, t, sid
                    last[sid] = lineno
                    sids.append(sid)
                    if len(sids) >= _SIDS_BLOCK:
                        sids.tofile(out)
                        del sids[:]
            sids.tofile(out)
        return True

    def _partition(self) -> None:
        """Read every line once, report what cannot be keyed later, and hand the rest to the sorter."""
        assert self._sorter is not None
        self._last = {}
        table, add = self.table, self._sorter.add
        for fi, path in enumerate(self.files):
            base = fi << LINE_BITS
            for lineno, line, terminated in read_lines(path, self.on_issue, self.counts):
                if not lineno % TICK_LINES:
                    self._tick()
                if not terminated and self._decode(line, self.inputs[fi], lineno, False) is None:
                    continue  # a truncated last line, reported
                key = line_key(line, table)
                if key is None:
                    add(self._unkeyed_sid(), 0, line, base | lineno)
                else:
                    add(key[0], key[1], line, base | lineno)

    # ------------------------------------------------------------------ second pass
    def events(self) -> Iterator[tuple[Any, int, int]]:
        """``(event, stream, loc)`` in merged order; ``(None, stream, loc)`` after a stream's last item."""
        if self._sorter is None:
            return self._sequential()
        segments = self._sorter.segments()
        by_stream = sorted(range(len(self._index)), key=self._index.__getitem__)
        return merge_by_time(
            [self._sorted_stream(self._index[sid], sid, segments.get(sid, iter(()))) for sid in by_stream]
        )

    def _sequential(self) -> Iterator[tuple[Any, int, int]]:
        assert self._sids is not None
        index, on_issue = self._index, self.on_issue
        last = {index[sid]: loc for sid, loc in self._last.items()}
        sids = _read_sids(self._sids)
        for fi, path in enumerate(self.files):
            base, name = fi << LINE_BITS, self.inputs[fi]
            for before, block, terminated in read_blocks(path, on_issue, self.counts, BLOCK):
                lineno = base | before
                for line in block.split(b"\n"):
                    lineno += 1
                    if not line or line.isspace():
                        continue
                    sid = next(sids, -1)
                    if not 0 <= sid < len(index):
                        continue  # a line the scan did not see (the file grew): not part of this run's read
                    si = index[sid]
                    try:
                        if len(line) > SAFE_LEN:
                            raise ValueError  # decode() checks how deep it may nest
                        event = fast_loads(line)
                        if type(event) is dict:
                            yield event, si, lineno
                        else:
                            on_issue(
                                name, lineno & _LINE_MASK, "malformed", f"a JSON {type(event).__name__}, not an object"
                            )
                    except ValueError:
                        event = self._decode(line, name, lineno & _LINE_MASK, terminated)
                        if event is not None:
                            yield event, si, lineno
                    if last.get(si) == lineno:
                        yield None, si, lineno

    def _sorted_stream(self, si: int, sid: int, records: Iterator[Record]) -> Iterator[tuple[float, int, Any, int]]:
        """One source's heap items ``(time, stream, event, loc)`` (time: the last valid one, as in
        ``EventStream``), duplicates and conflicts reported and skipped."""
        last_t: Any = -math.inf
        prev_seq: int | None = None
        prev_line = b""
        dedupe, label = sid != self._unkeyed, self.table.labels[sid]
        for _, seq, loc, line in records:
            self._replayed += len(line) + 1
            name, lineno = self.inputs[loc >> LINE_BITS], loc & _LINE_MASK
            if dedupe and seq == prev_seq:
                if line == prev_line:
                    self.on_issue(name, lineno, "duplicate", f"second copy of {label} seq {seq} (delivered twice?)")
                else:
                    self.on_issue(
                        name, lineno, "conflicting", f"{label} seq {seq} is also a different line; this one is ignored"
                    )
                continue
            event = self._decode(line, name, lineno, True)
            if event is None:
                continue
            prev_seq, prev_line = seq, line
            t = event.get("time")
            if type(t) is float or type(t) is int:
                last_t = t
            yield last_t, si, event, loc

    def _decode(self, line: builtins.bytes, name: str, lineno: int, terminated: bool) -> dict[str, Any] | None:
        try:
            event = decode(line)
        except ValueError as exc:
            if terminated:
                self.on_issue(name, lineno, "malformed", f"not valid JSON: {_short(exc)}")
            else:
                self.on_issue(name, lineno, "truncated", "last line is incomplete (writer died mid-line?)")
            return None
        if type(event) is not dict:
            self.on_issue(name, lineno, "malformed", f"a JSON {type(event).__name__}, not an object")
            return None
        return event

    def close(self) -> None:
        """Delete temporary files (idempotent)."""
        if self._sorter is not None:
            self._sorter.close()
        self._drop_sids()

    def _drop_sids(self) -> None:
        if self._sids is not None:
            self._sids.unlink(missing_ok=True)
            self._sids = None


def _file_keys(
    path: Path, base: int, table: SourceTable, tick: Callable[[int], None] | None = None
) -> Iterator[tuple[int, int, int, float | None]]:
    """``(loc, sid, seq, time)`` of every line ``read_blocks`` would yield for ``path`` (sid -1: no
    usable key). A plain file is mapped and matched in place (no copies), ``tick(bytes scanned)``
    called every ``BLOCK``; gzip line by line."""
    try:
        with open(path, "rb") as fh:
            plain = fh.read(2) != _GZIP_MAGIC and os.fstat(fh.fileno()).st_size > 0
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if plain else None
    except (OSError, ValueError):
        mm = None
    if mm is None:
        for before, block, _ in read_blocks(path, _silent, [0, 0]):
            for lineno, line in enumerate(block.split(b"\n"), base | before + 1):
                if line and not line.isspace():
                    yield (lineno, *_line_key(line, table))
        return
    with mm:
        match, find, known, size = ENVELOPE.match, mm.find, table.raw_sids, len(mm)
        pos, lineno, limit, released = 0, base, reader.MAX_LINE, 0
        while pos < size:
            if pos - released > reader.BLOCK:
                released = reader.release(mm, released, pos)
                if tick is not None:
                    tick(pos)
            lineno += 1
            m = match(mm, pos)
            if m is not None and (sid := known.get((m[1], m[3]), -1)) >= 0:
                end = find(b"\n", m.end())
                end = end if end >= 0 else size
                if end - pos <= limit:  # a longer line is dropped by read_blocks
                    yield lineno, sid, int(m[4]), float(m[2])
                pos = end + 1
                continue
            end = find(b"\n", pos)
            line = mm[pos : end if end >= 0 else size]
            pos = end + 1 if end >= 0 else size
            if line and len(line) <= limit and not line.isspace():
                yield (lineno, *_line_key(line, table))


def _line_key(line: bytes, table: SourceTable) -> tuple[int, int, float | None]:
    key = line_key(line, table)
    return key if key is not None else (-1, 0, None)


def _silent(file: str, line: int, kind: str, message: str) -> None:
    return None


def _read_sids(path: Path) -> Iterator[int]:
    with open(path, "rb") as fh:
        while True:
            block = array.array("i")
            try:
                block.fromfile(fh, _SIDS_BLOCK)
            except EOFError:
                yield from block
                return
            yield from block


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."
