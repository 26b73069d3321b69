"""``RankCheckpoints``: the checkpoint side of a ``RankWorker`` (a base class of it, so these
are methods of the same Ray actor): the preflight of a checkpoint boundary, the canonical state
a checkpoint holds, restoring one into this rank, and the final state file.

Every method runs in the rank's own process, on the attributes ``RankWorker.init_cell`` set
(declared below); the collective ones (``checkpoint_state``) are called by every rank of the
cell. Layout handling lives in ``ftkit.train.rank.canonical_state``, file formats in
``ftkit.checkpoint`` and ``ftkit.train.rank.state``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftkit.checkpoint.guard import NonFiniteGuard
    from ftkit.train.config import TrainConfig
    from ftkit.train.rank.context import RankContext
    from ftkit.train.rank.step_types import StepTask


class RankCheckpoints:
    """Checkpoint methods of one rank (mixed into ``RankWorker``): they read the rank's
    ``RankContext`` and the worker's step bookkeeping (counters, guard, pending attempt)."""

    cfg: TrainConfig
    ctx: RankContext
    cell: int
    rank: int
    guard: NonFiniteGuard
    counters: dict[str, int]
    _pending: object | None
    _started: StepTask | None

    def checkpoint_preflight(self, step: int, checkpoints_dir: str) -> tuple[Any, Any]:
        """``(PreflightVerdict, GuardVerdict)`` of this rank for the checkpoint of ``step``.

        Consumes the non-finite guard (exactly once per boundary, published or not) and runs
        ``ftkit.checkpoint.preflight.preflight`` with the ``publish_preflight`` fault point;
        the payload estimate is this rank's parameters and optimizer state times the ranks of
        a cell. Touches no collective, so a failing peer cannot make it hang."""
        from ftkit.checkpoint.preflight import preflight
        from ftkit.checkpoint.publish import TENSOR_OVERHEAD
        from ftkit.train.rank.state_codec import capture

        guard = self.guard.consume(step)
        state = capture(self.ctx.params, self.ctx.optimizer, None, self.counters)  # views, no copy
        local = [*state.params.values(), *state.optimizer.values()]
        nbytes = sum(int(t.numel()) * t.element_size() + TENSOR_OVERHEAD for t in local) * self.cfg.layout.ranks
        verdict = preflight(
            Path(checkpoints_dir),
            step,
            nbytes,
            guard,
            f"cell{self.cell}-rank{self.rank}",
            at=lambda point: self.ctx.faults.at(point, step=step, rollout=self.counters["rollout"]),
        )
        return verdict, guard

    def checkpoint_state(self, copy: bool = True) -> dict[str, Any]:
        """The state a checkpoint holds, in the TP=1/PP=1 layout, for any ``--tp`` / ``--pp``.

        Collective inside the cell (``canonical_state.gather``): every rank calls it. Rank 0
        returns ``{"params", "optimizer", "extra", "rank_totals", "ranks"}``: the canonical
        parameters and optimizer moments and steps (model-wide names, TP shards assembled,
        stages joined); ``extra`` holds the counters and the witness table (rank 0 is on the
        first stage, which holds it); ``rank_totals`` every rank's ``state_fingerprint`` total
        of this state (``{rank: total}``, what the rank logged at this step) and ``ranks`` every
        rank's ``canonical_state.rank_spec`` (how to slice its shard back out). Every other rank
        returns ``{}``. The RNG is not saved: every micro-shard reseeds it from (seed, rollout,
        step, micro-shard), and its leftover state depends on which cell ran the last micro-shard.
        ``copy=False``: a CPU tensor that needs no assembling is the live one, not a copy (for a
        caller that is done with it before the state changes: ``write_checkpoint``)."""
        import torch
        import torch.distributed as dist

        from ftkit.model.stages import stage_position
        from ftkit.train.rank.canonical_state import gather, rank_spec
        from ftkit.train.rank.state import fingerprint_state
        from ftkit.train.rank.state_codec import capture

        offset, _ = stage_position(self.ctx.model)
        witness = self.ctx.witness_param
        state = capture(self.ctx.params, self.ctx.optimizer, witness, self.counters)
        total, _, _ = fingerprint_state(self.ctx.model, self.ctx.optimizer, self.ctx.params)
        params, optimizer = gather(self.ctx.params, state.optimizer, offset, copy=copy)
        mine = (total, rank_spec(self.ctx.params, self.ctx.tp_rank, self.ctx.pp_rank, self.cfg.layout.tp, offset))
        ranks: list[Any] | None = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(mine, ranks, dst=0)
        if ranks is None:
            return {}
        extra = {"counters": torch.tensor([self.counters["step"], self.counters["rollout"]], dtype=torch.int64)}
        if state.witness is not None:
            extra["witness"] = state.witness.detach().cpu().clone()
        return {
            "params": params,
            "optimizer": optimizer,
            "extra": extra,
            "rank_totals": {str(r): t for r, (t, _) in enumerate(ranks)},
            "ranks": {str(r): spec for r, (_, spec) in enumerate(ranks)},
        }

    def write_checkpoint(self, stage: str, step: int, meta: dict[str, Any], shard_bytes: int) -> Any:
        """Write this cell's checkpoint state into the staging directory ``stage`` (the driver's
        ``Publisher`` made it; ``publish.write_payload``: the safetensors files, each file's
        sha256 and each tensor's fingerprint and NaN/Inf count in one pass), so the state never
        travels to the driver. Collective inside the cell like ``checkpoint_state``: every rank
        calls it; rank 0 writes and returns the ``Staged`` record (``meta`` with every rank's
        ``ranks`` spec added, the ranks' totals), every other rank ``None``. An ``OSError`` of
        the write (ENOSPC, EIO) is returned as a ``WriteFailure``, not raised: it rejects the
        publication, it is no failure of the cell. The ``publish_write`` fault point of a spec
        naming this cell fires in rank 0 once the files are written, before their records are
        sent (an injected ``exception`` is an EIO of the write, as in the driver)."""
        import errno

        from ftkit.checkpoint.preflight import fire
        from ftkit.checkpoint.publish import WriteFailure, write_payload
        from ftkit.checkpoint.restore import state_payload
        from ftkit.train.faults.injector import InjectedFault

        state = self.checkpoint_state(copy=False)  # written before this call returns: no copy
        if not state:
            return None
        payload = state_payload(
            state["params"], state["optimizer"], state["extra"], {**meta, "ranks": state["ranks"]}, state["rank_totals"]
        )
        try:
            staged = write_payload(Path(stage), step, payload, shard_bytes)
            fire(lambda point: self.ctx.faults.at(point, step=step, rollout=self.counters["rollout"]), "publish_write")
        except OSError as exc:
            return WriteFailure.of(exc)
        except InjectedFault as exc:
            return WriteFailure(errno.EIO, str(exc), None)
        return staged

    def restore_checkpoint(self, files: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
        """Load a checkpoint (the TP=1/PP=1 state, any layout it was trained in) into this rank.

        ``files``: ``ftkit.checkpoint.restore.load``'s tensors (``model.safetensors``,
        ``optimizer.safetensors``, ``extra.safetensors``); ``meta``: ``{"step", "rollout",
        "state_fingerprint", "rank_totals", "layout"}`` from its manifest and ``meta.json``. This
        rank's shard is sliced out (``canonical_state.local_state``: its stage's layers, its TP
        shards); parameters, optimizer moments and steps (replaced whole), the witness table and
        the counters are copied in (``state_codec.restore``; the RNG is left alone: every
        micro-shard reseeds it); any step held is dropped and the non-finite guard starts at
        ``step + 1``. Returns the state fingerprint of what this rank now holds, which must equal
        the one expected (``_expected_total``); ``ValueError`` when it does not, or when the
        checkpoint does not fit the model."""
        import torch

        from ftkit.checkpoint.guard import NonFiniteGuard
        from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER
        from ftkit.model.stages import stage_position
        from ftkit.train.rank.canonical_state import local_state
        from ftkit.train.rank.state import fingerprint_state
        from ftkit.train.rank.state_codec import RankState, restore

        extra = files[EXTRA]
        if self.ctx.witness is not None and "witness" not in extra:
            raise ValueError("the checkpoint holds no witness table, this run keeps one (bookkeeping)")
        step, rollout = (int(v) for v in extra["counters"].tolist())
        if (step, rollout) != (int(meta["step"]), int(meta["rollout"])):
            raise ValueError(f"checkpoint counters (step {step}, rollout {rollout}) disagree with its manifest")
        offset = stage_position(self.ctx.model)[0]
        params, optim = local_state(
            files[MODEL], files[OPTIMIZER], self.ctx.params, self.ctx.tp_rank, self.cfg.layout.tp, offset
        )
        expected = self._expected_total(params, optim, meta)
        state = RankState(
            params=params,
            optimizer=optim,
            witness=extra.get("witness") if self.ctx.witness is not None else None,
            rng=torch.default_generator.get_state(),
            counters={"step": step, "rollout": rollout},
        )
        restore(state, self.ctx.params, self.ctx.optimizer, self.ctx.witness_param)
        self.ctx.recast()  # bf16: the weights from the restored masters
        self.counters = dict(state.counters)
        self._pending = self._started = None
        self.guard = NonFiniteGuard(first_step=step + 1)
        total, _, _ = fingerprint_state(self.ctx.model, self.ctx.optimizer, self.ctx.params)
        if total != expected:
            raise ValueError(
                f"cell {self.cell} rank {self.rank}: state fingerprint after restore {total} differs from the "
                f"expected {expected}"
            )
        return total

    def _expected_total(self, params: dict[str, Any], optim: dict[str, Any], meta: dict[str, Any]) -> str:
        """The state fingerprint this rank must hold after a restore: the manifest's
        ``state_fingerprint`` for a cell of one rank; the total this rank position logged when
        the checkpoint was taken in the same layout (``rank_totals``); else (another layout) the
        total of the shard sliced out of the verified checkpoint, which checks the copy."""
        from ftkit.tensors.fingerprint import combine, fingerprints

        if self.cfg.layout.ranks == 1:
            return str(meta["state_fingerprint"])
        layout = meta.get("layout") or {}
        logged = (meta.get("rank_totals") or {}).get(str(self.rank))
        if logged is not None and (layout.get("tp"), layout.get("pp")) == (self.cfg.layout.tp, self.cfg.layout.pp):
            return str(logged)
        named = {f"param/{n}": t for n, t in params.items()} | {f"optimizer/{n}": t for n, t in optim.items()}
        return combine(fingerprints(named))

    def save_final(self, run_dir: str) -> list[str]:
        """Write ``final/tp{t}-pp{p}.safetensors`` (model and optimizer state of this rank,
        named model-wide, its TP shards marked in the metadata: ``rank_state.save_final``)."""
        from ftkit.model.stages import stage_position
        from ftkit.train.rank.canonical_state import rank_shardings
        from ftkit.train.rank.state import save_final
        from ftkit.train.rank.state_codec import capture

        meta = {
            "cell": str(self.cell),
            "rank": str(self.rank),
            "tp": str(self.cfg.layout.tp),
            "pp": str(self.cfg.layout.pp),
            "model": self.cfg.model.preset,
            "seed": str(self.cfg.rng.seed),
        }
        state = capture(self.ctx.params, self.ctx.optimizer, None, self.counters)
        offset, _ = stage_position(self.ctx.model)
        shardings = rank_shardings(self.ctx.params, self.ctx.tp_rank, self.cfg.layout.tp, offset)
        return [str(save_final(run_dir, state, self.ctx.tp_rank, self.ctx.pp_rank, meta, offset, shardings))]
