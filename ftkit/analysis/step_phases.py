"""``StepPhases``: where the steps of a run spent their time, from the driver's per-step ``metric``
events' ``phases`` (``ftkit.train.control.step_clock``; docs/train.md "Where a step's time goes").

``add(ev)`` takes every driver ``metric`` of a step (those without ``phases``, an older ftkit's or
another trainer's, are not counted); ``summary()`` is ``None`` when no step had phases, else the
``step_phases`` entry of ``analyze-events``' stats (docs/analyze-events.md)::

    {"steps": N, "wall": {"median": s, "max": s, "total": s},
     "phases": {phase: {"median": s, "max": s, "total": s, "share": total / wall total}, ...},
     "unattributed": {"median": s, "max": s, "total": s}}

``phases`` is ordered by total, largest first; a step without a phase counts 0 for it (so a
rollout's ``generation``, on its first step only, has a median of 0 with several steps per
rollout); ``unattributed`` is each step's wall minus the sum of its phases. Memory: 8 bytes per
step and phase (``array('d')``).
"""

from __future__ import annotations

from array import array
from typing import Any


class StepPhases:
    """The per-step phases of a run (see the module docstring)."""

    def __init__(self) -> None:
        self.wall = array("d")
        self.rest = array("d")
        self.phases: dict[str, array[float]] = {}

    def add(self, ev: dict[str, Any]) -> None:
        """Count the driver's step ``metric`` ``ev`` if it carries ``phases`` and ``wall_seconds``."""
        phases, wall = ev.get("phases"), ev.get("wall_seconds")
        if not isinstance(phases, dict) or not isinstance(wall, (int, float)):
            return
        steps = len(self.wall)
        self.wall.append(float(wall))
        spent = 0.0
        for name, seconds in phases.items():
            if not isinstance(seconds, (int, float)):
                continue
            column = self.phases.setdefault(str(name), array("d", bytes(8 * steps)))
            column.append(float(seconds))
            spent += float(seconds)
        for column in self.phases.values():
            if len(column) == steps:  # a phase this step did not have
                column.append(0.0)
        self.rest.append(float(wall) - spent)

    def summary(self) -> dict[str, Any] | None:
        """The ``step_phases`` stats (module docstring), ``None`` without any step's phases."""
        if not self.wall:
            return None
        wall = _stats(self.wall)
        total = wall["total"] or 1.0
        rows = sorted(((name, _stats(col)) for name, col in self.phases.items()), key=lambda r: -r[1]["total"])
        return {
            "steps": len(self.wall),
            "wall": wall,
            "phases": {name: {**row, "share": round(row["total"] / total, 4)} for name, row in rows},
            "unattributed": _stats(self.rest),
        }


def _stats(values: array[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return {"median": round(median, 6), "max": round(ordered[-1], 6), "total": round(sum(ordered), 6)}
