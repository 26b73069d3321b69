"""Guarded checkpoint publication of a plain module + optimizer, for any trainer (invariant I4).

``publish(run, step, model, optimizer)`` (``EvidenceRun.publish_checkpoint``) is a collective;
on every rank, at the same step:

1. the rank consumes its non-finite guard (``EvidenceRun.observe_grads`` fed it since the last
   boundary) and runs ``ftkit.checkpoint.preflight`` (guard clean, room on disk, target free);
   it takes its state fingerprint at ``step``: the one it logged for the step, or it logs one
   now (``state_fingerprint``, so ``verify-checkpoint`` finds the fingerprint of every published
   step in the log whatever the fingerprint cadence);
2. the verdicts, guards and fingerprints of every rank are gathered (JSON over
   ``torch.distributed``, no tensor collective before the decision) and ``agree``d: one failing
   rank, or replicas whose fingerprints differ (they diverged: rank 0's state is not the run's),
   means nobody writes, and rank 0 logs ``checkpoint_rejected`` with every reason;
3. otherwise rank 0 publishes its state (the replicas are identical: every rank's fingerprint is
   rank 0's) with
   ``ftkit.checkpoint.publish.Publisher`` into ``<run>/checkpoints/``: files written and
   scanned for NaN / Inf, ``MANIFEST.json`` last, atomic rename, retention journal,
   ``checkpoint_published`` in the driver log.

The checkpoint stores ``model.safetensors`` (parameters) and ``optimizer.safetensors``
(``<param>.<key>``), named as ``fingerprint_state`` names them, so its manifest's
``state_fingerprint`` is the ``total`` every rank logged at that step and
``ftkit verify-checkpoint RUN/checkpoints --events RUN/events`` checks the chain end to end.
Its ``meta.json`` records ``rollout`` and ``rollout_complete`` (``EvidenceRun.rollout_complete``:
whether the checkpoint ends its rollout, which a resume requires, ``ftkit.evidence.resume``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.evidence.collectives import broadcast_json, gather_json

if TYPE_CHECKING:
    import torch


def publish(
    run: Any,  # the EvidenceRun (not imported: it imports this module)
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    metric: float | None = None,
    rollout: int = 0,
    keep_last: int = 2,
    keep_best: int = 0,
    best_metric: str | None = None,
    meta: dict[str, Any] | None = None,
) -> bool:
    """Publish the state at ``step`` unless any rank's guard or preflight says no; returns whether
    it was published (the same answer on every rank). ``metric`` ranks it for ``keep_best``."""
    from ftkit.checkpoint.guard import GuardVerdict, merge
    from ftkit.checkpoint.layout import MODEL, OPTIMIZER, STATE_PREFIXES
    from ftkit.checkpoint.preflight import PreflightVerdict, agree, preflight
    from ftkit.checkpoint.publish import Payload, Publisher
    from ftkit.checkpoint.retention import RetentionPolicy
    from ftkit.evidence.fingerprint import named_state, unwrap

    directory = run.dir / "checkpoints"
    params, optim = named_state(unwrap(model), optimizer)
    payload = Payload(
        files={MODEL: params, OPTIMIZER: optim},
        meta={
            "run": run.run,
            "cells": run.world_size,
            "layout": {"tp": 1, "pp": 1},
            "rollout_complete": run.rollout_complete(rollout),
            **(meta or {}),
        },
        fingerprint_prefixes=STATE_PREFIXES,
    )
    guard = run.guard.consume(step)
    mine = preflight(directory, step, payload.nbytes, guard, f"rank{run.rank}")
    total = run.fingerprint_at(step, model, optimizer, rollout=rollout)
    answers = gather_json(
        {"ok": mine.ok, "who": mine.who, "reasons": list(mine.reasons), "guard": guard.to_json(), "total": total}
    )
    if run.rank != 0:
        return bool(broadcast_json(None))
    verdicts = [PreflightVerdict(a["ok"], a["who"], tuple(a["reasons"])) for a in answers]
    diverged = _diverged(step, [a["total"] for a in answers])
    if diverged is not None:
        verdicts.append(PreflightVerdict(False, "replicas", (diverged,)))
    guards = [
        GuardVerdict(g["from_step"], g["to_step"], g["tainted"], g["count"], tuple(g["reasons"]))
        for g in (a["guard"] for a in answers)
    ]
    agreed, merged = agree(verdicts), merge(guards)
    driver = run.driver
    assert driver is not None  # rank 0 holds the driver log

    def on_event(type_: str, fields: dict[str, Any]) -> None:
        driver.emit(type_, **fields)

    publisher = Publisher(directory, RetentionPolicy(keep_last, keep_best, best_metric), on_event=on_event)
    if not agreed.ok:
        payload = Payload(files={})
    outcome = publisher.publish(step, payload, merged, agreed, metric=metric, rollout=rollout)
    driver.sync()
    return bool(broadcast_json(outcome.published))


def _diverged(step: int, totals: list[str]) -> str | None:
    """Why the replicas may not be published at ``step`` (their state fingerprints differ), or None."""
    if len(set(totals)) <= 1:
        return None
    others = [f"rank {r} {t[:16]}" for r, t in enumerate(totals) if t != totals[0]]
    return (
        f"the replicas diverged at step {step}: rank 0's state fingerprint is {totals[0][:16]}, "
        f"{', '.join(others[:8])}{' ...' if len(others) > 8 else ''} (analyze-events FT101 says since when)"
    )
