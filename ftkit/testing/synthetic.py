"""Synthetic run logs: realistic, clean by construction, deterministic for a seed.

``generate(out_dir, SyntheticSpec(...))`` simulates what ``ftkit train`` logs: a driver (run,
cell states, reconfigures, witness allocation, weights sent, metrics, checkpoints, faults and
heals), ``cells x tp x pp`` rank processes (step outcomes, state fingerprints of ``tensors``
tensors split across pipeline stages, witness counts, dumps) and
engines (the weights they loaded). Each process writes its own file with ``EventWriter`` under
``out_dir/events/`` on a simulated clock, so the files merge by time exactly as real ones do;
valid events go through the typed emitters (``ftkit.evidence.emit``), as ``ftkit train``'s do.

Faults kill one rank of a live cell in the middle of a step: its files end, the other cells
fail the attempt, the driver marks the cell errored and reconfigures, the step is retried with
the survivors and commits; ``heal_after`` steps later the cell is restarted (a new incarnation),
healed from a donor and rejoins. Every sample is counted exactly once per rollout.

``violation="FT1xx"`` injects exactly one violation of that rule (used by the property tests);
``VIOLATIONS`` lists them. The parts: the spec (``ftkit.testing.synthetic_spec``), the simulated
world (``synthetic_world``), faults and heals (``synthetic_faults``), a committed step
(``synthetic_steps``); this module runs them. Module CLI::

    python -m ftkit.testing.synthetic OUT_DIR [--cells N --rollouts R --faults F --seed S ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ftkit.evidence import emit
from ftkit.tensors.fingerprint import combine
from ftkit.testing.synthetic_faults import heal_due, kill
from ftkit.testing.synthetic_spec import VIOLATIONS, GeneratedRun, SyntheticSpec
from ftkit.testing.synthetic_steps import commit
from ftkit.testing.synthetic_world import SimWorld, canary, digest
from ftkit.version import __version__


def generate(out_dir: str | Path, spec: SyntheticSpec | None = None) -> GeneratedRun:
    """Write a synthetic run's logs to ``out_dir/events/``; ValueError when ``spec.violation``
    cannot be injected into the layout (one cell for FT101/FT106; no room to heal for FT107; no
    rollout's first step left for FT114)."""
    spec = spec or SyntheticSpec()
    world = SimWorld(Path(out_dir), spec)
    n = _run(world)
    unplaced = spec.violation in ("FT101", "FT106", "FT114") and world.violation_left
    if (spec.violation == "FT107" and not world.healed) or unplaced:
        raise ValueError(
            f"cannot inject {spec.violation} into this layout: it needs two live cells "
            f"(FT107: a fault healed before the last step; FT114: a rollout's first step after the faults)"
        )
    return GeneratedRun(
        world.dir, n, world.injected_faults, world.violation_step if world.violation_left is None else None
    )


def _run(world: SimWorld) -> int:
    """Write every file of the run; the event count."""
    spec, d = world.spec, world.driver
    emit.run_started(
        d,
        config={
            "seed": spec.seed,
            "synthetic": True,
            "micro_shards": spec.micro_shards,
            "loss": "grpo" if world.grpo else spec.loss,
            "samples_per_rollout": spec.samples_per_rollout,
            "steps_per_rollout": spec.steps_per_rollout,
        },
        num_cells=spec.cells,
        tp=spec.tp,
        pp=spec.pp,
        num_engines=spec.engines,
        ftkit_version=__version__,
    )
    for cell in range(spec.cells):
        world.cell_state(cell, "pending", "starting", "launch")
        world.start_cell(cell)
        world.cell_state(cell, "starting", "alive", "ready")
    emit.reconfigure(d, epoch=0, alive_before=[], alive_after=world.alive, reason="start")
    last_ckpt = -1
    for rollout in range(spec.rollouts):
        ids = [rollout * spec.samples_per_rollout + i for i in range(spec.samples_per_rollout)]
        emit.witness_allocated(d, rollout=rollout, attempt=0, ids=ids, expected=1)
        _weights(world, rollout)
        per_step = spec.samples_per_rollout // spec.steps_per_rollout
        for k in range(spec.steps_per_rollout):
            step = rollout * spec.steps_per_rollout + k
            heal_due(world, step)
            attempt = kill(world, rollout, step)
            commit(world, rollout, step, attempt, ids[k * per_step : (k + 1) * per_step])
            if ((step + 1) % spec.checkpoint_every == 0 and step != spec.steps - 1) or (
                spec.violation == "FT110" and step == world.violation_step
            ):
                _checkpoint(world, step, last_ckpt + 1)
                last_ckpt = step
    for cell in world.alive:
        world.cell_state(cell, "alive", "stopped", "run end")
    status: emit.RunStatus = "failed" if spec.violation == "FT113" else "completed"
    emit.run_finished(d, status=status, reason="injected" if status == "failed" else None)
    for w in [*world.rank_writers.values(), *world.engine_writers, d]:
        w.close()
    return world.events


def _weights(world: SimWorld, rollout: int) -> None:
    """The driver sends the rollout's weights; each engine logs what it loaded (``FT102``: the
    first engine a stale tensor in the last rollout) and, at pp=1, its canary scores."""
    spec = world.spec
    if rollout and spec.tp == spec.pp == 1:  # the committed state after the previous rollout (FT102 checks)
        params = dict(world.fingerprints(rollout * spec.steps_per_rollout - 1)[0][1])
    else:
        params = {n: digest("w", spec.seed, rollout, n) for names in world.stage_names for n in names}
    total = combine(params)
    emit.weights_sent(world.driver, rollout=rollout, version=rollout, total=total, params=params)
    for e, w in enumerate(world.engine_writers):
        got, loaded = total, params
        if spec.violation == "FT102" and rollout == spec.rollouts - 1 and e == 0:
            loaded = dict(params)
            first = next(iter(loaded))
            loaded[first] = digest("stale", first)
            got = combine(loaded)
        emit.engine_weights(w, rollout=rollout, version=rollout, engine=e, total=got, params=loaded)
        if spec.pp == 1:  # ftkit train scores the canary set at pp=1 only
            emit.canary_logprobs(w, rollout=rollout, version=rollout, engine=e, **canary(rollout))


def _checkpoint(world: SimWorld, step: int, first: int) -> None:
    """The driver publishes a checkpoint guarding steps ``first``..``step``."""
    # Raw: ``checkpoint_published`` is the publisher's own event (``ftkit.checkpoint.publish``,
    # through its ``on_event``), which has no typed emitter.
    world.driver.emit(
        "checkpoint_published",
        step=step,
        path=f"checkpoints/step_{step:06d}",
        kind="latest",
        metric=round(1.0 / (1 + step), 6),
        manifest_sha256=digest("manifest", step) * 2,
        guard_from_step=first,
        guard_to_step=step,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ftkit.testing.synthetic", description="Write a synthetic, clean run log to OUT_DIR/events/."
    )
    p.add_argument("out_dir", metavar="OUT_DIR")
    defaults = SyntheticSpec()
    for name in (
        "cells",
        "tp",
        "pp",
        "engines",
        "rollouts",
        "steps_per_rollout",
        "samples_per_rollout",
        "micro_shards",
        "tensors",
        "faults",
        "heal_after",
        "checkpoint_every",
        "seed",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    p.add_argument("--run", default=defaults.run)
    p.add_argument("--loss", choices=("reinforce", "grpo"), default=defaults.loss)
    p.add_argument("--violation", choices=VIOLATIONS, help="inject exactly one violation of this rule")
    args = vars(p.parse_args(argv))
    out = Path(args.pop("out_dir"))
    if (out / "events").exists() and any((out / "events").iterdir()):
        p.error(f"{out / 'events'} is not empty")
    run = generate(out, SyntheticSpec(**args))
    print(f"wrote {run.events} events to {run.events_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
