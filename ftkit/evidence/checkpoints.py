"""Guarded checkpoint publication of a plain module + optimizer, for any trainer (invariant I4).

``publish(run, step, model, optimizer)`` (``EvidenceRun.publish_checkpoint``) is a collective;
on every rank, at the same step:

1. the rank consumes its non-finite guard (``EvidenceRun.observe_grads`` fed it since the last
   boundary) and runs ``ftkit.checkpoint.preflight`` (guard clean, room on disk, target free);
2. the verdicts and guards of every rank are gathered (JSON over ``torch.distributed``, no
   tensor collective before the decision) and ``agree``d: one failing rank means nobody writes,
   and rank 0 logs ``checkpoint_rejected`` with every reason;
3. otherwise rank 0 publishes its state (the replicas are identical: FT101 checks that) with
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

from typing import Any

from ftkit.evidence.collectives import broadcast_json, gather_json


def publish(
    run: Any,
    step: int,
    model: Any,
    optimizer: Any = None,
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
    from ftkit.checkpoint.preflight import PreflightVerdict, agree, preflight
    from ftkit.checkpoint.publish import Payload, Publisher
    from ftkit.checkpoint.restore import MODEL, OPTIMIZER, PREFIXES
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
        fingerprint_prefixes=PREFIXES,
    )
    guard = run.guard.consume(step)
    mine = preflight(directory, step, payload.nbytes, guard, f"rank{run.rank}")
    answers = gather_json({"ok": mine.ok, "who": mine.who, "reasons": list(mine.reasons), "guard": guard.to_json()})
    if run.rank != 0:
        return bool(broadcast_json(None))
    verdicts = [PreflightVerdict(a["ok"], a["who"], tuple(a["reasons"])) for a in answers]
    guards = [
        GuardVerdict(g["from_step"], g["to_step"], g["tainted"], g["count"], tuple(g["reasons"]))
        for g in (a["guard"] for a in answers)
    ]
    agreed, merged = agree(verdicts), merge(guards)
    publisher = Publisher(
        directory,
        RetentionPolicy(keep_last, keep_best, best_metric),
        on_event=lambda type_, fields: run.driver.emit(type_, **fields),
    )
    if not agreed.ok:
        payload = Payload(files={})
    outcome = publisher.publish(step, payload, merged, agreed, metric=metric, rollout=rollout)
    run.driver.sync()
    return bool(broadcast_json(outcome.published))
