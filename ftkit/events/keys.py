"""Which source wrote a line, and where the line belongs in that source's stream, without a full decode.

Every line carries its source (role, cell, rank, incarnation, pid, host) and a gap-free ``seq``
per source, so the per-process streams can be recovered from any interleaving of a run's lines.
``line_key(line, table)`` returns ``(sid, seq, time)``:

- fast path: one anchored regular expression over the envelope as ``EventWriter`` writes it
  (``{"schema":N,"type":"..","run":"..","time":T,"source":{..},"seq":N``); being anchored at the
  line's start and walking top-level keys only, it cannot match a nested object or a string;
- otherwise the line is decoded (``ftkit.events.reader.decode``, crash-safe) and its top-level
  ``source`` / ``seq`` / ``time`` are read;
- ``None`` when the line has no usable key (not JSON, not an object, no ``source`` object or no
  integer ``seq``): such a line can never pass validation, so it only ever yields a finding.

``SourceTable`` numbers streams (``sid``) in order of first sight. Two lines belong to the same
stream when they name the same ``run`` and their source objects are equal as JSON (keys sorted),
however they were spelled (lines of two runs never share a stream).
``order()`` gives each source its stream index: sorted by the file name ``EventWriter`` gives that
source, so streams are ordered (and time ties broken) exactly as the per-process files are.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ftkit.events.reader import decode

try:
    import orjson

    def _canonical(src: dict[str, Any]) -> bytes:
        try:
            return orjson.dumps(src, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # integers beyond 64 bits
            return repr(sorted(src.items())).encode()

except ImportError:  # pragma: no cover - orjson is a declared dependency
    import json

    def _canonical(src: dict[str, Any]) -> bytes:
        return json.dumps(src, sort_keys=True, separators=(",", ":")).encode()


_NUM = rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_ENVELOPE_SRC = (
    rb'\{"schema":-?\d+,"type":"[^"\\\n]*","run":"([^"\\\n]*)","time":('
    + _NUM
    + rb'),"source":(\{[^{}\n]*\}),"seq":(\d{1,18})[,}]'
)
ENVELOPE = re.compile(_ENVELOPE_SRC)  # match(line): (run, time, source, seq) of a line as EventWriter writes it
_SEQ_MAX = (1 << 63) - 1
Key = tuple[int, int, float | None]  # (sid, seq, time)


class SourceTable:
    """Sources seen so far: ``sid`` by spelling and by content, label and sort key per ``sid``."""

    def __init__(self) -> None:
        self.raw_sids: dict[tuple[bytes, bytes], int] = {}  # spelling of (run, source) -> sid (a cache)
        self._by_canonical: dict[bytes, int] = {}
        self.sort_keys: list[tuple[str, bytes]] = []
        self.labels: list[str] = []

    def __len__(self) -> int:
        return len(self.sort_keys)

    def sid_of_raw(self, spelled: tuple[bytes, bytes]) -> int | None:
        """The sid of ``(run, source)`` as spelled in a line (the run string's bytes without quotes or
        escapes, the source object's bytes); None when the source is not a JSON object."""
        sid = self.raw_sids.get(spelled)
        if sid is not None:
            return sid
        try:
            src, run = decode(spelled[1]), spelled[0].decode()
        except (ValueError, UnicodeDecodeError):
            return None
        if type(src) is not dict:
            return None
        sid = self.sid_of(src, run)
        if len(self.raw_sids) < 1 << 16:  # spellings are few; a hostile log cannot grow this without bound
            self.raw_sids[spelled] = sid
        return sid

    def sid_of(self, src: dict[str, Any], run: Any) -> int:
        """The sid of a decoded source object of a run (a new one on first sight)."""
        canonical = _canonical(src) + b"\0" + repr(run).encode()
        sid = self._by_canonical.get(canonical)
        if sid is None:
            sid = self._by_canonical[canonical] = len(self.sort_keys)
            label = source_label(src)
            self.sort_keys.append((label + ".jsonl", canonical))
            self.labels.append(label)
        return sid

    def order(self) -> list[int]:
        """Stream index of every sid: sids sorted by the writer's file name of their source."""
        ranked = sorted(range(len(self.sort_keys)), key=self.sort_keys.__getitem__)
        index = [0] * len(ranked)
        for position, sid in enumerate(ranked):
            index[sid] = position
        return index


def source_label(src: dict[str, Any]) -> str:
    """The writer's file stem of a source: ``trainer-c0-r1-i0``, ``driver-i0``."""
    label = str(src.get("role"))
    if src.get("cell") is not None:
        label += f"-c{src['cell']}"
    if src.get("rank") is not None:
        label += f"-r{src['rank']}"
    return f"{label}-i{src.get('incarnation')}"


def line_key(line: bytes, table: SourceTable) -> Key | None:
    """``(sid, seq, time)`` of one line, or None when it has no usable key (see the module docstring).

    ``seq`` is clamped to 64 bits (the decoded event keeps its real value); ``time`` is a float
    (possibly NaN or infinite), None when the line has no numeric time.
    """
    m = ENVELOPE.match(line)
    if m is not None:
        sid = table.sid_of_raw((m[1], m[3]))
        if sid is not None:
            return sid, int(m[4]), float(m[2])
    try:
        event = decode(line)
    except ValueError:
        return None
    if type(event) is not dict:
        return None
    src, seq, time = event.get("source"), event.get("seq"), event.get("time")
    if type(src) is not dict or type(seq) is not int:
        return None
    if type(time) is int:
        time = float(time) if abs(time) < 1 << 1000 else math.inf
    return (
        table.sid_of(src, event.get("run")),
        max(-_SEQ_MAX, min(seq, _SEQ_MAX)),
        (time if type(time) is float else None),
    )
