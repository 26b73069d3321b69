"""The non-finite guard: what a rank saw since the last publication boundary.

Every rank owns one ``NonFiniteGuard``. It records every non-finite gradient (the rank's own
rows before the reduction and the reduced gradient) and every non-finite loss, whether or not
clipping is on and whether or not the step was then discarded. At each publication boundary
the caller calls ``consume(to_step)`` exactly once, on every rank: it returns the interval's
``GuardVerdict`` and starts the next interval at ``to_step + 1``. Nothing else resets the
guard, so an observation can never be lost between two boundaries, and a boundary cannot be
consumed twice (``GuardError``).

Verdicts are plain frozen dataclasses (they travel between Ray actors); ``merge`` combines
the verdicts of every rank of every live cell into the one the publication records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_REASONS = 8  # observations kept verbatim per interval (the count is always exact)


class GuardError(RuntimeError):
    """The guard was used against its contract (a boundary consumed twice or out of order)."""


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's finding over the steps ``[from_step, to_step]`` (inclusive).

    ``tainted`` is true when anything non-finite was observed in the interval; ``count`` is
    how many observations, ``reasons`` the first ``MAX_REASONS`` of them (``"step 7: reduced
    gradient decoder.final_layernorm.weight"``).
    """

    from_step: int
    to_step: int
    tainted: bool
    count: int = 0
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        """The manifest's ``guard`` record."""
        return {
            "from_step": self.from_step,
            "to_step": self.to_step,
            "tainted": self.tainted,
            "count": self.count,
            "reasons": list(self.reasons),
        }


class NonFiniteGuard:
    """Records non-finite observations of one rank between publication boundaries.

    ``first_step`` is the first step of the first interval (0 for a new run; the step after
    the loaded checkpoint for a resumed one).
    """

    def __init__(self, first_step: int = 0) -> None:
        self._from = first_step
        self._count = 0
        self._reasons: list[str] = []

    @property
    def from_step(self) -> int:
        """First step of the interval that is open now."""
        return self._from

    @property
    def tainted(self) -> bool:
        """Whether the open interval has seen anything non-finite (does not consume)."""
        return self._count > 0

    def observe(self, step: int, what: str, finite: bool) -> None:
        """Record one check; ``what`` names it (``"loss"``, ``"local gradient <name>"``, ...).

        Finite observations are accepted and ignored, so callers can pass every check.
        """
        if finite:
            return
        self._count += 1
        if len(self._reasons) < MAX_REASONS:
            self._reasons.append(f"step {step}: {what}")

    def observe_value(self, step: int, what: str, value: float) -> None:
        """``observe`` for a scalar (a loss, a gradient norm)."""
        self.observe(step, what, math.isfinite(value))

    def consume(self, to_step: int) -> GuardVerdict:
        """The verdict for ``[from_step, to_step]``; the next interval starts at ``to_step + 1``.

        Must be called exactly once per publication boundary, whether the publication then
        succeeds or is rejected. ``to_step`` below ``from_step - 1`` means the boundary was
        consumed already (or the steps went backwards): ``GuardError``.
        """
        if to_step < self._from - 1:
            raise GuardError(
                f"guard interval starts at step {self._from}; boundary at step {to_step} was consumed already"
            )
        verdict = GuardVerdict(self._from, to_step, self._count > 0, self._count, tuple(self._reasons))
        self._from = to_step + 1
        self._count = 0
        self._reasons = []
        return verdict


def merge(verdicts: Iterable[GuardVerdict]) -> GuardVerdict:
    """One verdict for the whole publication from every rank's verdict.

    The interval is the widest one (a rank that joined later, after a heal, has a shorter
    one); tainted if any rank was; counts add up; reasons are kept up to ``MAX_REASONS``.
    Raises ``ValueError`` for no verdicts or verdicts of different boundaries.
    """
    items = list(verdicts)
    if not items:
        raise ValueError("no guard verdicts to merge")
    ends = {v.to_step for v in items}
    if len(ends) != 1:
        raise ValueError(f"guard verdicts of different boundaries: to_step {sorted(ends)}")
    reasons: list[str] = []
    for v in items:
        reasons.extend(r for r in v.reasons if r not in reasons)
    return GuardVerdict(
        from_step=min(v.from_step for v in items),
        to_step=items[0].to_step,
        tainted=any(v.tainted for v in items),
        count=sum(v.count for v in items),
        reasons=tuple(reasons[:MAX_REASONS]),
    )
