"""The evidence of two runs, matched item by item as the two logs stream in.

Each comparable piece of evidence is an *item* with a key and a position::

    ("state", step)            per-rank state fingerprints of a committed step
    ("witness", step)          the witness ids and counts of a committed step
    ("metric", step)           the driver's metrics of a step
    ("rmetric", rollout)       the driver's per-rollout metrics (reward, ...)
    ("weights", version)       the weights sent to the engines
    ("canary", who, version)   the canary log-probs of a version (who: "engine" or "trainer")

A position is ``(rollout, step, order)``: rollout-level items sit at step ``-1`` (before the
rollout's first step), and ``order`` is the order in which a step's evidence is made (the
weights and their canary scores, the samples, the metrics, the state). The value of an item is
small (a fingerprint total, a digest, a dict of metrics, the canary log-probs); the per-tensor
*detail* that names the first differing tensor or sample is kept only until the other run's
item arrives, and then only for the first ``KEEP`` differing items of each kind, so memory
follows how far the two logs are apart, not their length.

A later session of a run (``run_resumed``) supersedes what an earlier one logged after its
checkpoint: ``retract`` drops those items of that run; they arrive again as the steps are
trained again. The comparison of the values is ``ftkit.runs.diff``.
"""

from __future__ import annotations

import marshal
from typing import Any

Key = tuple[Any, ...]
Pos = tuple[int, int, int]
MISSING: Any = None  # no value from this run (values themselves are never None)

ORDER = {"weights": 0, "canary": 1, "rmetric": 2, "witness": 0, "metric": 1, "state": 2}
KEEP = 8  # differing items per kind whose per-tensor detail is kept (the first ones by position)


class Matcher:
    """Items of run 0 (A) and run 1 (B); see the module docstring."""

    def __init__(self) -> None:
        self.entries: dict[Key, list[Any]] = {}  # key -> [pos, value of A, value of B]
        self.details: dict[tuple[Key, int], Any] = {}
        self.kept: dict[str, list[Key]] = {}
        self.steps: tuple[dict[int, int], dict[int, int]] = ({}, {})  # committed step -> rollout
        self.done = [False, False]

    def step(self, side: int, step: int, rollout: int) -> None:
        """Run ``side`` committed ``step`` of ``rollout``."""
        self.steps[side][step] = rollout

    def put(self, side: int, key: Key, pos: Pos, value: Any, detail: Any = None) -> None:
        """Run ``side``'s value of an item (a later one replaces it: a resumed run's steps)."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = [pos, MISSING, MISSING]
        entry[0] = pos
        entry[1 + side] = value
        if detail is None:
            return
        other = entry[2 - side]
        if other is MISSING:
            if not self.done[1 - side]:
                self.details[(key, side)] = detail
            return
        if other == value:
            self._drop(key)
            return
        if self._keep(key, pos):
            self.details[(key, side)] = detail
        else:
            self._drop(key)

    def _keep(self, key: Key, pos: Pos) -> bool:
        """Whether a differing item is among the first ``KEEP`` of its kind (evicting a later one)."""
        kept = self.kept.setdefault(key[0], [])
        if key in kept:
            return True
        if len(kept) < KEEP:
            kept.append(key)
            return True
        last = max(kept, key=lambda k: self.entries[k][0] if k in self.entries else (1 << 62,))
        if last in self.entries and self.entries[last][0] <= pos:
            return False
        kept.remove(last)
        self._drop(last)
        kept.append(key)
        return True

    def _drop(self, key: Key) -> None:
        self.details.pop((key, 0), None)
        self.details.pop((key, 1), None)

    def detail(self, key: Key, side: int) -> Any:
        """The per-tensor detail of an item, when it was kept (else None); a detail a worker sent
        as ``marshal`` bytes (``ftkit.runs.worker``) is decoded here, only for the items compared."""
        got = self.details.get((key, side))
        return marshal.loads(got) if type(got) is bytes else got

    def finished(self, side: int) -> None:
        """Run ``side``'s log ended: the other run's details of items it lacks are not needed."""
        self.done[side] = True
        other = 1 - side
        for key, s in [k for k in self.details if k[1] == other]:
            entry = self.entries.get(key)
            if entry is None or entry[1 + side] is MISSING:
                self.details.pop((key, s), None)

    def retract(self, side: int, step: int, rollout: int) -> None:
        """Run ``side`` resumed after ``step`` / ``rollout``: drop what it logged later."""
        for key in list(self.entries):
            entry = self.entries[key]
            r, s, _ = entry[0]
            if (s > step) if s >= 0 else (r > rollout):
                entry[1 + side] = MISSING
                self.details.pop((key, side), None)
                if entry[1] is MISSING and entry[2] is MISSING:
                    del self.entries[key]
        steps = self.steps[side]
        for s in [s for s in steps if s > step]:
            del steps[s]

    def reset(self, side: int) -> None:
        """Forget everything of run ``side`` (its log is read again from the start)."""
        self.retract(side, -1, -1)
        self.done[side] = False
