"""``write_merged_log``: one time-ordered log file from a run's per-process files (for CI artefacts).

The per-process files under ``events/`` stay the record; the merged file is a copy of their lines,
byte for byte, in the order ``ftkit analyze`` replays them: by ``(time, source file name)``, each
source in its own order. ``ftkit analyze merged.jsonl`` then reads it in one sequential pass
(``ftkit.events.demux``, "sequential") and gives the same verdict as the ``events/`` directory.

A writer that died mid-line leaves an unterminated fragment at the end of its file; the
analyzer reports it as a truncated last line (a warning) there, but inside a merged file it would
read as a malformed line (an error), so such fragments are left out of the merged file and
counted in ``MergedLog.fragments``. Every other line is copied, valid or not.
"""

from __future__ import annotations

import gzip
import heapq
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ftkit.events.keys import SourceTable, line_key
from ftkit.events.reader import IssueCallback, decode, discover, read_lines
from ftkit.fsutil import output_file


@dataclass(frozen=True)
class MergedLog:
    """What ``write_merged_log`` wrote."""

    path: Path
    lines: int
    files: int
    fragments: int  # unterminated, undecodable last lines left out


def write_merged_log(
    events_dir: str | os.PathLike[str], path: str | os.PathLike[str], on_issue: IssueCallback | None = None
) -> MergedLog:
    """Merge the logs under ``events_dir`` (a directory or files, as ``discover`` takes them) into
    ``path`` (gzipped when it ends in ``.gz``), atomically (``ftkit.fsutil.output_file``: a
    temporary file renamed over it; a special file such as ``/dev/stdout`` is written in place).

    Raises ``InputError`` for a missing input (as the analyzer does) and ``OSError`` when ``path``
    cannot be written; ``on_issue`` hears about unreadable files and over-long lines (left out).
    """
    files = discover([events_dir])
    out = Path(path)
    table = SourceTable()
    issue = on_issue or (lambda *a: None)
    fragments = [0]
    written = 0
    with output_file(out) as raw:
        fh: BinaryIO | gzip.GzipFile = gzip.GzipFile(fileobj=raw, mode="wb") if out.name.endswith(".gz") else raw
        streams = [_keyed_lines(p, i, table, issue, fragments) for i, p in enumerate(files)]
        for *_, line in heapq.merge(*streams):
            fh.write(line)
            fh.write(b"\n")
            written += 1
        if fh is not raw:
            fh.close()
    return MergedLog(path=out, lines=written, files=len(files), fragments=fragments[0])


def _keyed_lines(
    path: Path, index: int, table: SourceTable, on_issue: IssueCallback, fragments: list[int]
) -> Iterator[tuple[float, tuple[str, bytes], int, int, bytes]]:
    """``(time, source sort key, file index, line number, line)`` of one file, in file order (time:
    the line's, or the last one before it, as the analyzer merges)."""
    last_t, last_key = -math.inf, ("", b"")
    for lineno, line, terminated in read_lines(path, on_issue, [0, 0]):
        if not terminated:
            try:
                decode(line)
            except ValueError:
                fragments[0] += 1
                continue
        key = line_key(line, table)
        if key is not None:
            last_key = table.sort_keys[key[0]]
            if key[2] is not None and key[2] - key[2] == 0:
                last_t = key[2]
        yield last_t, last_key, index, lineno, line
