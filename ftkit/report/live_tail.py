"""``EventTail``: the new lines of a run's ``events/`` directory, for the live training view.

Faults are logged by the rank that injects them and heals by the processes that perform them,
so the driver's callbacks never see them; the live view reads them where every process writes
them. ``EventTail(events_dir)`` remembers what the files held when it was made (a resumed run's
earlier sessions are not news); each ``poll()`` returns the events of the wanted types appended
since, reading only complete lines (a line being written is read on the next poll). A file
replaced by another of the same name (``--overwrite``) is read from its start. Never raises:
unreadable files and undecodable lines are skipped (the analyzer reports them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ftkit.events.reader import decode

WANTED = frozenset({"fault_injected", "engine_failed", "heal"})
MAX_READ = 1 << 20  # per file and poll: a burst is read over several polls


class EventTail:
    """See the module docstring."""

    def __init__(self, events_dir: Path, wanted: frozenset[str] = WANTED) -> None:
        self.dir = Path(events_dir)
        self.wanted = wanted
        self.seen: dict[str, tuple[int, int]] = {}  # file name -> (inode, bytes consumed)
        for path in self._files():
            st = _stat(path)
            if st is not None:
                self.seen[path.name] = st

    def _files(self) -> list[Path]:
        try:
            return sorted(p for p in self.dir.glob("*.jsonl") if p.is_file())
        except OSError:
            return []

    def poll(self) -> list[dict[str, Any]]:
        """The wanted events appended since the last poll, file by file."""
        found: list[dict[str, Any]] = []
        for path in self._files():
            st = _stat(path)
            if st is None:
                continue
            inode, size = st
            known_inode, done = self.seen.get(path.name, (inode, 0))
            if known_inode != inode or size < done:
                done = 0
            if size == done:
                continue
            try:
                with open(path, "rb") as fh:
                    fh.seek(done)
                    chunk = fh.read(min(size - done, MAX_READ))
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1
            self.seen[path.name] = (inode, done + end)
            for line in chunk[:end].splitlines():
                if b'"type"' not in line:
                    continue
                try:
                    event = decode(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("type") in self.wanted:
                    found.append(event)
        return found


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size
