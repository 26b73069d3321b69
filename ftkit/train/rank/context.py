"""``RankContext``: what one rank's collaborators share, built once when the rank joins its cell.

``open_context(plan, run_dir, cell, rank, incarnation, store_host, store_port)`` (a ``RunPlan``) joins the
cell's own torch.distributed world (``cell{c}/inc{i}`` prefix of the driver's TCPStore),
initialises megatron's parallel state and builds the model (in the run's precision: bf16
weights with float32 masters, ``ftkit.train.rank.precision``), the optimizer (on the masters),
the witness, the event writer, the fault injector, the cross-cell link and (GRPO with a KL
term) the frozen reference model. The step phases, the dumps
(``RankDumps(ctx)``), the heal (``heal.receive(ctx, ...)``) and the checkpoints are handed the
context and read exactly these; none of them reaches into ``RankWorker``, the actor's thin
remote face. Mutable step bookkeeping (counters, the pending reduction, the guard) stays with
the worker, which passes it where it is needed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor
    from torch.optim import Optimizer

    from ftkit.events.writer import EventWriter
    from ftkit.train.config import TrainConfig
    from ftkit.train.faults.points import Injector
    from ftkit.train.plan.run_plan import RunPlan
    from ftkit.train.rank.crosscell import CrossCellLink
    from ftkit.train.rank.witness import WitnessTable


@dataclass
class RankContext:
    """One rank of one cell, set up (see the module docstring)."""

    plan: RunPlan
    run_dir: str
    cell: int
    rank: int  # in the cell's world of tp * pp
    incarnation: int
    device: str
    tp_rank: int
    pp_rank: int
    model: Any  # megatron's GPTModel (this rank's stage and TP shard), in the run's precision
    params: list[tuple[str, Tensor]]  # the state of record: float32 masters (the model's own in fp32)
    optimizer: Optimizer
    witness: WitnessTable | None  # first pipeline stage with bookkeeping only
    events: EventWriter
    faults: Injector
    link: CrossCellLink
    reference: Any = None  # GRPO with kl_coef > 0: the frozen initial model (same layout), else None
    weights: list[tuple[str, Tensor]] | None = None  # the model's parameters (bf16); None: ``params``

    @property
    def model_params(self) -> list[tuple[str, Tensor]]:
        """The ``(name, parameter)`` pairs the model computes with (what autograd fills)."""
        return self.params if self.weights is None else self.weights

    def recast(self) -> None:
        """The model's weights re-cast from the masters (after an optimizer step or a restore)."""
        from ftkit.train.rank.precision import recast

        recast(self.model_params, self.params)

    @property
    def cfg(self) -> TrainConfig:
        """The run's config (``plan.config``)."""
        return self.plan.config

    @property
    def witness_param(self) -> Tensor | None:
        return None if self.witness is None else self.witness.param


def open_context(
    plan: RunPlan, run_dir: str, cell: int, rank: int, incarnation: int, store_host: str, store_port: int
) -> RankContext:
    """Join the cell's world and build what the rank computes with (see the module docstring)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ftkit.events.writer import EventWriter
    from ftkit.model.gpt import build_gpt, configure_determinism
    from ftkit.train.config import STARTUP_TIMEOUT_S
    from ftkit.train.control.rundir import run_name
    from ftkit.train.faults.points import injector_for
    from ftkit.train.rank.crosscell import CrossCellLink
    from ftkit.train.rank.witness import WitnessTable

    cfg, device = plan.config, plan.device
    configure_determinism(cfg.compute.threads_per_rank)
    if device == "cuda":  # Ray's visible GPU (index 0), or the placement's index when cells share GPUs
        index = plan.placement.rank_device(cell, rank)
        torch.cuda.set_device(0 if index is None else index)
    startup = datetime.timedelta(seconds=STARTUP_TIMEOUT_S)
    store = dist.TCPStore(store_host, int(store_port), is_master=False, timeout=startup)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        store=dist.PrefixStore(f"cell{cell}/inc{incarnation}", store),
        rank=rank,
        world_size=cfg.layout.ranks,
        timeout=startup,
    )
    ps.initialize_model_parallel(cfg.layout.tp, cfg.layout.pp, create_gloo_process_groups=False)
    from ftkit.model.hf_build import precision_dtype
    from ftkit.train.rank.precision import split_masters, torch_dtype

    model = build_gpt(plan.model, cfg.rng.seed, device, precision_dtype(plan.precision))
    weights, params = split_masters(model, plan.precision)
    optimizer = torch.optim.AdamW([p for _, p in params], lr=cfg.objective.lr, weight_decay=0.0, foreach=False)
    has_witness = cfg.reduction.bookkeeping and ps.is_pipeline_first_stage()
    witness = WitnessTable(cfg.batch.samples_per_rollout, device) if has_witness else None
    events = EventWriter(
        Path(run_dir) / "events", run=run_name(run_dir), role="trainer", cell=cell, rank=rank, incarnation=incarnation
    )
    faults = injector_for(plan.faults, events, "trainer", cell=cell, rank=rank)
    collective = datetime.timedelta(seconds=cfg.recovery.collective_timeout)
    link_store = dist.TCPStore(store_host, int(store_port), is_master=False, timeout=collective)
    link = CrossCellLink(link_store, rank, cell, plan.placement.link, cfg.recovery.collective_timeout)
    reference = None
    if cfg.objective.loss == "grpo" and cfg.objective.kl_coef > 0:
        # KL to the initial model: built from the spec again (the same bits as ``model`` at
        # step 0 on every rank, a healed or resumed one too), never trained
        reference = build_gpt(plan.model, cfg.rng.seed, device, precision_dtype(plan.precision))
        reference.eval().requires_grad_(False)
        reference.to(torch_dtype(plan.precision))
    return RankContext(
        plan,
        run_dir,
        cell,
        rank,
        incarnation,
        device,
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        model,
        params,
        optimizer,
        witness,
        events,
        faults,
        link,
        reference,
        None if weights is params else weights,
    )
