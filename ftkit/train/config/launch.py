"""The sections of a run's config that say how the run is launched, not what it computes
(``Place("free", pairs_dumps=False)``: a resumed session may change them): cells and the Ray
cluster, engines, deadlines and recovery, injected faults, dumps, checkpoints, the output
directory and experiment trackers. The sections that decide the result, and what a ``Place``
means, are ``ftkit.train.config.sections``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from ftkit.train.config.sections import DUMP_WHAT, DumpPart, Place, Section

Tracker = Literal["tensorboard", "wandb", "mlflow"]


class ClusterSection(Section):
    """How many cells, and on which Ray cluster."""

    PLACE = Place("free", pairs_dumps=False)
    cells: int = Field(2, ge=1, le=64, description="Independent model replicas (cells).")
    ray_address: str | None = Field(
        None,
        description="Join this Ray cluster (host:port of its head) instead of starting a local one; "
        "cells and engines are spread over its nodes (docs/clusters.md).",
    )


class EngineSection(Section):
    """How many inference engines run (their kind is ``generation.kind``) and on which GPUs."""

    PLACE = Place("free", pairs_dumps=False)
    count: int = Field(1, ge=1, le=16, alias="engines", description="Inference engine actors.")
    placement: Literal["colocate", "separate"] = Field(
        "colocate",
        alias="engine_placement",
        description="CUDA: colocate puts the engines on the ranks' GPUs (they alternate: generate, then train); "
        "separate gives each engine a GPU of its own (docs/clusters.md).",
    )


class RecoverySection(Section):
    """Deadlines (a collective, a step, a heal, a reward call) and what the run does about a failed cell."""

    PLACE = Place("free", pairs_dumps=False)
    collective_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a cross-cell collective waits for a peer before the step is discarded "
        "(a dead or hung cell).",
    )
    step_timeout: float = Field(
        60.0, gt=0, description="Seconds a step attempt may take before its unfinished cells are declared hung."
    )
    min_cells: int = Field(1, ge=1, description="Fewest live cells to go on with; below it the run fails (exit 1).")
    max_retries: int = Field(5, ge=0, description="Retries of one step after failed attempts; then the run fails.")
    heal: bool = Field(True, description="Restart failed cells and heal them from a live peer.")
    heal_timeout: float = Field(
        120.0, gt=0, description="Seconds a restarted cell may take to be placed and start before it is given up."
    )
    reward_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds one call of a reward plug-in may take; a call that has not returned by then is stopped "
        "and the run fails (exit 2) naming the plug-in and the sample.",
    )


class FaultsSection(Section):
    """Faults injected on purpose (never carried over to a resumed session)."""

    PLACE = Place("free", pairs_dumps=False)
    inject: tuple[str, ...] = Field(
        (),
        description="Faults to inject, one spec each: kind=...,point=...,cell=...,step=... (docs/fault-injection.md).",
    )
    chaos: str | None = Field(
        None, description="Random faults: mtbf=SECONDS,seed=N,max=K[,step_s=S] (docs/fault-injection.md)."
    )


class DumpsSection(Section):
    """Which rollouts are dumped, what the dumps hold, and by which cells."""

    PLACE = Place("free", pairs_dumps=False)
    rollouts: str = Field(
        "first,last",
        alias="dump_rollouts",
        description="Rollouts to dump: 'none', 'all', or a comma list of 'first', 'last' and rollout indices.",
    )
    what: tuple[DumpPart, ...] = Field(DUMP_WHAT, alias="dump_what", description="What dumps hold.")
    cells: Literal["first", "all"] = Field(
        "first", alias="dump_cells", description="Replicated state dumped by the first live cell, or by all cells."
    )

    @field_validator("rollouts")
    @classmethod
    def _check_rollouts(cls, v: str) -> str:
        v = v.strip().lower()
        if v in ("none", "all"):
            return v
        for part in v.split(","):
            part = part.strip()
            if part not in ("first", "last") and not (part.isdigit()):
                raise ValueError(f"{part!r} is not 'first', 'last' or a rollout index")
        return v


class CheckpointsSection(Section):
    """How often checkpoints are published and how many are kept."""

    PLACE = Place("free", pairs_dumps=False)
    every: int = Field(
        1,
        ge=0,
        alias="checkpoint_every",
        description="Publish a checkpoint every N rollouts (0: never; any --tp/--pp, stored in the TP=1/PP=1 "
        "layout; docs/checkpoints.md).",
    )
    keep_last: int = Field(2, ge=1, description="Checkpoints kept: the newest N ...")
    keep_best: int = Field(1, ge=0, description="... plus the best K by --best-metric (finite, untainted).")


class OutputSection(Section):
    """Where the run directory goes."""

    PLACE = Place("free", pairs_dumps=False)
    out: Path = Field(Path("runs/train"), description="Run directory to create.")
    overwrite: bool = Field(False, description="Replace an existing run directory.")
    report_to: tuple[Tracker, ...] = Field(
        (),
        description="Experiment trackers that also get the run's metrics and config: tensorboard, wandb, "
        "mlflow, or none; repeatable or comma-separated (docs/tracking.md). The event log stays the record.",
    )

    @field_validator("report_to")
    @classmethod
    def _unique_trackers(cls, v: tuple[Tracker, ...]) -> tuple[Tracker, ...]:
        return tuple(dict.fromkeys(v))
