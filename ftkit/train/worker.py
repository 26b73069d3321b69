"""``RankWorker``: one megatron rank of one cell (the driver wraps it with ``ray.remote``).

Lifecycle (docs/architecture.md, "Training"; the exactness design is docs/training.md)::

    w = RankWorker(cfg_dict, run_dir, cell, rank, incarnation)    # cheap, no side effects
    w.init_cell(host, port)          # the cell's world, megatron state, model, optimizer, witness, events
    w.join_cross_cell(epoch, alive, host, port)   # the rank position's group over the alive cells
    w.train_step(rollout, step, attempt, epoch, batch, shards, dump, dump_replicated) -> dict
    w.export_weights() / w.save_final(run_dir) / w.shutdown()

``train_step`` is collective twice over: inside the cell (megatron TP all-reduces) and across
cells (the reducer). Every rank of every alive cell must call it for the same step with the
same ``epoch``. ``batch`` is the rollout's batch (``samples_per_rollout`` rows; the worker takes
step ``step % steps_per_rollout``'s slice) or already that step's slice; ``step`` is the
run-global step ``rollout * steps_per_rollout + k``. ``shards`` are the micro-shards this
cell computes (``microshards.assign``).

A step commits only when the reduction succeeded (finite everywhere, a collective decision);
otherwise the worker emits ``grad_nonfinite`` and ``step_outcome`` ``discarded`` and leaves
parameters and optimizer state untouched. Nothing is imported at module level beyond the
standard library and ftkit's light modules, so Ray can pickle the class cheaply.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


class RankWorker:
    """One rank (``rank`` = its rank in the cell's world of ``tp * pp``) of cell ``cell``."""

    def __init__(self, cfg: dict, run_dir: str, cell: int, rank: int, incarnation: int) -> None:
        self.cfg_dict = dict(cfg)
        self.run_dir = str(run_dir)
        self.cell, self.rank, self.incarnation = int(cell), int(rank), int(incarnation)
        self._store: Any = None
        self._store_addr: tuple[str, int] | None = None
        self.xgroup: Any = None
        self.epoch: int | None = None
        self._rows_buf: Any = None
        self.events: Any = None

    # --- setup -----------------------------------------------------------------------
    def init_cell(self, store_host: str, store_port: int) -> None:
        """Join the cell's own torch.distributed world (``cell{c}/inc{i}`` prefix of the
        driver's TCPStore), initialise megatron parallel state and build model, optimizer,
        witness and event writer."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        from ftkit.events.writer import EventWriter
        from ftkit.model.gpt import build_gpt, configure_determinism
        from ftkit.train.config import TrainConfig
        from ftkit.train.reducer import ExactReducer, GradLayout
        from ftkit.train.witness import WitnessTable

        cfg = self.cfg = TrainConfig.model_validate(self.cfg_dict)
        self.device = cfg.resolved_device()
        configure_determinism(cfg.threads_per_rank)
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each rank actor its own visible GPU
        store = self._client_store(store_host, store_port)
        dist.init_process_group(
            "nccl" if self.device == "cuda" else "gloo",
            store=dist.PrefixStore(f"cell{self.cell}/inc{self.incarnation}", store),
            rank=self.rank,
            world_size=cfg.tp * cfg.pp,
        )
        ps.initialize_model_parallel(cfg.tp, cfg.pp, create_gloo_process_groups=False)
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.model = build_gpt(cfg, self.device)
        self.params = list(self.model.named_parameters())
        self.optimizer = torch.optim.AdamW([p for _, p in self.params], lr=cfg.lr, weight_decay=0.0, foreach=False)
        has_witness = cfg.bookkeeping and ps.is_pipeline_first_stage()
        self.witness = WitnessTable(cfg.samples_per_rollout, self.device) if has_witness else None
        shapes = [(n, tuple(p.shape)) for n, p in self.params]
        if self.witness is not None:
            shapes.append(("witness", tuple(self.witness.param.shape)))
        self.layout = GradLayout.of(shapes)
        self.reducer = ExactReducer(self.layout, cfg.micro_shards)
        from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

        counted = [
            seg for seg, (_, p) in zip(self.layout.segments(), self.params) if param_is_not_tensor_parallel_duplicate(p)
        ]
        self.norm_ranges = _merge_ranges(counted)  # flat ranges the grad norm counts
        self.events = EventWriter(
            Path(self.run_dir) / "events",
            run=Path(self.run_dir).name,
            role="trainer",
            cell=self.cell,
            rank=self.rank,
            incarnation=self.incarnation,
        )
        from ftkit.train.rank_dumps import RankDumps

        self.dumps = RankDumps(self)
        from ftkit.train.pipeline import StagePipeline

        self.pipe = StagePipeline(self.model, self.device) if cfg.pp > 1 else None

    def _client_store(self, host: str, port: int) -> Any:
        import datetime

        import torch.distributed as dist

        if self._store_addr != (host, int(port)):
            self._store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=300))
            self._store_addr = (host, int(port))
        return self._store

    def join_cross_cell(self, epoch: int, alive: list[int], store_host: str, store_port: int) -> None:
        """Build this rank position's group over ``alive`` (prefix ``xcell/e{epoch}/r{rank}``)."""
        from ftkit.train.reducer import CrossCellGroup

        self.epoch = int(epoch)
        self.alive = sorted(set(alive))
        self.xgroup = CrossCellGroup(
            self._client_store(store_host, store_port),
            epoch=self.epoch,
            rank=self.rank,
            cell=self.cell,
            alive=self.alive,
            device=self.device,
        )

    # --- one optimizer step ----------------------------------------------------------
    def train_step(
        self,
        rollout: int,
        step: int,
        attempt: int,
        epoch: int,
        batch: dict,
        shards: list[int],
        dump: bool = False,
        dump_replicated: bool = False,
    ) -> dict:
        """Compute ``shards``, reduce across cells, count witnesses, step the optimizer.

        Returns ``{"committed", "loss", "grad_norm", "tokens", "total"}`` (``total``: the
        state fingerprint after the step, ``None`` without bookkeeping or when discarded).
        ``loss`` is the step's loss summed over all micro-shards (the same on every cell).
        """
        import torch

        from ftkit.train.loss import step_tokens
        from ftkit.train.microshards import shard_seed, shard_slices
        from ftkit.train.reducer import reduce_float

        cfg = self.cfg
        if self.xgroup is None or epoch != self.epoch:
            raise RuntimeError(
                f"train_step for epoch {epoch} but the cross-cell group is for "
                f"epoch {self.epoch}: call join_cross_cell first"
            )
        data = self._step_batch(rollout, step, batch)
        mine = sorted(int(m) for m in shards)
        if not mine or mine[0] < 0 or mine[-1] >= cfg.micro_shards or len(set(mine)) != len(mine):
            raise ValueError(f"micro-shards {shards} are not distinct indices in [0, {cfg.micro_shards})")
        norm = step_tokens(data["loss_mask"])
        if self.witness is not None:
            data["witness_rows"] = self.witness.rows(data["witness_ids"])
        slices = shard_slices(cfg.step_samples, cfg.micro_shards)
        keep = cfg.bookkeeping
        # Gradients accumulate straight into these rows: one zeroed row per micro-shard with
        # bookkeeping (kept apart for the exact reduction), one shared row without.
        rows = self._rows(len(mine) if keep else 1)
        losses = torch.zeros(cfg.micro_shards, dtype=torch.float64)
        for i, m in enumerate(mine):
            self._bind_grads(rows[i if keep else 0])
            self._seed(shard_seed(cfg.seed, rollout, step, m))
            part = {k: v[slices[m]] for k, v in data.items()}
            with self.dumps.micro_shard(rollout, step, m, dump):
                losses[m] = float(self._forward_backward(part, norm))
            self._check_bound(rows[i if keep else 0])
        if self.pipe is not None:  # only the last stage computed the losses
            self.pipe.share_losses(losses)
        # The loss vector has one non-zero slot per micro-shard, so its sum across cells is
        # exact; the exact reduction carries it in its own integer collective.
        if keep and cfg.reduce == "exact":
            reduced = self.reducer.reduce(rows, self.xgroup.allreduce, side=losses)
            if reduced is None:
                self.xgroup.allreduce(losses, "sum")
        else:
            reduced = reduce_float(rows, self.xgroup.allreduce)
            self.xgroup.allreduce(losses, "sum")
        result: dict[str, Any] = {
            "committed": False,
            "loss": float(losses.sum()),
            "grad_norm": math.nan,
            "tokens": int(data["loss_mask"].sum()),
            "total": None,
        }
        ev = self.events
        if reduced is None:
            ev.emit(
                "grad_nonfinite", rollout=rollout, step=step, cell=self.cell, rank=self.rank, where="reduced gradient"
            )
            ev.emit(
                "step_outcome",
                rollout=rollout,
                step=step,
                attempt=attempt,
                epoch=epoch,
                cell=self.cell,
                rank=self.rank,
                outcome="discarded",
                micro_shards=mine,
            )
            ev.sync(wait=False)  # the next emit waits for this fsync
            return result
        grads = self.layout.unflatten(reduced)
        for name, p in self.params:
            p.grad = grads[name]
        if self.witness is not None:
            ids, counts, contribs = self.witness.read(grads["witness"], data["witness_ids"].tolist())
            ev.emit(
                "witness_counts",
                rollout=rollout,
                step=step,
                attempt=attempt,
                cell=self.cell,
                rank=self.rank,
                ids=ids,
                counts=counts,
                contributions=contribs,
            )
        result["grad_norm"] = self._grad_norm(reduced)
        self.dumps.replicated(rollout, step, dump_replicated, before_step=True)
        self.optimizer.step()
        result["committed"] = True
        ev.emit(
            "step_outcome",
            rollout=rollout,
            step=step,
            attempt=attempt,
            epoch=epoch,
            cell=self.cell,
            rank=self.rank,
            outcome="committed",
            micro_shards=mine,
        )
        if keep:
            from ftkit.train.rank_state import fingerprint_state

            total, pfp, ofp = fingerprint_state(self.model, self.optimizer, self.params)
            ev.emit(
                "state_fingerprint",
                rollout=rollout,
                step=step,
                attempt=attempt,
                cell=self.cell,
                rank=self.rank,
                total=total,
                params=pfp,
                optimizer=ofp,
            )
            result["total"] = total
        self.dumps.replicated(rollout, step, dump_replicated, before_step=False)
        ev.sync(wait=False)  # the next emit waits for this fsync
        return result

    def _step_batch(self, rollout: int, step: int, batch: dict) -> dict:
        """This step's rows of ``batch`` (CPU tensors), see the module docstring."""
        cfg = self.cfg
        k, n = step % cfg.steps_per_rollout, cfg.step_samples
        if step // cfg.steps_per_rollout != rollout:
            raise ValueError(
                f"step {step} is not a step of rollout {rollout} ({cfg.steps_per_rollout} steps per rollout)"
            )
        rows = batch["tokens"].shape[0]
        if rows == cfg.samples_per_rollout:
            return {
                key: batch[key][k * n : (k + 1) * n] for key in ("tokens", "loss_mask", "advantages", "witness_ids")
            }
        if rows == n:
            return {key: batch[key] for key in ("tokens", "loss_mask", "advantages", "witness_ids")}
        raise ValueError(f"a batch of {rows} samples is neither a rollout ({cfg.samples_per_rollout}) nor a step ({n})")

    def _forward_backward(self, part: dict, norm: float) -> float:
        """Forward and backward of one micro-shard; returns its (normalised) loss."""
        import torch

        from ftkit.train.loss import pg_loss, targets

        tokens = part["tokens"].to(self.device)
        pos = torch.arange(tokens.shape[1], device=self.device).unsqueeze(0).expand_as(tokens)
        labels = targets(tokens)
        emb = None
        if self.witness is not None:  # with PP > 1 only the first stage has one (and the embedding)
            emb = self.model.embedding(input_ids=tokens, position_ids=pos)
            emb = self.witness.apply(emb, part["witness_rows"])
        if self.pipe is not None:
            return self.pipe.forward_backward(
                tokens, pos, labels, emb, lambda nll: pg_loss(nll, part["loss_mask"], part["advantages"], norm)
            )
        nll = self.model(tokens, pos, None, decoder_input=emb, labels=labels)
        loss = pg_loss(nll, part["loss_mask"], part["advantages"], norm)
        loss.backward()
        return float(loss.detach())

    def _seed(self, seed: int) -> None:
        """Reseed this device's generator (``torch.manual_seed`` would also queue lazy seeds
        for every accelerator type, with a formatted stack each: ~0.5 ms per micro-shard)."""
        import torch

        torch.default_generator.manual_seed(seed)
        if self.device == "cuda":
            torch.cuda.manual_seed(seed)

    def _rows(self, k: int) -> Any:
        """A zeroed ``[k, numel]`` float32 gradient buffer, kept between steps (a fresh one
        per step would page-fault hundreds of MB in for a larger model)."""
        import torch

        buf = self._rows_buf
        if buf is None or buf.shape[0] != k:
            buf = self._rows_buf = torch.zeros(k, self.layout.numel, dtype=torch.float32, device=self.device)
            return buf
        return buf.zero_()

    def _bind_grads(self, row: Any) -> None:
        """Make every ``.grad`` (the witness's included) a view of the zeroed flat ``row``:
        autograd then accumulates the backward in place, straight into the row."""
        grads = self.layout.unflatten(row)
        for name, p in self.params:
            p.grad = grads[name]
        if self.witness is not None:
            self.witness.param.grad = grads["witness"]

    def _check_bound(self, row: Any) -> None:
        """Every gradient must still live in ``row`` (autograd accumulated in place)."""
        lo, hi = row.data_ptr(), row.data_ptr() + row.numel() * row.element_size()
        grads = [p.grad for _, p in self.params] + ([self.witness.param.grad] if self.witness is not None else [])
        if any(g is None or not lo <= g.data_ptr() < hi for g in grads):
            raise RuntimeError("a gradient left its micro-shard buffer (autograd replaced .grad)")

    def _grad_norm(self, reduced: Any) -> float:
        """L2 norm of the reduced gradient of the whole model (TP shards counted once)."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        sq = torch.zeros(1, dtype=torch.float64, device=reduced.device)
        for a, b in self.norm_ranges:
            sq += float(torch.linalg.vector_norm(reduced[a:b])) ** 2
        group = ps.get_model_parallel_group()
        if group.size() > 1:
            dist.all_reduce(sq, group=group)
        return float(sq.sqrt())

    # --- state -------------------------------------------------------------------------
    def export_weights(self) -> dict:
        """The weights in the TP=1/PP=1 layout (TP shards and pipeline stages gathered, no
        witness); rank 0 returns them, others {}. Collective inside the cell."""
        from ftkit.train.pipeline import export_cell

        return export_cell(self.model)

    def save_final(self, run_dir: str) -> list[str]:
        """Write ``final/tp{t}-pp{p}.safetensors`` (model and optimizer state of this rank)."""
        from ftkit.train.rank_state import save_final

        meta = {
            "cell": str(self.cell),
            "rank": str(self.rank),
            "tp": str(self.cfg.tp),
            "pp": str(self.cfg.pp),
            "model": self.cfg.model,
            "seed": str(self.cfg.seed),
        }
        return [str(save_final(run_dir, self.model, self.optimizer, self.tp_rank, self.pp_rank, meta))]

    def shutdown(self) -> None:
        """Close the event log and leave the cell's world (idempotent)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self.events is not None:
            self.events.close()
            self.events = None
        self.xgroup = None
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent ``(start, end)`` ranges merged: fewer, larger slices for the grad norm."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
