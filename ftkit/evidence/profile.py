"""``EvidenceProfile``: what a producer promises to log, and at which cadence.

The profile is logged once, as the ``evidence_profile`` event right after ``run_started``
(``ftkit.events.schema``). ``analyze-events`` then expects exactly that: anything promised and
missing is an FT112 finding, and every rule whose evidence was not promised is reported as *not
covered* (never as passed), so a log cannot pass by promising less (``ftkit.analysis.profile``).

A cadence ``N`` means: due at every committed step ``s`` with ``(s + 1) % N == 0`` (``1``: every
step; ``10``: steps 9, 19, ...). ``None`` (or ``False``) means not promised.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvidenceProfile:
    """The evidence kinds a producer promises.

    ``fingerprint_every``: ``state_fingerprint`` of every rank (I1, FT101 / FT107);
    ``witness``: ``witness_counts`` at every committed step and ``witness_allocated`` for every
    trained rollout (I2, FT103-FT105; a sample counted at some steps only would read as lost, so
    it has no cadence); ``metric_every``: the run's ``metric`` (FT109); ``dump_every``:
    ``dump_written`` of a per-step tensor dump; ``checkpoint_every``: a guarded publication
    (``checkpoint_published`` or ``checkpoint_rejected``, FT110); ``weights``: every weight sync
    to an inference engine is verified by the engines (FT102). The defaults are what
    ``EvidenceRun`` logs for a plain training loop that calls ``step`` every step.
    """

    fingerprint_every: int | None = 1
    witness: bool = True
    metric_every: int | None = 1
    dump_every: int | None = None
    checkpoint_every: int | None = None
    weights: bool = False

    def __post_init__(self) -> None:
        for name in ("fingerprint_every", "metric_every", "dump_every", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be a positive int or None, not {value!r}")

    def kinds(self) -> dict[str, int]:
        """The ``kinds`` of the ``evidence_profile`` event: ``{kind: cadence}`` of what is promised."""
        out: dict[str, int] = {}
        for kind, every in (
            ("state_fingerprint", self.fingerprint_every),
            ("witness_counts", 1 if self.witness else None),
            ("metric", self.metric_every),
            ("dump_written", self.dump_every),
            ("checkpoint", self.checkpoint_every),
            ("weights", 1 if self.weights else None),
        ):
            if every is not None:
                out[kind] = every
        return out

    def due(self, kind: str, step: int) -> bool:
        """Whether ``kind`` is promised at committed step ``step``."""
        every = self.kinds().get(kind)
        return every is not None and (step + 1) % every == 0
