"""Cells on Ray: one placement group per cell, one ``RankWorker`` actor per rank.

A cell of ``tp * pp`` ranks reserves one bundle per rank in its own placement group
(``PACK``: on one node where it fits, spread over nodes where it must; nothing assumes one
host, the ranks find each other through the driver's TCPStore). A cell with a target node
(``ftkit.train.control.placement``) is ``STRICT_PACK`` with that node as Ray's soft target: one node,
the target when it has room. Each rank is a
``ray.remote(RankWorker)`` actor scheduled into its bundle. Ranks and engines ask for
``CPU_PER_ACTOR`` logical CPUs (fractional: Ray's CPUs are bookkeeping, the thread count of
a rank is ``threads_per_rank``), plus one GPU each on CUDA.

``check_resources`` refuses a layout the cluster cannot hold (``ConfigError``, exit 2)
before anything is started; ``start_cells`` creates the placement groups and actors and
waits until every group is placed (``spawn_cell`` starts one without waiting: a restart);
``Cell``'s typed methods run the rank method of the same name on every rank of a cell and
return the object refs in rank order.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftkit.errors import ConfigError
from ftkit.train.rank.step_types import StepTask

if TYPE_CHECKING:
    from ftkit.train.plan.run_plan import RunPlan

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
    """The Ray side of one cell: its placement group and its rank actors (rank order).

    Each method starts the ``RankWorker`` method of the same name on every rank and returns
    the object refs in rank order (the driver waits on them with deadlines).
    """

    index: int
    incarnation: int
    placement_group: Any
    workers: list[Any]

    def init(self, host: str, port: int) -> list[Any]:
        """``init_cell``: each ref resolves to the rank's pid."""
        return [w.init_cell.remote(host, port) for w in self.workers]

    def configure(self, epoch: int, alive: list[int]) -> list[Any]:
        return [w.configure.remote(epoch, alive) for w in self.workers]

    def compute_reduce(self, task: StepTask, batch: Any) -> list[Any]:
        return [w.compute_reduce.remote(task, batch) for w in self.workers]

    def commit(self, step: int, attempt: int, write_dumps: bool) -> list[Any]:
        return [w.commit.remote(step, attempt, write_dumps) for w in self.workers]

    def discard(self, step: int, attempt: int) -> list[Any]:
        return [w.discard.remote(step, attempt) for w in self.workers]

    def checkpoint_preflight(self, step: int, checkpoints_dir: str) -> list[Any]:
        return [w.checkpoint_preflight.remote(step, checkpoints_dir) for w in self.workers]

    def checkpoint_state(self) -> list[Any]:
        """The cell's state for a checkpoint: collective, every rank; rank 0's ref holds it."""
        return [w.checkpoint_state.remote() for w in self.workers]

    def restore_checkpoint(self, files: Any, meta: dict[str, Any]) -> list[Any]:
        """Every rank loads the checkpoint ``files`` (an object ref, passed unresolved)."""
        return [w.restore_checkpoint.remote(files, meta) for w in self.workers]

    def serve_state(self, keys: list[str]) -> list[Any]:
        """Heal donor: rank ``r`` serves its state under ``keys[r]``."""
        return [w.serve_state.remote(k) for w, k in zip(self.workers, keys)]

    def load_state(self, keys: list[str], donor: int, epoch: int, step: int, attempt: int) -> list[Any]:
        """Heal recipient: rank ``r`` receives the state served under ``keys[r]``."""
        return [w.load_state.remote(k, donor, epoch, step, attempt) for w, k in zip(self.workers, keys)]

    def export_weights(self, version: int) -> list[Any]:
        return [w.export_weights.remote(version) for w in self.workers]

    def save_final(self, run_dir: str) -> list[Any]:
        return [w.save_final.remote(run_dir) for w in self.workers]

    def shutdown(self) -> list[Any]:
        return [w.shutdown.remote() for w in self.workers]

    def dead(self) -> str | None:
        """Why Ray reports a rank of this cell dead (its actor table), or None: the death
        notification ``RefWaiter`` polls while it waits (``ftkit.train.control.waiting``)."""
        from ftkit.train.control.waiting import ray_actor_dead

        for rank, worker in enumerate(self.workers):
            cause = ray_actor_dead(worker)
            if cause is not None:
                return cause if rank == 0 else f"rank {rank}: {cause}"
        return None

    def kill(self, release_group: bool = True) -> None:
        """Kill the rank actors and release the placement group (idempotent); ``release_group``
        false leaves the group to Ray (releasing it waits on the GCS, which may be gone)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            with contextlib.suppress(Exception):  # an actor or group already gone is fine
                ray.kill(w, no_restart=True)
        self.workers = []
        if self.placement_group is not None and release_group:
            with contextlib.suppress(Exception):  # an actor or group already gone is fine
                remove_placement_group(self.placement_group)
            self.placement_group = None


def spawn_cell(
    plan: RunPlan,
    run_dir: str,
    index: int,
    ranks_per_cell: int,
    device: str,
    incarnation: int,
    target: str | None = None,
) -> Cell:
    """Create one cell's placement group and rank actors without waiting for either (a
    restarted cell: the actors start once the group is placed; ``init`` refs tell when).
    ``target``: the node id the group asks for (soft), ``None`` for none."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from ftkit.train.rank.worker import RankWorker

    bundle = actor_resources(device)
    remote_worker = ray.remote(max_restarts=0)(RankWorker)
    bundles = [dict(bundle) for _ in range(ranks_per_cell)]
    if target is None:
        group = placement_group(bundles, strategy="PACK")
    else:
        group = placement_group(bundles, strategy="STRICT_PACK", _soft_target_node_id=target)
    cell = Cell(index, incarnation, group, [])
    cell.workers = [
        remote_worker.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=cell.placement_group, placement_group_bundle_index=rank
            ),
        ).remote(plan, run_dir, index, rank, incarnation)
        for rank in range(ranks_per_cell)
    ]
    return cell


def start_cells(
    plan: RunPlan,
    run_dir: str,
    indices: list[int],
    ranks_per_cell: int,
    device: str,
    incarnation: int = 0,
    targets: dict[int, str | None] | None = None,
) -> list[Cell]:
    """Create the placement groups and rank actors of the cells ``indices``, each asking for
    its node in ``targets`` (``spawn_cell``).

    Waits up to ``PLACEMENT_TIMEOUT_S`` for the groups to be placed; on failure every group
    and actor created here is released and ``ConfigError`` is raised.
    """
    import ray

    cells: list[Cell] = []
    try:
        for c in indices:
            cells.append(spawn_cell(plan, run_dir, c, ranks_per_cell, device, incarnation, (targets or {}).get(c)))
        try:
            ray.get([cell.placement_group.ready() for cell in cells], timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"Ray could not place {len(indices)} cell(s) of {ranks_per_cell} rank(s) within "
                f"{PLACEMENT_TIMEOUT_S:g}s",
                hint="check `ray status` for free resources",
            ) from None
    except BaseException:
        for cell in cells:
            cell.kill()
        raise
    return cells
