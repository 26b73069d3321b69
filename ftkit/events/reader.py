"""Streaming reader of event logs: files, directories, ``.gz``, standard input; never crashes.

``discover(paths)`` resolves the inputs: a file is taken as is (gzip recognised by its magic
bytes), a directory contributes every ``*.jsonl`` and ``*.jsonl.gz`` below it, ``-`` is standard
input. A missing or unreadable path, a directory without logs, or a path that is not a regular
file (a FIFO, device or socket: reading it could block forever) raises ``InputError`` (exit 2).

``read_blocks`` / ``read_lines`` read one log in bounded memory (plain files, gzip and standard
input alike are read a block at a time and handed on in blocks of whole lines).
``EventStream(files).events()`` is the per-process reader: it yields ``(event, file_index,
line_number)`` for every line that decodes to a JSON object, merging the files by ``time`` with a
heap (``merge_by_time``: each file stays in its own order), so memory is bounded by one pending
block per file. Any other arrangement of a run's lines is read by ``ftkit.events.demux``. Lines
that do not decode are reported to ``on_issue`` and skipped:

- ``truncated``: the last line of a file is unterminated and does not decode (a writer died
  mid-line) -- a warning;
- ``malformed``: any other line that is not a JSON object (bad bytes, bad JSON, nested too deeply
  to decode safely) -- an error;
- ``too_long``: a line over ``MAX_LINE`` bytes (skipped without being held in memory);
- ``unreadable``: an I/O or decompression error part-way through a file.

``decode`` uses orjson (it rejects the ``NaN``/``Infinity`` literals, so lines it refuses are
retried with the standard json module, which accepts them), and never hands orjson a line that
could nest deep enough to crash it.
"""

from __future__ import annotations

import contextlib
import gzip
import heapq
import io
import json
import mmap
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ftkit.errors import InputError

MAX_LINE = 16 << 20
CHUNK = 64 << 10  # per open file: small, so hundreds of files stay cheap
BLOCK = 1 << 20  # lines handed on at a time by a reader that has one file open at a time
LOG_SUFFIXES = (".jsonl", ".jsonl.gz")
_GZIP_MAGIC = b"\x1f\x8b"

fast_loads = orjson.loads  # the fast path of decode(); callers check the line's length first (SAFE_LEN)
IssueCallback = Callable[[str, int, str, str], None]  # (file, line, kind, message)


SAFE_LEN = 64 << 10  # lines up to this size cannot nest deep enough to crash orjson 3.8 (>30,000 objects)
MAX_NESTING = 4096  # a longer line with more brackets than this is decoded by the json module (RecursionError)


def decode(line: bytes) -> Any:
    """Decode one line safely; raises ValueError (never crashes the process).

    orjson is the fast path; it rejects the ``NaN``/``Infinity`` literals, so what it refuses is
    retried with the json module. orjson 3.8 segfaults on objects nested ~100,000 deep: a line over
    ``SAFE_LEN`` bytes whose bracket count could reach that depth goes to the json module instead,
    whose recursion limit turns it into a ValueError ("nested too deeply").
    """
    if len(line) > SAFE_LEN and line.count(b"{") + line.count(b"[") > MAX_NESTING:
        return _json_loads(line)
    try:
        return fast_loads(line)
    except ValueError:
        return _json_loads(line)


def _json_loads(line: bytes) -> Any:
    try:
        return json.loads(line)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


STDIN = Path("-")  # "-" on the command line: standard input


def discover(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The log files named by ``paths`` (sorted per directory, duplicates removed).

    ``-`` stands for standard input. A named path that is not a regular file or a directory (a
    FIFO, a device, a socket) is refused: reading it could block forever.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if str(raw) == "-":
            files.append(STDIN)
            continue
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            if not path.exists():
                raise InputError(
                    f"{path}: no such file or directory", "pass an events/ directory, a run directory or .jsonl files"
                ) from exc
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}", "check the path's permissions") from exc
        if stat.S_ISDIR(mode):
            try:
                found = sorted(p for p in path.rglob("*") if p.name.endswith(LOG_SUFFIXES) and p.is_file())
            except OSError as exc:
                raise InputError(
                    f"{path}: cannot list directory: {exc.strerror or exc}", "check the permissions of the directory"
                ) from exc
            if not found:
                raise InputError(
                    f"{path}: no *.jsonl or *.jsonl.gz event logs below it", "point at the run's events/ directory"
                )
            files.extend(found)
        elif stat.S_ISREG(mode):
            files.append(path)
        else:
            raise InputError(
                f"{path}: not a regular file (a FIFO, device or socket)",
                "pass the log file itself, or '-' to read standard input",
            )
    unique = list(dict.fromkeys(p if p is STDIN else p.resolve() for p in files))
    for p in unique:
        if p is STDIN:
            continue
        try:
            with open(p, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise InputError(f"{p}: cannot read: {exc.strerror or exc}", "check the file's permissions") from exc
    return unique


def open_log(path: Path) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(line reader, raw file) of a log (gzip recognised by its magic bytes; ``STDIN`` is standard
    input): the raw file's position is the progress on disk. The caller closes both."""
    if path is STDIN:
        raw = io.BufferedReader(io.FileIO(os.dup(sys.stdin.fileno()), "rb"), CHUNK)
        if raw.peek(2)[:2] == _GZIP_MAGIC:
            return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), 1 << 20), raw
        return raw, raw
    fh = open(path, "rb")  # noqa: SIM115 - owned and closed by the caller
    if fh.read(2) == _GZIP_MAGIC:
        fh.seek(0)
        return io.BufferedReader(gzip.GzipFile(fileobj=fh, mode="rb"), 1 << 20), fh
    fh.seek(0)
    return fh, fh


def size_of(path: Path) -> int:
    """Bytes on disk (0 for standard input or a file that vanished)."""
    if path is STDIN:
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_blocks(
    path: Path, on_issue: IssueCallback, counts: list[int], block: int = CHUNK
) -> Iterator[tuple[int, bytes, bool]]:
    """``(lines_before, block, terminated)``: one log as blocks of whole lines joined by ``\\n``
    (``block.split(b"\\n")`` are lines ``lines_before + 1`` ...).

    The file (plain, gzip or standard input) is read ``block`` bytes at a time (64 KiB: hundreds of
    files may be open at once in the per-process merge; a reader with one file open passes
    ``BLOCK``) and cut at the last newline; a plain ``read`` costs less CPU than a memory map
    (no page faults, no ``madvise`` to release pages) and holds no more than one block. A line over
    ``MAX_LINE`` bytes is reported (``too_long``) and replaced by an empty line, without being held
    whole; an I/O or decompression error is reported (``unreadable``, or ``truncated`` for a gzip
    stream cut short) and ends the file. The last block is unterminated (``terminated`` False) when
    the file does not end with a newline. ``counts`` (lines, bytes) is updated as the file is read.
    """
    name = str(path)
    try:
        fh, raw = open_log(path)
    except OSError as exc:
        on_issue(name, 0, "unreadable", f"cannot open: {exc}")
        return
    lineno, pending, skipping = 0, b"", False
    try:
        while True:
            try:
                chunk = fh.read(block)
            except (OSError, EOFError, zlib.error) as exc:
                kind = "truncated" if isinstance(exc, EOFError) else "unreadable"
                on_issue(name, lineno + 1, kind, f"cannot read past line {lineno}: {exc}")
                pending = b""
                break
            if not chunk:
                break
            counts[1] += len(chunk)
            if skipping:  # the rest of a too-long line
                start = chunk.find(b"\n")
                if start < 0:
                    continue
                chunk, skipping = chunk[start + 1 :], False
            end = chunk.rfind(b"\n")
            if end < 0:
                pending += chunk
                if len(pending) > MAX_LINE:
                    lineno += 1
                    counts[0] += 1
                    on_issue(name, lineno, "too_long", f"line longer than {MAX_LINE} bytes, skipped")
                    pending, skipping = b"", True
                continue
            lines = pending + memoryview(chunk)[:end] if pending else chunk[:end]  # one copy, not two
            pending = chunk[end + 1 :]
            n = lines.count(b"\n") + 1
            if len(lines) > MAX_LINE:
                lines = b"\n".join(_drop_long(lines.split(b"\n"), name, lineno, on_issue))
            counts[0] += n
            yield lineno, lines, True
            lineno += n
        if len(pending) > MAX_LINE:  # an unterminated last line that is too long as well
            counts[0] += 1
            on_issue(name, lineno + 1, "too_long", f"line longer than {MAX_LINE} bytes, skipped")
        elif pending:
            counts[0] += 1
            yield lineno, pending, False
    finally:
        fh.close()
        raw.close()


def release(mm: mmap.mmap, done: int, upto: int) -> int:
    """Drop the mapped pages of ``[done, upto)`` from this process (they stay in the page cache), so
    the resident size of a mapped file stays one block, not the file; returns the new ``done``."""
    upto -= upto % mmap.PAGESIZE
    if upto > done:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # madvise is an optimisation
            mm.madvise(mmap.MADV_DONTNEED, done, upto - done)
        return upto
    return done


def _drop_long(lines: list[bytes], name: str, before: int, on_issue: IssueCallback) -> list[bytes]:
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE:
            on_issue(name, before + i + 1, "too_long", f"line longer than {MAX_LINE} bytes, skipped")
            lines[i] = b""
    return lines


def read_lines(path: Path, on_issue: IssueCallback, counts: list[int]) -> Iterator[tuple[int, bytes, bool]]:
    """``(line_number, line, terminated)`` of every non-blank line of one log, in file order (see
    ``read_blocks``; only the last line can be unterminated)."""
    for before, block, terminated in read_blocks(path, on_issue, counts):
        for lineno, line in enumerate(block.split(b"\n"), before + 1):
            if line and not line.isspace():
                yield lineno, line, terminated


def merge_by_time(gens: list[Iterator[tuple[float, int, Any, int]]]) -> Iterator[tuple[Any, int, int]]:
    """Merge per-stream heap items ``(time, stream, event, location)`` by ``(time, stream)``; yield
    ``(event, stream, location)`` and, right after a stream's last item, ``(None, stream, location)``."""
    heap = [first for gen in gens if (first := next(gen, None)) is not None]
    heapq.heapify(heap)
    heapreplace, heappop = heapq.heapreplace, heapq.heappop
    while heap:
        _, i, event, loc = heap[0]
        nxt = next(gens[i], None)
        if nxt is None:
            heappop(heap)
            yield event, i, loc
            yield None, i, loc  # end of stream i
        else:
            heapreplace(heap, nxt)
            yield event, i, loc


class ReadCounts:
    """What a stream of event lines has read so far: ``counts`` is ``[lines, bytes]``
    (uncompressed), the list ``read_blocks`` / ``read_lines`` add to as they go; ``progress()`` is
    ``(done, total)`` over every pass the stream makes over its inputs (one here; ``DemuxStream``
    makes two or three)."""

    counts: list[int]

    @property
    def lines(self) -> int:
        return self.counts[0]

    @property
    def bytes_read(self) -> int:
        return self.counts[1]

    size: int  # bytes of the inputs on disk (0 for standard input)

    def position(self) -> int:
        """Bytes read so far (uncompressed), for progress bars."""
        return self.counts[1]

    def work(self) -> int:
        """The bytes ``position`` reaches when everything is read (one pass over the inputs)."""
        return self.size

    def progress(self) -> tuple[int, int]:
        """``(done, total)`` for a progress bar: ``position`` capped at ``work`` (a gzip file's
        uncompressed bytes outnumber its size on disk)."""
        total = self.work()
        return min(self.position(), total), total


class EventStream(ReadCounts):
    """Merge the events of ``files`` by time; see the module docstring for the contract."""

    def __init__(self, files: list[Path], on_issue: IssueCallback) -> None:
        self.files = files
        self.names = [str(p) for p in files]
        self.on_issue = on_issue
        self.counts = [0, 0]  # lines, bytes (uncompressed) read so far
        self.size = sum(size_of(p) for p in files)

    def file_events(self, index: int) -> Iterator[tuple[float, int, Any, int]]:
        """Heap items ``(time, index, event, line)`` of one file, in file order (``read_blocks``:
        whole lines a block at a time, over-long lines dropped, so memory stays bounded)."""
        path = self.files[index]
        name, loads, last_time = str(path), fast_loads, float("-inf")
        for before, block, terminated in read_blocks(path, self.on_issue, self.counts):
            lineno = before
            short = len(block) <= SAFE_LEN  # then no line needs its length checked (one test per block)
            for line in block.split(b"\n"):
                lineno += 1
                try:
                    if not short and len(line) > SAFE_LEN:
                        raise ValueError  # decode() checks how deep it may nest
                    event = loads(line)
                except ValueError:
                    event = self._slow(line, name, lineno, terminated)
                    if event is None:
                        continue
                try:
                    t = event.get("time")
                except AttributeError:  # only a dict has .get: the line is not an object
                    self.on_issue(name, lineno, "malformed", f"a JSON {type(event).__name__}, not an object")
                    continue
                if type(t) is float or type(t) is int:
                    last_time = t
                yield (last_time, index, event, lineno)

    def _slow(self, line: bytes, name: str, lineno: int, terminated: bool) -> Any:
        """Decode a line the fast decoder refused: blank (None, silently), NaN/Infinity literals
        (json), or a malformed / truncated line (reported, None)."""
        if not line.strip():
            return None
        try:
            return decode(line)
        except ValueError as exc:
            if terminated:
                self.on_issue(name, lineno, "malformed", f"not valid JSON: {_short(exc)}")
            else:
                self.on_issue(name, lineno, "truncated", "last line is incomplete (writer died mid-line?)")
            return None

    def events(self) -> Iterator[tuple[Any, int, int]]:
        """Yield ``(event, file_index, line_number)`` in time order across files; after a file's
        last event, ``(None, file_index, last_line)`` marks its end."""
        return merge_by_time([self.file_events(i) for i in range(len(self.files))])

    def locate(self, stream: int, line: int) -> tuple[str, int]:
        """(file, line) of an item this stream yielded."""
        return self.names[stream], line

    def close(self) -> None:
        """Nothing to release (files are closed as they end)."""


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


def iter_events(
    paths: Iterable[str | os.PathLike[str]], on_issue: IssueCallback | None = None
) -> Iterator[dict[str, Any]]:
    """Convenience: the decoded events of ``paths`` in time order (issues ignored unless asked)."""
    stream = EventStream(discover(paths), on_issue or (lambda *a: None))
    for event, _, _ in stream.events():
        if event is not None:
            yield event
