"""One committed step of a synthetic run, on every rank of every live cell, with the spec's
violation injected where it is due.

``commit(world, rollout, step, attempt, ids)`` writes what ``ftkit train`` logs for a step that
commits: per rank ``step_outcome``, ``state_fingerprint`` and ``witness_counts`` (every sample of
``ids`` counted once); at a rollout's first step the trainers' canary scores (pp=1) and, with
GRPO, each live cell's ``logprob_check``; the driver's ``metric``; the first step's dump. The
violation (``FT101``..``FT114`` except the faults' ``FT107`` and the run's ``FT102``, ``FT113``)
goes into the first step at or after ``world.violation_step`` whose layout allows it.
"""

from __future__ import annotations

from ftkit.evidence import emit
from ftkit.tensors.fingerprint import state_total
from ftkit.testing.synthetic_world import SimWorld, canary, digest


def _due(world: SimWorld, step: int) -> str | None:
    """The violation to inject at ``step`` (then none is left), or None."""
    left, at = world.violation_left, world.violation_step
    if (
        left
        and at is not None
        and step >= at
        and (len(world.alive) > 1 or left not in ("FT101", "FT106"))
        and (left != "FT114" or step % world.spec.steps_per_rollout == 0)  # a first step
    ):
        world.violation_left, world.violation_step = None, step
        return left
    return None


def commit(world: SimWorld, rollout: int, step: int, attempt: int, ids: list[int]) -> None:
    """Every live rank commits ``step`` (see the module docstring)."""
    spec, v = world.spec, _due(world, step)
    shards = assign(spec.micro_shards, world.alive)
    fps = world.fingerprints(step)
    counts = {i: 1 for i in ids}
    if v == "FT103":
        counts.pop(ids[0])
    elif v == "FT104":
        counts[ids[0]] = 2
    elif v == "FT105":
        counts[10_000_000 + step] = 1
    for cell in world.alive:
        for rank in range(world.ranks):
            w = world.rank_writers[(cell, rank)]
            outcome: emit.Outcome = (
                "discarded" if v == "FT106" and cell == world.alive[-1] and rank == 0 else "committed"
            )
            emit.step_outcome(
                w,
                rollout=rollout,
                step=step,
                attempt=attempt,
                epoch=world.epoch,
                cell=cell,
                rank=rank,
                outcome=outcome,
                micro_shards=shards[cell],
            )
            total, params, opt = fps[rank]
            if v == "FT101" and cell == world.alive[-1] and rank == 0:
                params = dict(params)
                name = next(iter(params))
                params[name] = digest("diverged", name)
                total = state_total(params, opt)
            if not (v == "FT112" and cell == world.alive[-1] and rank == 0):
                emit.state_fingerprint(
                    w,
                    rollout=rollout,
                    step=step,
                    attempt=attempt,
                    cell=cell,
                    rank=rank,
                    total=total,
                    params=params,
                    optimizer=opt,
                )
            if v == "FT111" and cell == world.alive[0] and rank == 0:
                # Raw on purpose: a line that cannot be serialised, so the writer drops it and its
                # seq is a gap (FT111); no typed emitter takes such values.
                w.emit("metric", rollout=rollout, step=step, values=object())
            emit.witness_counts(
                w,
                rollout=rollout,
                step=step,
                attempt=attempt,
                cell=cell,
                rank=rank,
                ids=list(counts),
                counts=list(counts.values()),
                contributions=[round(0.25 + (i % 7) / 10, 3) for i in counts],
            )
        if v == "FT110" and cell == world.alive[0]:
            emit.grad_nonfinite(
                world.rank_writers[(cell, 0)],
                rollout=rollout,
                step=step,
                cell=cell,
                rank=0,
                where="decoder.layers.0.mlp.linear_fc1.weight",
            )
    if step % spec.steps_per_rollout == 0 and spec.pp == 1:
        for cell in world.alive:
            emit.canary_logprobs(
                world.rank_writers[(cell, 0)], rollout=rollout, version=rollout, cell=cell, rank=0, **canary(rollout)
            )
    if world.grpo and step % spec.steps_per_rollout == 0:  # the whole rollout is compared
        every = list(range(rollout * spec.samples_per_rollout, (rollout + 1) * spec.samples_per_rollout))
        _logprob_checks(world, rollout, step, attempt, every, v == "FT114")
    if v == "FT108":
        world.cell_state(world.alive[0], "starting", "alive", "injected")
    loss = float("nan") if v == "FT109" else round(2.5 / (1 + step), 6)
    emit.metric(
        world.driver,
        rollout=rollout,
        step=step,
        values={"loss": loss, "grad_norm": round(1.0 + (step % 5) / 10, 4), "reward": 0.5},
    )
    if rollout == 0 and step == 0:
        emit.dump_written(
            world.rank_writers[(world.alive[0], 0)],
            rollout=rollout,
            phase="fwd_bwd",
            path="dumps/actor/fwd_bwd/rollout_000000/x.safetensors",
            tensors=len(fps[0][1]),
            bytes=1 << 20,
        )


def _logprob_checks(world: SimWorld, rollout: int, step: int, attempt: int, ids: list[int], mismatch: bool) -> None:
    """Rank 0 of each live cell compares its share of the rollout's samples (GRPO); with
    ``mismatch`` one token of the first cell's first sample differs."""
    width = 4  # response positions
    for j, cell in enumerate(world.alive):
        mine = ids[j :: len(world.alive)]
        if not mine:
            continue
        bad = mismatch and j == 0
        same = {"tokens": width, "differing": 0, "nonfinite": 0, "max_abs": 0.0, "mean_abs": 0.0, "k3": 0.0}
        off = {**same, "differing": 1, "max_abs": 0.5, "mean_abs": 0.125, "k3": 0.01}
        samples = [off if bad and i == 0 else same for i in range(len(mine))]
        positions = [{**same, "tokens": len(mine)} for _ in range(width)]
        if bad:
            positions[2] = {**off, "tokens": len(mine), "mean_abs": 0.5 / len(mine)}
        total = {
            **same,
            "tokens": width * len(mine),
            **({"differing": 1, "max_abs": 0.5, "mean_abs": 0.5 / (width * len(mine))} if bad else {}),
        }
        emit.logprob_check(
            world.rank_writers[(cell, 0)],
            rollout=rollout,
            step=step,
            attempt=attempt,
            cell=cell,
            rank=0,
            version=rollout,
            witness_ids=mine,
            samples=samples,
            positions=positions,
            total=total,
        )


def assign(m: int, alive: list[int]) -> dict[int, list[int]]:
    """Contiguous micro-shard ranges per alive cell (a deterministic function of the alive set)."""
    out, start = {}, 0
    for i, cell in enumerate(alive):
        n = m // len(alive) + (1 if i < m % len(alive) else 0)
        out[cell] = list(range(start, start + n))
        start += n
    return out
