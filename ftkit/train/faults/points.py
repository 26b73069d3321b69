"""The named fault points of a step, and the injector each actor consults at them.

Every actor (rank, engine) builds one injector from its run plan's faults with ``injector_for`` and
calls ``injector.at(point, step=..., attempt=..., rollout=...)`` at each point of
``ftkit.train.faults.spec.POINTS`` it passes. Without ``--inject`` / ``--chaos`` that is ``NoFaults`` (a call that
returns ``None``: no import, no cost); with them it is ``ftkit.train.faults.injector.FaultInjector``
(docs/fault-injection.md), which logs ``fault_injected`` before it fires and either acts
itself (``sigkill``, ``exit``, ``exception``, ``hang``, ``slow``) or returns the kind for the
caller to apply (``nan-grad``, ``corrupt-transfer``, ``corrupt-engine``, ``stale-weights``).

Where each point is (docs/faults.md has the recovery of each):

* ``before_forward``, ``mid_backward`` (a gradient hook inside the first micro-shard's
  backward pass), ``before_reduce``, ``during_reduce`` (between the reduction's two
  collectives), ``after_reduce``: ``RankWorker.compute_reduce``;
* ``during_weight_sync``: ``RankWorker.export_weights`` and ``EngineActor.load_weights`` (``ftkit.train.rl.engines``);
* ``during_dump_write``: a rank writing a dump;
* ``during_heal``: a restarted rank loading its donor's state (``RankWorker.load_state``);
* ``publish_preflight``: every rank's checkpoint preflight; ``publish_write`` with ``cell=``: the
  rank that wrote a checkpoint's files (``RankWorker.write_checkpoint``); the other publication
  points are the driver's (``ftkit.train.control.checkpoints``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ftkit.events.writer import EventWriter
    from ftkit.train.faults.spec import FaultSpec


class Injector(Protocol):
    """What an actor calls at a fault point (``FaultInjector`` or ``NoFaults``)."""

    def at(self, point: str, *, step: int | None = None, attempt: int = 0, rollout: int | None = None) -> str | None:
        """Fire what is armed at ``point`` (or return its kind for the caller); ``None``: nothing."""
        ...


class NoFaults:
    """The injector of a run without injections: nothing is ever armed."""

    def at(self, point: str, *, step: int | None = None, attempt: int = 0, rollout: int | None = None) -> str | None:
        return None


def injector_for(
    faults: Sequence[FaultSpec],
    events: EventWriter,
    role: Literal["trainer", "engine", "driver"],
    cell: int | None = None,
    rank: int | None = None,
    engine: int | None = None,
) -> Injector:
    """The injector of one actor: ``NoFaults`` unless the run injects ``faults``
    (``ftkit.train.plan.run_plan.RunPlan.faults``)."""
    if not faults:
        return NoFaults()
    from ftkit.train.faults.injector import FaultInjector

    injector: Injector = FaultInjector(
        faults,
        events,
        role=role,
        cell=cell,
        rank=rank,
        engine=engine,
    )
    return injector
