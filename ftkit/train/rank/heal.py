"""Heal, the recipient's side: load a live donor's complete state and prove it arrived intact.

The driver (``ftkit.train.control.healing``) has the donor rank serve its state
(``RankWorker.serve_state``: ``state_codec.encode``, each storage once) and the restarted
rank of the same position receive it (``RankWorker.load_state``), both under one rendezvous
``key`` of the driver's TCPStore; the bytes go over one direct TCP stream
(``ftkit.train.rank.heal_stream``), not through Ray's object store. ``receive``:

1. ``wait`` / ``fetch`` / ``trailer``: the rendezvous, the storages' bytes, the donor's
   fingerprint total (``heal_stream.receive``); a storage that is one parameter or optimizer
   moment goes straight into the rank's own tensor (``destinations``: memory already
   allocated and touched, ``RankWorker.heal_room``), anything else into a fresh buffer;
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
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.train.rank.step_types import HealReport

if TYPE_CHECKING:
    from ftkit.train.rank.context import RankContext


def destinations(room: dict[str, Any]) -> Any:
    """``heal_stream.receive``'s ``into``: a donor storage that is exactly one tensor (offset
    0, contiguous, same dtype, shape and bytes) of a name in ``room`` (codec names: the
    recipient's parameters and the optimizer moments it allocated at start) is received
    straight into that tensor's memory; anything else (a shared storage, another layout, a
    device tensor) into a fresh buffer."""
    import json

    import torch

    views: dict[str, list[tuple[str, list[Any]]]] = {}

    def into(meta: dict[str, str], storage: str, nbytes: int) -> Any:
        if not views:
            for key, value in meta.items():
                if key.startswith("view/"):
                    view = json.loads(value)
                    views.setdefault(view[0], []).append((key.removeprefix("view/"), view))
        seen = views.get(storage, [])
        if len(seen) != 1:
            return None
        name, (_, dtype, offset, shape, _stride) = seen[0]
        t = room.get(name)
        if t is None:
            return None
        fits = (
            t.device.type == "cpu"
            and t.is_contiguous()
            and t.storage_offset() == 0
            and offset == 0
            and list(t.shape) == shape
            and str(t.dtype).removeprefix("torch.") == dtype
            and t.numel() * t.element_size() == nbytes
        )
        return t.detach().reshape(-1).view(torch.uint8) if fits else None

    return into


def receive(
    ctx: RankContext, room: dict[str, Any], key: str, donor: int, epoch: int, step: int, attempt: int = 0
) -> tuple[HealReport, dict[str, int]]:
    """Receive the state the donor serves under ``key`` into the rank of ``ctx`` (the
    tensors of ``room`` reused where they fit, ``destinations``) before run-global step
    ``step`` (its heal attempt ``attempt``); see the module docstring. Returns the report and
    the step counters the received state holds (the caller's from now on)."""
    from ftkit.train.rank import heal_stream
    from ftkit.train.rank.state import fingerprint_state
    from ftkit.train.rank.state_codec import decode, restore, state_bytes

    cfg = ctx.cfg
    tensors, meta, donor_total, seconds = heal_stream.receive(
        ctx.link.store, key, cfg.recovery.collective_timeout, destinations(room)
    )
    t1 = time.perf_counter()
    state = decode(tensors, meta)
    rollout = step // ctx.cfg.batch.steps_per_rollout
    if ctx.faults.at("during_heal", step=step, attempt=attempt, rollout=rollout) == "corrupt-transfer":
        from ftkit.train.faults.injector import flip_bit

        name = next(iter(state.params))
        state.params[name] = state.params[name].clone()
        flip_bit(state.params[name])
    t2 = time.perf_counter()
    seconds["decode"] = t2 - t1
    witness = None if ctx.witness is None else ctx.witness.param
    restore(state, ctx.params, ctx.optimizer, witness, owned=True)  # the received buffers
    ctx.recast()  # bf16: the weights from the received masters
    t3 = time.perf_counter()
    seconds["load"] = t3 - t2
    total, _, _ = fingerprint_state(ctx.model, ctx.optimizer, ctx.params)
    seconds["verify"] = time.perf_counter() - t3
    seconds["total"] = sum(seconds.values())
    size = state_bytes(tensors)
    accepted = total == donor_total
    if accepted:
        emit.heal(
            ctx.events,
            cell=ctx.cell,
            donor=donor,
            epoch=epoch,
            bytes=size,
            seconds=seconds,
            total=total,
            donor_total=donor_total,
        )
        ctx.events.sync()
    return HealReport(ctx.cell, ctx.rank, donor, accepted, size, total, donor_total, seconds), dict(state.counters)
