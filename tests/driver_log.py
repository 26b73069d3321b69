"""Reading a run's driver log while ``ftkit train`` still writes it (tests that kill at a step)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path


def driver_steps(run: Path) -> list[int]:
    """Steps the first driver has logged a step metric for (a torn last line is skipped)."""
    path = run / "events" / "driver-i0.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if ev["type"] == "metric" and ev["step"] is not None:
                steps.append(ev["step"])
    return steps
