"""Where a step's time goes: the ``phases`` of the driver's per-step ``metric`` event.

A step's phases cover the driver's wall time from the end of the previous committed step (the
start of training for the first step of a session) to the end of this one, ``wall_seconds``
(docs/train.md "Where a step's time goes"). Each phase is timed where it happens, with
``ftkit.evidence.phases.PhaseTimer`` (a host clock, no device synchronisation):

* driver, between steps (``StepClock.phase``): ``generation`` and ``scoring`` (rewards,
  advantages) and ``record`` (the rollout file, ``witness_allocated``, the batch put in Ray's
  object store) of a rollout land on its first step; ``weight_sync`` (export, fingerprint, load
  on every engine) and ``checkpoint`` (publication) after a rollout, and ``log`` (the previous
  step's metric, fsync and progress line), land on the step after them;
* coordinator (``attempt_phases``): ``membership`` (restarts, heals, reconfiguration at the
  boundary), ``retry`` (attempts that did not commit, their discard and reconfiguration);
* ranks: the committed attempt's phases of the first live cell's rank 0 (the other cells run in
  parallel): phase 1 ``prepare``, ``forward_backward``, ``reuse``, ``logprob_check``, ``reduce``
  (the cross-cell collectives, so also the wait there for slower cells); phase 2 ``witness``,
  ``grad_norm``, ``dumps``, ``optimizer``, ``fingerprint``, ``log``;
* what the driver waited beyond that rank's own work: ``wait_peers`` in phase 1 (Ray's dispatch
  and return, the slower cells' ranks) and ``commit_barrier`` in phase 2.

So the phases add up to ``wall_seconds`` up to the driver's own glue between them (the tests
hold them within 10%). ``micro_shard_seconds`` lists every micro-shard's forward-backward host
seconds, from the cell that computed it (``None``: reused from a discarded attempt).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import ftkit.evidence.emit as emit

if TYPE_CHECKING:
    from ftkit.evidence.emit import EventSink
    from ftkit.train.control.results import StepOutcome
    from ftkit.train.rank.step_types import Committed, Reduced


def attempt_phases(
    driver: Mapping[str, float], phase1: tuple[float, Reduced], phase2: tuple[float, Committed]
) -> dict[str, float]:
    """The phases of a committed step's ``run_step``: the coordinator's own (``driver``), then
    phase 1 and phase 2 as ``(seconds the driver waited, the reporting rank's answer)``, the wait
    beyond the rank's own phases as ``wait_peers`` / ``commit_barrier`` (never below 0)."""
    phases = dict(driver)
    for (waited, answer), rest in ((phase1, "wait_peers"), (phase2, "commit_barrier")):
        for name, seconds in answer.seconds.items():
            phases[name] = phases.get(name, 0.0) + seconds
        phases[rest] = max(0.0, waited - sum(answer.seconds.values()))
    return phases


def shard_seconds(reduced: Mapping[int, list[Reduced]], micro_shards: int) -> list[float | None]:
    """Every micro-shard's seconds, from the (first rank of the) cell that computed it."""
    out: list[float | None] = [None] * micro_shards
    for answers in reduced.values():
        for m, seconds in answers[0].shard_seconds.items() if answers else ():
            out[m] = seconds
    return out


class StepClock:
    """The driver's side (see the module docstring): ``start()`` at the start of training,
    ``phase(name)`` around its work between steps, ``close(out)`` at each committed step."""

    def __init__(self) -> None:
        self.pending: dict[str, float] = {}
        self.since = time.perf_counter()

    def start(self) -> None:
        """The next step's wall time starts now; nothing timed before counts."""
        self.pending, self.since = {}, time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block into the next step's phase ``name``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.pending[name] = self.pending.get(name, 0.0) + time.perf_counter() - t

    def close(self, out: StepOutcome) -> tuple[dict[str, float], float]:
        """``(phases, wall_seconds)`` of the committed step ``out``; the next step starts now."""
        now = time.perf_counter()
        phases = dict(self.pending)
        for name, seconds in out.phases.items():
            phases[name] = phases.get(name, 0.0) + seconds
        wall, self.pending, self.since = now - self.since, {}, now
        return phases, wall


def emit_step(log: EventSink, out: StepOutcome, clock: StepClock) -> float:
    """The step's ``metric`` (loss, grad_norm, tokens_per_s, step_seconds, attempts, the ranks'
    RL metrics ``out.metrics`` and the phases of ``clock.close(out)``); returns its tokens per
    second (of training)."""
    tps = out.tokens / out.seconds if out.seconds > 0 else 0.0
    phases, wall = clock.close(out)
    values = {
        "loss": out.loss,
        "grad_norm": out.grad_norm,
        "tokens_per_s": tps,
        "step_seconds": out.seconds,
        "attempts": float(out.attempts),
        **out.metrics,
    }
    emit.metric(
        log,
        rollout=out.rollout,
        step=out.step,
        values=values,
        phases={k: round(v, 6) for k, v in phases.items()},
        wall_seconds=round(wall, 6),
        micro_shard_seconds=[None if s is None else round(s, 6) for s in out.shard_seconds] or None,
    )
    return tps
