"""Typed emitters: one function per event type that a producer writes, the only way ftkit's
producers (``ftkit train``'s driver, ranks and engines, and ``ftkit.evidence``) log an event.

Each emitter takes the log (``EventSink``: an ``EventWriter``, or a ``Tee`` that also forwards
the event) and the event's fields as typed keyword arguments, named as in
``ftkit.events.schema``; a field the schema requires is a required argument, a field it leaves
optional has a default. ``tests/evidence/test_emitters.py`` checks every emitter against its schema
model (names, required or optional), so a schema change is made in the schema and here, and a
producer cannot write a line the analyzer would reject. ``EventWriter`` stays the transport: it
writes the line (never raising into training), and under ``FTKIT_STRICT_EVENTS=1`` validates it.

The line's keys follow the argument order below, which is the order the event log has always
had (docs/event-schema.md lists the schema's). An optional field whose default is ``None`` is
written as ``null``, except where the docstring says it is left out when not given (a per-rollout
``dump_written`` has no ``step``; ``placement``, ``canary_logprobs`` carry only the fields of
their role). Every emitter returns whether the line was written (``EventWriter.emit``).

``events_dropped`` and ``log_closed`` are the transport's own lines (``EventWriter.close``); the
checkpoint events are the publisher's (``ftkit.checkpoint.publish``, through its ``on_event``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ftkit.tensors.fingerprint import SCHEME

if TYPE_CHECKING:
    from ftkit.events.envelope import CellStatus

Outcome = Literal["committed", "discarded", "failed"]
RunStatus = Literal["completed", "failed", "interrupted"]


class EventSink(Protocol):
    """Where an event goes: ``EventWriter.emit``'s signature."""

    def emit(self, type: str, **fields: Any) -> bool: ...


@dataclass(frozen=True)
class Tee:
    """An ``EventSink`` that writes each event to ``log``, then hands it to ``also(type, fields)``
    (the driver's live view of its cell states); ``emit`` returns what ``log.emit`` returned."""

    log: EventSink
    also: Callable[[str, dict[str, Any]], object]

    def emit(self, type: str, **fields: Any) -> bool:  # noqa: A002 - EventWriter.emit's signature
        written = bool(self.log.emit(type, **fields))
        self.also(type, fields)
        return written


def _some(**fields: Any) -> dict[str, Any]:
    """The fields that are not None (the ones an emitter leaves out when not given)."""
    return {k: v for k, v in fields.items() if v is not None}


# ---------------------------------------------------------------------------- the run
def run_started(
    log: EventSink,
    *,
    config: Mapping[str, Any],
    num_cells: int,
    tp: int,
    pp: int,
    num_engines: int,
    ftkit_version: str,
    fingerprint_scheme: str = SCHEME,
) -> bool:
    """The driver started a run."""
    return log.emit(
        "run_started",
        config=config,
        num_cells=num_cells,
        tp=tp,
        pp=pp,
        num_engines=num_engines,
        ftkit_version=ftkit_version,
        fingerprint_scheme=fingerprint_scheme,
    )


def run_resumed(
    log: EventSink,
    *,
    config: Mapping[str, Any],
    num_cells: int,
    tp: int,
    pp: int,
    num_engines: int,
    ftkit_version: str,
    fingerprint_scheme: str = SCHEME,
    checkpoint: str | None,
    checkpoint_step: int,
    checkpoint_rollout: int,
    skipped: Sequence[str],
    layout_change: Mapping[str, list[int]] | None = None,
    precision_change: Sequence[str] | None = None,
) -> bool:
    """The driver resumed a run (in place of ``run_started``); ``layout_change`` is left out
    unless the session changed the layout, ``precision_change`` unless it changed the precision."""
    return log.emit(
        "run_resumed",
        config=config,
        num_cells=num_cells,
        tp=tp,
        pp=pp,
        num_engines=num_engines,
        ftkit_version=ftkit_version,
        fingerprint_scheme=fingerprint_scheme,
        checkpoint=checkpoint,
        checkpoint_step=checkpoint_step,
        checkpoint_rollout=checkpoint_rollout,
        skipped=list(skipped),
        **_some(
            layout_change=dict(layout_change) if layout_change else None,
            precision_change=list(precision_change) if precision_change else None,
        ),
    )


def evidence_profile(log: EventSink, *, producer: str, kinds: Mapping[str, int]) -> bool:
    """What a producer other than ``ftkit train`` promises (right after ``run_started``)."""
    return log.emit("evidence_profile", producer=producer, kinds=kinds)


def run_finished(log: EventSink, *, status: RunStatus, reason: str | None = None) -> bool:
    """The driver finished the run; nothing may be logged after it."""
    return log.emit("run_finished", status=status, reason=reason)


def cell_state(log: EventSink, *, cell: int, old: CellStatus, new: CellStatus, reason: str | None = None) -> bool:
    """A cell changed state."""
    return log.emit("cell_state", cell=cell, old=old, new=new, reason=reason)


def reconfigure(
    log: EventSink, *, epoch: int, alive_before: list[int], alive_after: list[int], reason: str | None = None
) -> bool:
    """The cross-cell membership changed (a new epoch)."""
    return log.emit("reconfigure", epoch=epoch, alive_before=alive_before, alive_after=alive_after, reason=reason)


def placement(
    log: EventSink,
    *,
    role: Literal["trainer", "engine"],
    incarnation: int,
    node_id: str,
    address: str,
    planned_node_id: str | None = None,
    cell: int | None = None,
    rank: int | None = None,
    engine: int | None = None,
) -> bool:
    """Where a rank (``cell``, ``rank``) or an engine (``engine``) runs; the fields of the other
    role are left out."""
    return log.emit(
        "placement",
        role=role,
        incarnation=incarnation,
        node_id=node_id,
        address=address,
        planned_node_id=planned_node_id,
        **_some(cell=cell, rank=rank, engine=engine),
    )


def metric(
    log: EventSink,
    *,
    rollout: int,
    step: int | None,
    values: Mapping[str, float | None],
    phases: Mapping[str, float] | None = None,
    wall_seconds: float | None = None,
    micro_shard_seconds: Sequence[float | None] | None = None,
) -> bool:
    """The run's scalar metrics of ``step`` (``None``: per rollout); ``phases``, ``wall_seconds``
    and ``micro_shard_seconds`` (a step's timing, ``ftkit.train.control.step_clock``) are left
    out when not given."""
    timing = _some(phases=phases, wall_seconds=wall_seconds, micro_shard_seconds=micro_shard_seconds)
    return log.emit("metric", rollout=rollout, step=step, values=values, **timing)


def fault_injected(
    log: EventSink,
    *,
    kind: str,
    point: str,
    cell: int | None,
    rank: int | None,
    rollout: int | None,
    step: int | None,
    attempt: int | None = None,
    engine: int | None = None,
) -> bool:
    """A fault was injected on purpose."""
    return log.emit(
        "fault_injected",
        kind=kind,
        point=point,
        cell=cell,
        rank=rank,
        rollout=rollout,
        step=step,
        attempt=attempt,
        engine=engine,
    )


# ---------------------------------------------------------------------------- steps
def step_outcome(
    log: EventSink,
    *,
    rollout: int,
    step: int,
    attempt: int,
    epoch: int,
    cell: int,
    outcome: Outcome,
    micro_shards: list[int],
    rank: int | None = None,
) -> bool:
    """What one rank did with one attempt of a step (both producers: the FT106 evidence)."""
    return log.emit(
        "step_outcome",
        rollout=rollout,
        step=step,
        attempt=attempt,
        epoch=epoch,
        cell=cell,
        rank=rank,
        outcome=outcome,
        micro_shards=micro_shards,
    )


def state_fingerprint(
    log: EventSink,
    *,
    rollout: int,
    step: int,
    attempt: int,
    cell: int,
    total: str,
    params: Mapping[str, str],
    optimizer: Mapping[str, str],
    rank: int | None = None,
    weights: Mapping[str, str] | None = None,
) -> bool:
    """One rank's state fingerprint after a committed step (the FT101 evidence); ``weights``
    (left out unless given): a bf16 run's model weights, cast from the masters ``params``."""
    return log.emit(
        "state_fingerprint",
        rollout=rollout,
        step=step,
        attempt=attempt,
        cell=cell,
        rank=rank,
        total=total,
        params=params,
        optimizer=optimizer,
        **_some(weights=weights),
    )


def witness_allocated(log: EventSink, *, rollout: int, attempt: int, ids: list[int], expected: int) -> bool:
    """The sample ids of a rollout, each to be counted ``expected`` times."""
    return log.emit("witness_allocated", rollout=rollout, attempt=attempt, ids=ids, expected=expected)


def witness_counts(
    log: EventSink,
    *,
    rollout: int,
    step: int,
    attempt: int,
    cell: int,
    ids: list[int],
    counts: list[int],
    contributions: list[float],
    rank: int | None = None,
) -> bool:
    """One step attempt's global per-sample counts."""
    return log.emit(
        "witness_counts",
        rollout=rollout,
        step=step,
        attempt=attempt,
        cell=cell,
        rank=rank,
        ids=ids,
        counts=counts,
        contributions=contributions,
    )


def grad_nonfinite(log: EventSink, *, rollout: int, step: int, cell: int, rank: int | None, where: str) -> bool:
    """A rank found a non-finite gradient."""
    return log.emit("grad_nonfinite", rollout=rollout, step=step, cell=cell, rank=rank, where=where)


def heal(
    log: EventSink,
    *,
    cell: int,
    donor: int,
    epoch: int,
    bytes: int,  # noqa: A002 - the schema's field name
    seconds: Mapping[str, float],
    total: str,
    donor_total: str,
) -> bool:
    """A restarted cell received the full state from a donor."""
    return log.emit(
        "heal", cell=cell, donor=donor, epoch=epoch, bytes=bytes, seconds=seconds, total=total, donor_total=donor_total
    )


def dump_written(
    log: EventSink,
    *,
    rollout: int,
    phase: str,
    path: str,
    tensors: int,
    bytes: int,  # noqa: A002 - the schema's field name
    step: int | None = None,
) -> bool:
    """A dump file was written; ``step`` (a per-step dump) is left out of a per-rollout one."""
    return log.emit(
        "dump_written", rollout=rollout, **_some(step=step), phase=phase, path=path, tensors=tensors, bytes=bytes
    )


def logprob_check(
    log: EventSink,
    *,
    rollout: int,
    step: int,
    cell: int,
    rank: int,
    version: int,
    witness_ids: list[int],
    samples: list[dict[str, Any]],
    positions: list[dict[str, Any]],
    total: dict[str, Any],
    attempt: int = 0,
) -> bool:
    """A rank compared its recomputed log-probs with the engines' (``LogprobMismatch`` dicts)."""
    return log.emit(
        "logprob_check",
        rollout=rollout,
        step=step,
        attempt=attempt,
        cell=cell,
        rank=rank,
        version=version,
        witness_ids=witness_ids,
        samples=samples,
        positions=positions,
        total=total,
    )


# ---------------------------------------------------------------------------- engines
def weights_sent(log: EventSink, *, rollout: int, version: int, total: str, params: Mapping[str, str]) -> bool:
    """The driver pushed a weights version to the engines."""
    return log.emit("weights_sent", rollout=rollout, version=version, total=total, params=params)


def engine_weights(
    log: EventSink, *, rollout: int, version: int, engine: int, total: str, params: Mapping[str, str]
) -> bool:
    """An engine reports what it loaded."""
    return log.emit("engine_weights", rollout=rollout, version=version, engine=engine, total=total, params=params)


def engine_restart(log: EventSink, *, engine: int, cause: str, during: str) -> bool:
    """A replaced engine started (first line of its log)."""
    return log.emit("engine_restart", engine=engine, cause=cause, during=during)


def engine_failed(log: EventSink, *, engine: int, incarnation: int, reason: str) -> bool:
    """The driver found an engine dead or failing."""
    return log.emit("engine_failed", engine=engine, incarnation=incarnation, reason=reason)


def canary_logprobs(
    log: EventSink,
    *,
    rollout: int,
    version: int,
    rows: int,
    logprobs: list[float],
    engine: int | None = None,
    cell: int | None = None,
    rank: int | None = None,
) -> bool:
    """The canary set scored under a weights version, by an engine (``engine``) or a trainer
    (``cell``, ``rank``); the fields of the other role are left out."""
    return log.emit(
        "canary_logprobs",
        rollout=rollout,
        version=version,
        **_some(engine=engine, cell=cell, rank=rank),
        rows=rows,
        logprobs=logprobs,
    )
