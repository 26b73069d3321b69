"""Evidence records of the replay: one ``StepRecord`` per open step attempt, one ``RolloutRecord``
per open rollout. Rules read them in ``on_step`` / ``on_rollout``; they are dropped once closed.

``RuleHooks`` is what the replay calls on a rule (``ftkit.analysis.registry.Rule`` implements
it); the replay depends on this protocol, not on the registry, so the import graph is
``registry -> replay -> records`` without a cycle.
"""

from __future__ import annotations

from typing import Any, Protocol

from ftkit.findings import Severity

Where = tuple[str, int]  # (file, line)


class RuleHooks(Protocol):
    """The replay's view of a rule (see ``ftkit.analysis.registry.Rule`` for the contract)."""

    @property
    def code(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def fix(self) -> str: ...
    @property
    def events(self) -> tuple[str, ...]: ...
    @property
    def severity(self) -> Severity: ...
    @property
    def description(self) -> str: ...
    @property
    def checked(self) -> int: ...
    @property
    def found(self) -> int: ...

    def report(self, message: str, severity: Severity | None = None, **evidence: Any) -> None: ...
    def hint(self) -> str: ...
    def on_event(self, event: dict[str, Any], fi: int, line: int) -> None: ...
    def on_step(self, record: StepRecord) -> None: ...
    def on_rollout(self, record: RolloutRecord) -> None: ...
    def finish(self) -> None: ...


class StepRecord:
    """Evidence of one step attempt, keyed (rollout, step, attempt)."""

    __slots__ = (
        "rollout",
        "step",
        "attempt",
        "t0",
        "epoch",
        "outcomes",
        "fingerprints",
        "fp_detail",
        "fp_blobs",
        "fp_weights",
        "witness",
        "witness_conflicts",
        "witness_cells",
        "alive_snapshot",
        "live",
        "lost",
        "committed_cells",
    )

    def __init__(self, rollout: int, step: int, attempt: int, t0: float, alive_snapshot: frozenset[int] | None) -> None:
        self.rollout, self.step, self.attempt, self.t0 = rollout, step, attempt, t0
        self.epoch: int | None = None
        self.outcomes: dict[int, dict[int | None, tuple[str, Where]]] = {}
        self.fingerprints: dict[int | None, dict[int, str]] = {}
        self.fp_detail: dict[tuple[int | None, str], tuple[dict[str, str], dict[str, str], int, Where]] = {}
        self.fp_blobs: dict[tuple[int | None, str], bytes] = {}  # a compact group's parts, as a worker encoded them
        self.fp_weights: dict[tuple[int | None, str], dict[str, str]] = {}  # bf16: the weights cast from params
        # the first report of the step's witness counts: ids, counts, its cell, where, contributions
        self.witness: tuple[list[int], list[int], int, Where, list[float]] | None = None
        # later reports that differ from it: cell, where, what differs ("counts" or "contributions")
        self.witness_conflicts: list[tuple[int, Where, str]] = []
        self.witness_cells: set[int] = set()  # cells that reported witness counts
        self.alive_snapshot = alive_snapshot
        self.live: frozenset[int] = frozenset()
        self.lost: frozenset[int] = frozenset()
        self.committed_cells: frozenset[int] = frozenset()

    @property
    def committed(self) -> bool:
        return bool(self.committed_cells)

    def evidence(self) -> dict[str, Any]:
        return {"rollout": self.rollout, "step": self.step, "attempt": self.attempt, "epoch": self.epoch}


class RolloutRecord:
    """Witness evidence of one rollout: the allocation and the counts of committed steps."""

    __slots__ = (
        "rollout",
        "ids",
        "expected",
        "alloc_attempt",
        "where",
        "tally",
        "committed_steps",
        "counted_steps",
        "_expected_counts",
    )

    def __init__(self, rollout: int) -> None:
        self.rollout = rollout
        self.ids: list[int] | None = None
        self.expected = 1
        self.alloc_attempt = -1
        self.where: Where | None = None
        self.tally: dict[int, int] = {}
        self.committed_steps = 0
        self.counted_steps = 0
        self._expected_counts: dict[int, int] | None = None

    def allocate(self, ids: list[int], expected: int, attempt: int, where: Where) -> None:
        """The rollout's ``witness_allocated`` (the latest attempt's wins)."""
        self.ids, self.expected, self.alloc_attempt, self.where = ids, expected, attempt, where
        self._expected_counts = None

    def expected_counts(self) -> dict[int, int]:
        """Id -> times it must be counted; computed once per allocation (the recovery table and
        several rules ask when the rollout closes): read it, do not change it."""
        if self._expected_counts is None:
            out: dict[int, int] = {}
            for i in self.ids or ():
                out[i] = out.get(i, 0) + self.expected
            self._expected_counts = out
        return self._expected_counts

    def deficit(self) -> int | None:
        if self.ids is None:
            return None
        return sum(max(0, n - self.tally.get(i, 0)) for i, n in self.expected_counts().items())
