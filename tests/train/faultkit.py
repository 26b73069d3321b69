"""Test helpers for fault tests: find a rank's pid in a live run's event files and act on it.

``Trigger(run_dir, cell, step, action)`` is a thread that watches ``run_dir/events/`` until
cell ``cell`` rank 0 (incarnation 0) has logged its ``state_fingerprint`` of ``step``, then calls
``action(pid)`` with that rank actor's process id (its events' ``source.pid``): a real signal
to a real process, whatever the driver is doing at that moment.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ftkit.fsutil import pid_alive


def rank_events(run_dir: Path, cell: int, rank: int = 0, incarnation: int = 0) -> list[dict]:
    """The events logged so far by one rank incarnation (a torn last line is skipped)."""
    path = Path(run_dir) / "events" / f"trainer-c{cell}-r{rank}-i{incarnation}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def all_events(run_dir: Path, type_: str) -> list[dict]:
    out = []
    for f in sorted((Path(run_dir) / "events").glob("*.jsonl")):
        out += [e for e in map(json.loads, f.read_text().splitlines()) if e["type"] == type_]
    return out


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (``ftkit.fsutil.pid_alive``, and not a zombie)."""
    if not pid_alive(pid):
        return False
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def still_alive(pids: set[int] | list[int], limit_s: float) -> set[int]:
    """The ``pids`` still alive after waiting up to ``limit_s`` for all of them to end."""
    deadline = time.monotonic() + limit_s
    while True:
        alive = {p for p in pids if process_alive(p)}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


class Trigger(threading.Thread):
    """See the module docstring; ``fired`` holds the pid once the action ran."""

    def __init__(
        self, run_dir: Path, cell: int, step: int, action: Callable[[int], None], limit_s: float = 900
    ) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.cell, self.step, self.action, self.limit_s = Path(run_dir), cell, step, action, limit_s
        self.fired: int | None = None

    def run(self) -> None:
        end = time.monotonic() + self.limit_s
        while time.monotonic() < end:
            evs = rank_events(self.run_dir, self.cell)
            if any(e["type"] == "state_fingerprint" and e["step"] >= self.step for e in evs):
                self.fired = evs[0]["source"]["pid"]
                self.action(self.fired)
                return
            time.sleep(0.05)
