"""The typed values that cross the driver <-> rank seam for one optimizer step.

A step attempt has two phases on every rank of every live cell (docs/faults.md):

1. ``RankWorker.compute_reduce(StepTask, batch) -> Reduced``: forward/backward of the cell's
   micro-shards and the cross-cell reduction; nothing is stepped, the reduced gradient is
   held by the rank;
2. after the driver has every live rank's ``Reduced``: ``commit(step, attempt) -> Committed``
   everywhere (optimizer step, witness counts, fingerprint), or ``discard(step, attempt,
   reason)`` everywhere (the held gradient is dropped; parameters and optimizer state are
   untouched).

``HealReport`` is what a restarted rank says after loading a donor's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepTask:
    """One attempt of one optimizer step, as every rank of one cell runs it."""

    rollout: int
    step: int  # run-global: rollout * steps_per_rollout + k
    attempt: int  # from 0; a retry of the same step counts up
    epoch: int  # membership epoch the attempt runs in (the cross-cell group's)
    shards: tuple[int, ...]  # the micro-shards this cell computes
    dump: bool = False  # write this step's activation/grad dumps
    dump_replicated: bool = False  # this cell also dumps the replicated state (weights)


@dataclass(frozen=True)
class Reduced:
    """Phase 1 done on one rank: the reduction succeeded (``finite``) or was non-finite."""

    cell: int
    rank: int
    step: int
    attempt: int
    finite: bool  # False: non-finite or overflowing gradient, the same on every cell
    loss: float  # the step's loss summed over all micro-shards (the same on every cell)
    tokens: int  # learned tokens of the step
    # this rank's phases of the attempt (``ftkit.evidence.phases``): prepare, forward_backward,
    # reduce, ...; and the host seconds of each micro-shard it computed (reused ones have none)
    seconds: dict[str, float] = field(default_factory=dict)
    shard_seconds: dict[int, float] = field(default_factory=dict)
    # GRPO's per-step metrics (``ftkit.train.rank.step_metrics``): the same on every cell
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Committed:
    """Phase 2 done on one rank: the optimizer stepped."""

    cell: int
    rank: int
    step: int
    attempt: int
    grad_norm: float
    total: str | None  # the state fingerprint after the step (None without bookkeeping)
    seconds: dict[str, float] = field(default_factory=dict)  # this rank's commit phases: witness, optimizer, ...


@dataclass(frozen=True)
class HealReport:
    """A restarted rank loaded a donor's state; ``accepted`` when ``total == donor_total``."""

    cell: int
    rank: int
    donor: int
    accepted: bool
    bytes: int
    total: str
    donor_total: str
    seconds: dict[str, float]  # phase -> seconds on the recipient (fetch, decode, load, verify)
