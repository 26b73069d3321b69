"""Heal, the recipient's side: load a live donor's complete state and prove it arrived intact.

The driver (``ftkit.train.healing``) asks a donor rank for ``donor_state()`` (the state codec's
``encode``, put in Ray's object store once) and hands the object ref to the restarted rank
of the same position, wrapped in a list so that Ray does not resolve it before the call
(the fetch is then timed here). ``receive``:

1. ``fetch``: ``ray.get`` of the payload (one copy, from the object store);
2. ``decode``: ``state_codec.decode`` (views rebuilt over the received storages, no copy);
   the ``during_heal`` fault point is here; ``corrupt-transfer`` flips one bit of one
   received tensor (``faults.flip_bit``);
3. ``load``: ``state_codec.restore`` into the rank's model, optimizer, witness and RNG;
4. ``verify``: the fingerprint total of what the rank now holds (the ``state_fingerprint``
   total) against the donor's.

Equal: ``heal`` event (cell, donor, epoch, bytes, per-phase seconds, ``total``,
``donor_total``) and an accepted ``HealReport``. Different: nothing is emitted and the report
says rejected; the driver retries from another donor.
"""

from __future__ import annotations

import time
from typing import Any

from ftkit.train.step_types import HealReport


def receive(worker: Any, payload: list[Any], donor: int, epoch: int, step: int, attempt: int = 0) -> HealReport:
    """Load the donor state in ``payload`` (``[object ref]``) into ``worker`` before run-global
    step ``step`` (its heal attempt ``attempt``); see the module docstring."""
    import ray

    from ftkit.train.rank_state import fingerprint_state
    from ftkit.train.state_codec import decode, restore, state_bytes

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    tensors, meta, donor_total = ray.get(payload[0])
    t1 = time.perf_counter()
    seconds["fetch"] = t1 - t0
    state = decode(tensors, meta)
    rollout = step // worker.cfg.steps_per_rollout
    if worker.faults.at("during_heal", step=step, attempt=attempt, rollout=rollout) == "corrupt-transfer":
        from ftkit.train.faults import flip_bit

        name = next(iter(state.params))
        state.params[name] = state.params[name].clone()
        flip_bit(state.params[name])
    t2 = time.perf_counter()
    seconds["decode"] = t2 - t1
    witness = None if worker.witness is None else worker.witness.param
    restore(state, worker.params, worker.optimizer, witness)
    worker.counters = dict(state.counters)
    t3 = time.perf_counter()
    seconds["load"] = t3 - t2
    total, _, _ = fingerprint_state(worker.model, worker.optimizer, worker.params)
    seconds["verify"] = time.perf_counter() - t3
    seconds["total"] = sum(seconds.values())
    size = state_bytes(tensors)
    accepted = total == donor_total
    if accepted:
        worker.events.emit(
            "heal",
            cell=worker.cell,
            donor=donor,
            epoch=epoch,
            bytes=size,
            seconds=seconds,
            total=total,
            donor_total=donor_total,
        )
        worker.events.sync()
    return HealReport(worker.cell, worker.rank, donor, accepted, size, total, donor_total, seconds)
