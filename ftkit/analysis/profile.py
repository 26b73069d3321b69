"""The evidence profile of a log: what its producer promised, what the analyzer expects, what is covered.

A producer other than ``ftkit train`` (``ftkit.evidence``: a torchrun loop, the Hugging Face
``Trainer`` callback) logs one ``evidence_profile`` event right after ``run_started``: the
evidence kinds it promises (``ftkit.events.schema.EVIDENCE_KINDS``), each with a cadence ``N``
(due at every committed step ``s`` with ``(s + 1) % N == 0``). Then:

- FT112 (``ftkit.analysis.rules.steps``) expects exactly what was promised and fails closed on
  anything promised and missing: fingerprints from every live rank and witness counts from every
  cell at the due steps (as for ``ftkit train``), and through ``Promises`` a driver ``metric``, a
  ``dump_written`` and a checkpoint publication (``checkpoint_published`` or
  ``checkpoint_rejected``) at each due step of those kinds;
- every rule whose evidence was not promised is *not covered* (``uncovered``): each report
  format says so, never "passed". A producer cannot make a log pass by promising less.

A log without a profile (``ftkit train``'s) is held to everything, exactly as before: every
kind at every step (``expects(None, kind, step)`` is always true) and every rule covered.
"""

from __future__ import annotations

from typing import Any

from ftkit.events.schema import EVIDENCE_KINDS

#: Evidence kind -> the rules that cannot judge a log without it.
COVERS: dict[str, tuple[str, ...]] = {
    "state_fingerprint": ("FT101", "FT107"),
    "witness_counts": ("FT103", "FT104", "FT105"),
    "metric": ("FT109",),
    "checkpoint": ("FT110",),
    "weights": ("FT102", "FT114"),  # FT114: ftkit train's canaries / log-prob checks; no API kind yet
}
#: Kinds FT112 checks through ``Promises`` (the others have their own records in the replay).
TRACKED = ("metric", "dump_written", "checkpoint")
TRACKED_EVENTS = ("metric", "dump_written", "checkpoint_published", "checkpoint_rejected")
MAX_OWED = 100  # due steps listed per kind in a finding


def cadence(profile: dict[str, Any] | None, kind: str) -> int | None:
    """The promised cadence of ``kind`` (1 with no profile: everything, every step); None: not promised.
    A cadence below 1 is read as 1 (fail closed: it cannot promise less than every step)."""
    if profile is None:
        return 1
    n = profile["kinds"].get(kind)
    return None if n is None else max(1, int(n))


def expects(profile: dict[str, Any] | None, kind: str, step: int) -> bool:
    """Whether evidence of ``kind`` is due at committed step ``step``."""
    n = cadence(profile, kind)
    return n is not None and (step + 1) % n == 0


def uncovered(profile: dict[str, Any] | None) -> dict[str, str]:
    """``{rule code: why it is not covered}`` for the rules whose evidence the profile did not promise."""
    if profile is None:
        return {}
    out: dict[str, str] = {}
    for kind, codes in COVERS.items():
        if kind not in profile["kinds"]:
            for code in codes:
                out[code] = f"not covered: {profile['producer']} did not promise {kind} evidence"
    return out


def unknown_kinds(profile: dict[str, Any]) -> list[str]:
    """Kinds in the profile that this analyzer does not know (a newer producer?)."""
    return sorted(k for k in profile["kinds"] if k not in EVIDENCE_KINDS)


class Promises:
    """The due steps of the tracked kinds (metric, dump, checkpoint) still owed, and the steps whose
    evidence was seen before the step closed. Memory: the due steps not yet matched."""

    def __init__(self) -> None:
        self.seen: dict[str, set[int]] = {k: set() for k in TRACKED}
        self.owed: dict[str, set[int]] = {k: set() for k in TRACKED}

    def saw(self, ev: dict[str, Any]) -> None:
        """A tracked event: it settles its step for its kind."""
        t, step = ev["type"], ev.get("step")
        if type(step) is not int:
            return
        if t == "metric" and ev["source"].get("role") != "driver":
            return  # the run's per-step metrics are the driver's (as the closure reads them)
        kind = "checkpoint" if t.startswith("checkpoint_") else t
        if step in self.owed[kind]:
            self.owed[kind].discard(step)
        else:
            self.seen[kind].add(step)

    def due(self, profile: dict[str, Any] | None, step: int) -> None:
        """Committed step ``step`` closed: owe each tracked kind promised at it (none without a profile)."""
        if profile is None:
            return
        for kind in TRACKED:
            if expects(profile, kind, step):
                if step in self.seen[kind]:
                    self.seen[kind].discard(step)
                else:
                    self.owed[kind].add(step)

    def missing(self) -> dict[str, list[int]]:
        """At the end of the log: ``{kind: due steps without their evidence}``."""
        return {k: sorted(s) for k, s in self.owed.items() if s}
