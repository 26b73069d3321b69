"""Cells on Ray: one placement group per cell, one ``RankWorker`` actor per rank.

A cell of ``tp * pp`` ranks reserves one bundle per rank in its own placement group
(``PACK``: on one node where it fits, spread over nodes where it must; nothing assumes one
host, the ranks find each other through the driver's TCPStore; ``STRICT_PACK`` when cells share
GPUs: explicit device indices are a node's). A cell with a target node
(``ftkit.train.control.placement``) is ``STRICT_PACK`` with that node as Ray's soft target: one node,
the target when it has room. Each rank is a
``ray.remote(RankWorker)`` actor scheduled into its bundle. Ranks and engines ask for the
resources of the run's ``Placement`` (``ftkit.train.plan.placement``: fractional logical CPUs,
since Ray's CPUs are bookkeeping and the thread count of a rank is ``threads_per_rank``, plus a
GPU share each on CUDA: ``placement_for`` plans it from the cluster's GPUs, ``actor_options``
turns it into an actor's Ray options).

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
    from ftkit.engines.protocol import WeightsFormat
    from ftkit.train.plan.placement import Placement
    from ftkit.train.plan.run_plan import RunPlan

#: Seconds to wait for a placement group to be placed before giving up.
PLACEMENT_TIMEOUT_S = 120.0


def cluster_gpus() -> list[int]:
    """The GPUs of each alive node of the connected Ray cluster (Ray's order; whole GPUs)."""
    import ray

    return [int(float((n.get("Resources") or {}).get("GPU", 0.0))) for n in ray.nodes() if n.get("Alive")]


def placement_for(plan: RunPlan) -> Placement:
    """The run's ``Placement`` on the connected cluster (``ftkit.train.plan.placement``):
    ``ConfigError`` (exit 2) for a layout its GPUs cannot hold."""
    from ftkit.train.plan.placement import plan_placement

    cfg = plan.config
    gpus = cluster_gpus() if plan.device == "cuda" else []
    return plan_placement(
        cfg.cluster.cells, cfg.layout.tp, cfg.layout.pp, cfg.engine.count, plan.device, gpus, cfg.engine.placement
    )


def check_resources(placement: Placement, cells: int, engines: int) -> None:
    """Raise ``ConfigError`` when the Ray cluster cannot hold the cells and the engines."""
    import ray

    have = ray.cluster_resources()
    ranks = placement.ranks_per_cell
    need: dict[str, float] = {}
    for res, n in ((placement.rank_resources(), cells * ranks), (placement.engine_resources(), engines)):
        for name, each in res.items():
            need[name] = need.get(name, 0.0) + n * each
    for name, total in need.items():
        avail = float(have.get(name, 0.0))
        if total > avail + 1e-9:
            raise ConfigError(
                f"{cells} cell(s) of {ranks} rank(s) and {engines} engine(s) need {total:g} {name} "
                f"of Ray resources, the cluster has {avail:g}",
                hint="use fewer --cells / --engines or a smaller --tp / --pp, or join a bigger cluster "
                "with --ray-address",
            )


def actor_options(resources: dict[str, float], placement: Placement) -> dict[str, Any]:
    """The Ray options of a rank or engine actor with ``resources`` under ``placement``."""
    options: dict[str, Any] = {"num_cpus": resources["CPU"], "num_gpus": resources.get("GPU", 0)}
    env = placement.runtime_env()
    if env is not None:
        options["runtime_env"] = env
    return options


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

    def write_checkpoint(self, stage: str, step: int, meta: dict[str, Any], shard_bytes: int) -> list[Any]:
        """Write the cell's checkpoint state into ``stage``: collective, every rank; rank 0's ref
        holds the ``Staged`` record (or a ``WriteFailure``)."""
        return [w.write_checkpoint.remote(stage, step, meta, shard_bytes) for w in self.workers]

    def restore_checkpoint(self, files: Any, meta: dict[str, Any]) -> list[Any]:
        """Every rank loads the checkpoint ``files`` (an object ref, passed unresolved)."""
        return [w.restore_checkpoint.remote(files, meta) for w in self.workers]

    def serve_state(self, keys: list[str]) -> list[Any]:
        """Heal donor: rank ``r`` serves its state under ``keys[r]``."""
        return [w.serve_state.remote(k) for w, k in zip(self.workers, keys)]

    def load_state(self, keys: list[str], donor: int, epoch: int, step: int, attempt: int) -> list[Any]:
        """Heal recipient: rank ``r`` receives the state served under ``keys[r]``."""
        return [w.load_state.remote(k, donor, epoch, step, attempt) for w, k in zip(self.workers, keys)]

    def export_weights(self, version: int, fmt: WeightsFormat) -> tuple[list[Any], Any]:
        """``(sent refs, tensors ref)``: every rank's ``sent`` (``RankWorker.export_weights``:
        rank 0's holds the fingerprints) to wait on, and rank 0's tensors, left in Ray's object
        store (the driver owns the object and never fetches it; the engines do)."""
        pairs = [w.export_weights.options(num_returns=2).remote(version, fmt) for w in self.workers]
        return [sent for sent, _ in pairs], pairs[0][1]

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

    placement = plan.placement
    bundle = placement.rank_resources()
    remote_worker = ray.remote(max_restarts=0)(RankWorker)
    bundles = [dict(bundle) for _ in range(ranks_per_cell)]
    if target is not None:
        group = placement_group(bundles, strategy="STRICT_PACK", _soft_target_node_id=target)
    else:  # cells sharing GPUs take explicit device indices on one node
        group = placement_group(bundles, strategy="STRICT_PACK" if placement.shared else "PACK")
    cell = Cell(index, incarnation, group, [])
    cell.workers = [
        remote_worker.options(
            **actor_options(bundle, placement),
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
            cells.append(spawn_cell(plan, run_dir, c, ranks_per_cell, incarnation, (targets or {}).get(c)))
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
