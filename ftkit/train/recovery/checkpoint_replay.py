"""Offline dumps from a checkpoint: ``ftkit dump --from-checkpoint CKPT --rollout N --out DIR``.

``plan_replay(checkpoint, rollout, out, tp, pp)`` checks everything before any work and raises
``InputError`` / ``UsageError`` (exit 2) when the checkpoint does not exist or does not verify,
when it is not the one taken just before rollout ``N`` (it must hold the state after rollout
``N - 1``: its step is ``N * steps_per_rollout - 1``), when rollout ``N`` was not recorded
(``rollouts/rollout_N.safetensors`` of the run holding the checkpoint), or when ``--out``
exists and is not empty. ``replay(plan)`` then runs one cell of ``tp * pp`` ranks of the
trainer's own ``RankWorker`` in spawned processes (a gloo world on a loopback TCPStore, as the
driver builds a cell, no Ray): every rank loads its shard of the checkpoint's TP=1/PP=1 state
(``canonical_state.local_state``, then ``state_codec.restore``) and runs the rollout's steps on
the recorded batch, every micro-shard, with dumps on. It writes, under ``DIR``:

* ``dumps/actor/fwd_bwd/rollout_N/``: the standard layout, the same writers and tensor names as
  the live dump of that rollout (micro-shard captures, weights at the rollout's first step,
  reduced gradients), so ``compare-dumps --exact`` of the two rollout directories exits 0 in the
  same layout (and pairs, with the tolerance mode, across TP layouts);
* ``events/``: the replay's own event log (fingerprints, witness counts);
* ``replay.json``: what was replayed (checkpoint, manifest sha256, rollout, steps, layout).

Nothing is written back: the optimizer steps between the rollout's steps happen in the ranks'
memory only (the live run's later steps started from them, so the replay must too); the last
step's update is discarded with the processes. Fault injection and chaos of the recorded
config are off. On CUDA each rank gets its own GPU (exit 2 when there are fewer GPUs than
ranks).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.errors import InputError, UsageError

REPLAY_SCHEMA = "ftkit.checkpoint-replay/1"


@dataclass(frozen=True)
class ReplayPlan:
    """A replay that passed every check (``plan_replay``)."""

    checkpoint: Path
    rollout: int
    batch: Path  # rollouts/rollout_N.safetensors
    out: Path
    config: dict[str, Any]  # the replay's TrainConfig (json mode)
    manifest_sha256: str
    steps: list[int] = field(default_factory=list)


def plan_replay(checkpoint: Path, rollout: int, out: Path, tp: int | None = None, pp: int | None = None) -> ReplayPlan:
    """Check the inputs of a replay (see the module docstring); exit-2 errors before any work."""
    from ftkit.checkpoint.layout import MANIFEST, META
    from ftkit.checkpoint.verify import verify_path
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan

    ckpt = Path(checkpoint)
    if not (ckpt / MANIFEST).is_file():
        raise InputError(
            f"{ckpt}: no such checkpoint (no {MANIFEST})",
            "pass a published checkpoint directory, e.g. RUN/checkpoints/step_000007 (ls RUN/checkpoints)",
        )
    errors = [f for f in verify_path(ckpt, events=False).findings if f.severity.value == "error"]
    if errors:
        raise InputError(
            f"checkpoint {ckpt} does not verify: {errors[0].code} {errors[0].message}",
            f"run 'ftkit verify-checkpoint {ckpt}' for every finding",
        )
    meta = json.loads((ckpt / META).read_text())
    try:
        cfg = TrainConfig.model_validate(meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"{ckpt}/{META} holds no usable training config ({first})", "was it written by ftkit train?"
        ) from None
    spr = cfg.batch.steps_per_rollout
    if rollout < 1:
        raise UsageError(
            f"--rollout {rollout}: rollout {rollout} starts from the initial weights, no checkpoint is taken before it",
            "pass a rollout N >= 1 whose preceding rollout published a checkpoint",
        )
    want = rollout * spr - 1
    if meta.get("step") != want:
        raise UsageError(
            f"{ckpt.name} holds the state after step {meta.get('step')} (rollout {meta.get('rollout')}), not the "
            f"state rollout {rollout} starts from (step {want})",
            f"pass --rollout {int(meta.get('rollout', -1)) + 1}, or the checkpoint step_{want:06d} taken just before "
            f"rollout {rollout}",
        )
    run = ckpt.resolve().parent.parent
    batch = run / "rollouts" / f"rollout_{rollout:06d}.safetensors"
    if not batch.is_file():
        raise InputError(
            f"rollout {rollout} was not recorded in {run} (no rollouts/{batch.name})",
            "the checkpoint must lie in its run directory (RUN/checkpoints/step_N), next to RUN/rollouts/",
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory", "choose a new directory")
    overrides = {
        "cells": 1,
        "tp": tp or cfg.layout.tp,
        "pp": pp or cfg.layout.pp,
        "out": str(out),
        "inject": (),
        "chaos": None,
    }
    replay_cfg = TrainConfig.model_validate({**cfg.model_dump(mode="json"), **overrides, "checkpoint_every": 0})
    device = build_plan(replay_cfg).device  # the recorded model must still be the run's (exit 2)
    if device == "cuda":
        import torch

        world, gpus = replay_cfg.layout.ranks, torch.cuda.device_count()
        if gpus < world:  # NCCL needs one GPU per rank
            raise UsageError(
                f"a replay of {world} rank(s) on CUDA needs {world} GPUs, this machine has {gpus}",
                "pass a smaller --tp / --pp",
            )
    replay_cfg = TrainConfig.model_validate({**replay_cfg.model_dump(mode="json"), "device": device})
    sha = hashlib.sha256((ckpt / MANIFEST).read_bytes()).hexdigest()
    steps = list(range(rollout * spr, (rollout + 1) * spr))
    return ReplayPlan(ckpt, rollout, batch, out, replay_cfg.model_dump(mode="json"), sha, steps)


def replay(plan: ReplayPlan) -> dict[str, Any]:
    """Run the replay (see the module docstring); returns what ``replay.json`` holds."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    world = plan.config["tp"] * plan.config["pp"]
    plan.out.mkdir(parents=True, exist_ok=True)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.start_processes(_rank, args=(plan, store.port), nprocs=world, start_method="spawn", join=True)
    dumps = plan.out / "dumps" / "actor" / "fwd_bwd" / f"rollout_{plan.rollout:06d}"
    doc = {
        "schema": REPLAY_SCHEMA,
        "checkpoint": str(plan.checkpoint),
        "manifest_sha256": plan.manifest_sha256,
        "rollout": plan.rollout,
        "steps": plan.steps,
        "batch": str(plan.batch),
        "layout": {"tp": plan.config["tp"], "pp": plan.config["pp"]},
        "dumps": str(dumps),
        "files": sorted(p.name for p in dumps.glob("*.safetensors")),
    }
    (plan.out / "replay.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _rank(rank: int, plan: ReplayPlan, port: int) -> None:
    """One rank of the replay cell (a spawned process; its stdout goes to stderr: the command's
    stdout carries data only)."""
    import os
    import sys
    import warnings

    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if plan.config["device"] == "cuda":  # one GPU per rank (RankWorker uses device 0), as Ray gives each
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[rank] if visible else str(rank)
    warnings.filterwarnings("ignore", category=UserWarning)  # megatron's import-time notices
    import torch
    from safetensors.torch import load_file

    from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER
    from ftkit.checkpoint.restore import read_groups
    from ftkit.model.stages import stage_position
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.canonical_state import local_state
    from ftkit.train.rank.state_codec import RankState, restore
    from ftkit.train.rank.step_types import StepTask
    from ftkit.train.rank.worker import RankWorker

    w = RankWorker(build_plan(TrainConfig.model_validate(plan.config)), str(plan.out), 0, rank, 0)
    w.init_cell("127.0.0.1", port)
    try:
        w.configure(0, [0])
        groups = read_groups(plan.checkpoint)  # verified by plan_replay; shards merged
        model, optim, extra = groups[MODEL], groups[OPTIMIZER], groups[EXTRA]
        params, entries = local_state(
            model, optim, w.ctx.params, w.ctx.tp_rank, w.cfg.layout.tp, stage_position(w.ctx.model)[0]
        )
        rng = torch.default_generator.get_state()  # every micro-shard reseeds it
        witness = None if w.ctx.witness is None else w.ctx.witness.param
        restore(RankState(params, entries, extra.get("witness"), rng), w.ctx.params, w.ctx.optimizer, witness)
        w.ctx.recast()  # bf16: the weights from the restored masters
        step, done = (int(x) for x in extra["counters"].tolist())
        w.counters = {"step": step, "rollout": done}
        batch = load_file(plan.batch)
        shards = tuple(range(w.cfg.batch.micro_shards))
        for s in plan.steps:
            task = StepTask(plan.rollout, s, 0, 0, shards, dump=True, dump_replicated=True)
            if not w.compute_reduce(task, batch).finite:
                raise RuntimeError(f"step {s} of the replay is not finite (the live run discarded it?)")
            w.commit(s, 0, write_dumps=True)
    finally:
        w.shutdown()
