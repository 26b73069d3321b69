"""The faults and heals of a synthetic run, as ``ftkit train`` logs them.

``kill(world, rollout, step)``: a fault kills rank 0 of the last live cell in the middle of
``step``; its processes' files end there, unclosed; the other cells log the attempt failed; the
driver marks the cell errored and reconfigures without it; the step is then retried
(attempt 1) by the survivors. ``heal_due(world, step)``: a cell killed ``heal_after`` steps
before ``step`` is restarted (new writers: a new incarnation), healed from the first live cell
(``FT107``: with a corrupt transfer) and rejoins in a new epoch.
"""

from __future__ import annotations

from ftkit.evidence import emit
from ftkit.testing.synthetic_world import SimWorld, die, digest


def kill(world: SimWorld, rollout: int, step: int) -> int:
    """Kill a cell in ``step`` when a fault is due there and another cell survives it; the
    attempt the step then commits at (1 after a fault, else 0)."""
    if step not in world.fault_steps or len(world.alive) <= 1:
        return 0
    victim = world.alive[-1]
    world.injected_faults.append(step)
    # Raw, not ``emit.fault_injected``: this log has always left out ``attempt`` and ``engine``
    # (both optional), which the emitter writes as null; the generated logs stay byte for byte.
    world.driver.emit("fault_injected", kind="kill", point="backward", cell=victim, rank=0, rollout=rollout, step=step)
    for rank in range(world.ranks):  # the victim's processes die: their files end here, unclosed
        die(world.rank_writers.pop((victim, rank)))
    for cell in world.alive:
        if cell != victim:
            for rank in range(world.ranks):
                emit.step_outcome(
                    world.rank_writers[(cell, rank)],
                    rollout=rollout,
                    step=step,
                    attempt=0,
                    epoch=world.epoch,
                    cell=cell,
                    rank=rank,
                    outcome="failed",
                    micro_shards=[],
                )
    world.cell_state(victim, "alive", "errored", "rank died")
    world.reconfigure([c for c in world.alive if c != victim], f"cell {victim} died")
    world.dead[victim] = min(step + 1 + world.spec.heal_after, world.spec.steps)
    return 1


def heal_due(world: SimWorld, step: int) -> None:
    """Restart, heal and readmit every dead cell whose heal is due at ``step``."""
    for cell, at in sorted(world.dead.items()):
        if at != step:
            continue
        del world.dead[cell]
        world.cell_state(cell, "errored", "starting", "restart")
        world.start_cell(cell)
        donor = world.alive[0]
        total = digest(world.fingerprints(step - 1)[0][0], "state")
        received = digest("corrupt") if world.spec.violation == "FT107" else total
        world.healed += 1
        emit.heal(
            world.driver,
            cell=cell,
            donor=donor,
            epoch=world.epoch + 1,
            bytes=123_456_789,
            seconds={"transfer": 0.8, "verify": 0.05},
            total=received,
            donor_total=total,
        )
        world.cell_state(cell, "starting", "alive", "healed")
        world.reconfigure(world.alive + [cell], f"cell {cell} healed")
