"""A quick scan of the drivers' event logs for bookkeeping (resume, checkpoint selection).

Not the analyzer: ``driver_events`` reads ``driver-i*.jsonl`` in a run's ``events/`` in file then
line order and yields the events of one type, skipping what a killed or foreign writer may leave
(a torn last line, a malformed line, a line that is not an object). Judging the log is
``ftkit analyze-events``' work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def driver_events(events_dir: str | Path, type_: str) -> Iterator[dict[str, Any]]:
    """The events of type ``type_`` in the drivers' logs under ``events_dir`` (see the module docstring)."""
    marker = f'"{type_}"'.encode()
    for path in sorted(Path(events_dir).glob("driver-i*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                if marker not in line:
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:  # the torn last line of a killed driver
                    continue
                if isinstance(ev, dict) and ev.get("type") == type_:
                    yield ev
