"""Cells on Ray: one placement group per cell, one ``RankWorker`` actor per rank.

A cell of ``tp * pp`` ranks reserves one bundle per rank in its own placement group
(``PACK``: on one node where it fits, spread over nodes where it must; nothing assumes one
host, the ranks find each other through the driver's TCPStore). Each rank is a
``ray.remote(RankWorker)`` actor scheduled into its bundle. Ranks and engines ask for
``CPU_PER_ACTOR`` logical CPUs (fractional: Ray's CPUs are bookkeeping, the thread count of
a rank is ``threads_per_rank``), plus one GPU each on CUDA.

``check_resources`` refuses a layout the cluster cannot hold (``ConfigError``, exit 2)
before anything is started; ``start_cells`` creates the placement groups and actors and
waits until every group is placed; ``Cell.call`` runs a method on every rank of a cell and
returns the object refs in rank order.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ftkit.errors import ConfigError

#: Logical Ray CPUs per rank actor and per engine actor.
CPU_PER_ACTOR = 0.5
#: Seconds to wait for a placement group to be placed before giving up.
PLACEMENT_TIMEOUT_S = 120.0


def actor_resources(device: str) -> dict[str, float]:
    """The Ray resources of one rank or engine actor on ``device``."""
    return {"CPU": CPU_PER_ACTOR, **({"GPU": 1.0} if device == "cuda" else {})}


def check_resources(cells: int, ranks_per_cell: int, engines: int, device: str) -> None:
    """Raise ``ConfigError`` when the Ray cluster cannot hold the cells and the engines."""
    import ray

    have = ray.cluster_resources()
    actors = cells * ranks_per_cell + engines
    for name, each in actor_resources(device).items():
        need, avail = actors * each, float(have.get(name, 0.0))
        if need > avail + 1e-9:
            raise ConfigError(
                f"{cells} cell(s) of {ranks_per_cell} rank(s) and {engines} engine(s) need {need:g} {name} "
                f"of Ray resources, the cluster has {avail:g}",
                hint="use fewer --cells / --engines or a smaller --tp / --pp, or join a bigger cluster "
                "with --ray-address",
            )


@dataclass
class Cell:
    """The Ray side of one cell: its placement group and its rank actors (rank order)."""

    index: int
    incarnation: int
    placement_group: Any
    workers: list[Any]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method(*args, **kwargs)`` on every rank; the object refs in rank order."""
        return [getattr(w, method).remote(*args, **kwargs) for w in self.workers]

    def kill(self) -> None:
        """Kill the rank actors and release the placement group (idempotent)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            with contextlib.suppress(Exception):  # an actor or group already gone is fine
                ray.kill(w, no_restart=True)
        self.workers = []
        if self.placement_group is not None:
            with contextlib.suppress(Exception):  # an actor or group already gone is fine
                remove_placement_group(self.placement_group)
            self.placement_group = None


def start_cells(
    cfg: dict[str, Any], run_dir: str, indices: list[int], ranks_per_cell: int, device: str, incarnation: int = 0
) -> list[Cell]:
    """Create the placement groups and rank actors of the cells ``indices``.

    Waits up to ``PLACEMENT_TIMEOUT_S`` for the groups to be placed; on failure every group
    and actor created here is released and ``ConfigError`` is raised.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from ftkit.train.worker import RankWorker

    bundle = actor_resources(device)
    remote_worker = ray.remote(RankWorker)
    cells: list[Cell] = []
    try:
        groups = {c: placement_group([dict(bundle) for _ in range(ranks_per_cell)], strategy="PACK") for c in indices}
        for c, pg in groups.items():
            cells.append(Cell(c, incarnation, pg, []))
        try:
            ray.get([pg.ready() for pg in groups.values()], timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"Ray could not place {len(indices)} cell(s) of {ranks_per_cell} rank(s) within "
                f"{PLACEMENT_TIMEOUT_S:g}s",
                hint="check `ray status` for free resources",
            ) from None
        for cell in cells:
            cell.workers = [
                remote_worker.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=cell.placement_group, placement_group_bundle_index=rank
                    ),
                ).remote(cfg, run_dir, cell.index, rank, incarnation)
                for rank in range(ranks_per_cell)
            ]
    except BaseException:
        for cell in cells:
            cell.kill()
        raise
    return cells
