"""Where a run's ranks and engines compute: GPU shares, devices, the cross-cell backend.

``plan_placement(cells, tp, pp, engines, device, gpus, mode)`` is a pure function of the run's
layout and the GPUs of the Ray cluster (``gpus``: one count per node, the driver reads them from
Ray); the driver calls it once Ray is connected and puts the result in the ``RunPlan``
(``RunPlan.placement``), which the rank workers and the engine actors read. It decides:

* **GPU shares** (Ray's fractional ``GPU`` resource per rank and per engine actor, multiples of
  ``1 / GRAIN``: Ray's granularity). On CPU both are 0.
* **Engines**: ``colocate`` (the default; TRL, verl and miles do the same) puts the engines on
  the ranks' GPUs: they alternate with training (generate, then train), so sharing costs memory,
  not time. ``separate`` gives each engine a whole GPU of its own (dedicated inference GPUs),
  the ranks use the others.
* **Ranks first**: with at least as many rank GPUs as ranks, each rank has a GPU to itself: a
  rank's share is above one half, so Ray never puts two ranks on one GPU and sets each actor's
  visible device itself (``rank_device`` None). With fewer, **cells share GPUs** (the default 2
  cells on one GPU): every actor is given an explicit device index on its node
  (``rank_device`` / ``engine_device``: the ranks of one cell on distinct GPUs, cells round
  robin), Ray's visible-device setting is switched off for them (``NOSET_ENV``) and its GPU
  shares are only bookkeeping.
* **The cross-cell backend** (``link``): ``gloo`` on CPU; ``nccl`` on CUDA when no two cells
  share a GPU; ``gloo-host`` when they do: NCCL refuses two ranks of one communicator on one
  device ("Duplicate GPU detected"), so every cross-cell group then runs over gloo through
  pinned host buffers (``ftkit.train.rank.crosscell``). The exact reduction is an int64 sum, so
  the result is the same bits over either backend. One backend for all cells: a group's members
  must agree on it.
* **Refusals**: TP / PP groups stay NCCL and need ``tp * pp`` distinct GPUs on one node; a
  layout that cannot be placed is a ``ConfigError`` (exit 2) whose line says what would fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ftkit.errors import ConfigError

EnginePlacement = Literal["colocate", "separate"]
LinkBackend = Literal["gloo", "nccl", "gloo-host"]

#: Ray's GPU shares are fixed point with this many parts per GPU.
GRAIN = 10_000
#: A rank's share when it has a GPU to itself: above one half, so no two ranks share one.
RANK_ALONE = 0.6
#: Ray leaves ``CUDA_VISIBLE_DEVICES`` alone for an actor with this set (cells sharing GPUs).
NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def _share(x: float) -> float:
    """``x`` rounded down to Ray's granularity (a sum of shares never exceeds a GPU)."""
    return math.floor(x * GRAIN + 1e-9) / GRAIN


@dataclass(frozen=True)
class Placement:
    """Where ranks and engines compute (see the module docstring)."""

    device: str
    rank_gpu: float = 0.0  # Ray GPU share of one rank actor
    engine_gpu: float = 0.0  # Ray GPU share of one engine actor
    link: LinkBackend = "gloo"
    shared: bool = False  # cells share GPUs: explicit device indices, link over gloo-host
    ranks_per_cell: int = 1
    rank_slots: int = 0  # shared: the device indices ranks take on a node, 0 .. rank_slots - 1
    engine_slots: tuple[int, ...] = ()  # shared: the device indices engines take, round robin
    cpu: float = 0.5  # Ray CPUs of every actor (bookkeeping: a rank's threads are configured)

    def rank_resources(self) -> dict[str, float]:
        """The Ray resources of one rank actor (its placement-group bundle)."""
        return {"CPU": self.cpu, **({"GPU": self.rank_gpu} if self.rank_gpu else {})}

    def engine_resources(self) -> dict[str, float]:
        """The Ray resources of one engine actor."""
        return {"CPU": self.cpu, **({"GPU": self.engine_gpu} if self.engine_gpu else {})}

    def rank_device(self, cell: int, rank: int) -> int | None:
        """The CUDA device index of ``(cell, rank)`` on its node; None: the one Ray made visible.
        Shared: a cell's ranks on distinct devices, the cells round robin."""
        if not self.shared:
            return None
        return (cell * self.ranks_per_cell + rank) % self.rank_slots

    def engine_device(self, engine: int) -> int | None:
        """The CUDA device index of ``engine`` on its node; None: the one Ray made visible."""
        return self.engine_slots[engine % len(self.engine_slots)] if self.shared else None

    def runtime_env(self) -> dict[str, object] | None:
        """The Ray ``runtime_env`` of every actor: Ray's visible-device setting off when shared."""
        return {"env_vars": {NOSET_ENV: "1"}} if self.shared else None

    def describe(self) -> str:
        """One line: the GPU shares, sharing and the cross-cell backend."""
        if self.device != "cuda":
            return "cpu: cross-cell link over gloo"
        how = "cells share GPUs" if self.shared else "one GPU per rank"
        return f"cuda: {how}, rank {self.rank_gpu:g} GPU, engine {self.engine_gpu:g} GPU, cross-cell link {self.link}"


def plan_placement(
    cells: int, tp: int, pp: int, engines: int, device: str, gpus: Sequence[int], mode: EnginePlacement = "colocate"
) -> Placement:
    """The ``Placement`` of ``cells`` cells of ``tp x pp`` ranks and ``engines`` engines on nodes
    with ``gpus`` GPUs each (module docstring); ``ConfigError`` when it cannot be placed."""
    ranks = tp * pp
    if device != "cuda":
        return Placement(device, ranks_per_cell=ranks)
    total = sum(gpus)
    rank_gpus = total - engines if mode == "separate" else total
    if ranks > rank_gpus:
        raise _refused(tp, pp, engines, mode, rank_gpus, "the cluster")
    if cells * ranks <= rank_gpus:  # every rank has a GPU of its own; Ray picks it
        if mode == "separate":
            return Placement(device, 1.0, 1.0, "nccl", False, ranks)
        engine_gpu = _share((1.0 - RANK_ALONE) / math.ceil(engines / total))
        return Placement(device, RANK_ALONE, engine_gpu, "nccl", False, ranks)
    # cells share GPUs: explicit device indices on a node, a cell on one node
    node = min(g for g in gpus if g > 0)
    slots = node - engines if mode == "separate" else node
    if ranks > slots:
        raise _refused(tp, pp, engines, mode, slots, "a node")
    per_gpu = math.ceil(cells * ranks / rank_gpus)  # ranks sharing one GPU
    if mode == "separate":
        rank_gpu, engine_gpu, engine_slots = _share(1.0 / per_gpu), 1.0, tuple(range(slots, node))
    else:
        rank_gpu = engine_gpu = _share(1.0 / (per_gpu + math.ceil(engines / total)))
        engine_slots = tuple(range(node))
    return Placement(device, rank_gpu, engine_gpu, "gloo-host", True, ranks, slots, engine_slots)


def _refused(tp: int, pp: int, engines: int, mode: EnginePlacement, have: int, where: str) -> ConfigError:
    """The one-line refusal of a cell that needs more distinct GPUs than ``have`` and what fits."""
    ranks = tp * pp
    what = f"{max(have, 0)} GPU(s) for ranks" + (f" besides {engines} engine GPU(s)" if mode == "separate" else "")
    if have >= 1:
        hint = f"use tp x pp at most {have} (e.g. --tp {have} --pp 1); any number of --cells then shares the GPUs"
    elif mode == "separate":
        hint = "use --engine-placement colocate (engines share the ranks' GPUs) or fewer --engines"
    else:
        hint = "the cluster has no GPU: use --device cpu, or join a cluster with GPUs (--ray-address)"
    return ConfigError(
        f"a cell of tp {tp} x pp {pp} needs {ranks} distinct GPUs (NCCL cannot put two ranks of a group on "
        f"one GPU); {where} has {what}",
        hint=hint,
    )
