"""Live dumps of one rank: micro-shard captures and replicated state, through ``DumpWriter``.

Everything goes under ``dumps/actor/fwd_bwd/rollout_XXXXXX/`` (prefix ``actor``, phase
``fwd_bwd``), with writer names that never depend on the writing cell (unless
``dump_cells == "all"``, which appends ``-cell{c}``):

* ``step{S:06d}-ms{M:03d}-tp{t}-pp{p}``: the activations (module outputs) and/or output
  gradients of micro-shard ``M`` of step ``S``, written by whichever cell computed it, right
  after its backward (``ModuleCapture`` names: ``<module path>.output``, ``.output_grad``);
* ``replicated-tp{t}-pp{p}``: when ``dump_replicated``, the weights the rollout starts from
  (``<param>.param`` at the rollout's first step, ``dump_what`` has ``weights``) and the
  reduced gradient of every committed step (``<param>.grad``, ``dump_what`` has ``grads``);
  written once, after the rollout's last step.

Each written file is announced with a ``dump_written`` event. The witness is never dumped.

Pipeline stages (``pp > 1``) dump under model-wide names (``ftkit.model.stages.global_param_name``
with the stage's layer offset: stage 1 of a 4-layer model writes ``decoder.layers.2...``, never
its local ``decoder.layers.0``), so a PP run pairs tensor for tensor with a PP=1 run and the
stages never collide. A non-last stage's top-level captures (``output``, ``decoder.output``
and their gradients) are hidden states handed to the next stage, not the model's output or
the decoder's (after the final layernorm), so they are not dumped.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit

if TYPE_CHECKING:
    from ftkit.train.rank.context import RankContext

# captures of the model's and the decoder's own outputs (``output``, ``decoder#1.output_grad.0``)
_TOP_LEVEL = re.compile(r"^(?:(?:decoder)?(?:#\d+)?\.)?output(?:_grad)?(?:\.\d+)*$")


class RankDumps:
    """Dump state of one rank (reads its ``RankContext``: cfg, model, ranks, event writer)."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.what = set(ctx.cfg.dumps.what)
        from ftkit.model.stages import stage_position

        self.root = Path(ctx.run_dir) / "dumps"
        self._replicated: dict[int, Any] = {}  # rollout -> open DumpWriter
        self.offset, self.last_stage = stage_position(ctx.model)

    def _cell_suffix(self) -> int | None:
        return self.ctx.cell if self.ctx.cfg.dumps.cells == "all" else None

    def _meta(self) -> dict[str, Any]:
        return {"cell": self.ctx.cell, "rank": self.ctx.rank, "tp": self.ctx.tp_rank, "pp": self.ctx.pp_rank}

    def _announce(self, rollout: int, info: Any) -> None:
        emit.dump_written(
            self.ctx.events,
            rollout=rollout,
            phase="fwd_bwd",
            path=str(info.path),
            tensors=info.tensors,
            bytes=info.bytes,
        )

    @contextlib.contextmanager
    def micro_shard(self, rollout: int, step: int, shard: int, enabled: bool, attempt: int = 0) -> Iterator[None]:
        """Capture the forward/backward run inside the block and write it (when ``enabled``)."""
        acts, grads = "activations" in self.what, "grads" in self.what
        if not enabled or not (acts or grads):
            yield
            return
        from ftkit.dumps.capture import ModuleCapture
        from ftkit.dumps.layout import microshard_writer
        from ftkit.dumps.writer import DumpWriter

        cap = ModuleCapture(self.ctx.model, activations=acts, grads=grads)
        with cap:
            yield
        dw = DumpWriter(
            self.root,
            prefix="actor",
            phase="fwd_bwd",
            rollout=rollout,
            writer=microshard_writer(step, shard, self.ctx.tp_rank, self.ctx.pp_rank, self._cell_suffix()),
            meta=self._meta(),
        )
        for r in cap.take():
            name = capture_name(r.name, self.offset, self.last_stage)
            if name is not None:
                dw.add(name, r.tensor, step=step, micro_shard=shard, sharding=r.sharding, copy=False)
        self.ctx.faults.at("during_dump_write", step=step, attempt=attempt, rollout=rollout)
        self._announce(rollout, dw.write())

    def replicated(
        self, rollout: int, step: int, enabled: bool, before_step: bool, write: bool = True, attempt: int = 0
    ) -> None:
        """Before the optimizer step: record weights (first step) and the reduced gradients.
        After it, on the rollout's last step: write the file when ``write`` (else drop the
        record: every live cell records, the driver picks one that saw the whole rollout)."""
        if not enabled:
            return
        from ftkit.model.stages import global_param_name
        from ftkit.tensors.sharding import param_sharding

        cfg = self.ctx.cfg
        k = step % cfg.batch.steps_per_rollout
        if before_step:
            dw = self._writer(rollout)
            tp_size = cfg.layout.tp
            for local, p in self.ctx.params:
                name = global_param_name(local, self.offset)
                sh = param_sharding(p, self.ctx.tp_rank, tp_size)
                if k == 0 and "weights" in self.what:
                    dw.add(f"{name}.param", p, step=step, sharding=sh)
                if "grads" in self.what:
                    dw.add(f"{name}.grad", p.grad, step=step, sharding=sh)
            return
        if k == cfg.batch.steps_per_rollout - 1 and rollout in self._replicated:
            dw = self._replicated.pop(rollout)
            if write and len(dw):
                self.ctx.faults.at("during_dump_write", step=step, attempt=attempt, rollout=rollout)
                self._announce(rollout, dw.write())

    def _writer(self, rollout: int) -> Any:
        from ftkit.dumps.layout import replicated_writer
        from ftkit.dumps.writer import DumpWriter

        if rollout not in self._replicated:
            self._replicated[rollout] = DumpWriter(
                self.root,
                prefix="actor",
                phase="fwd_bwd",
                rollout=rollout,
                writer=replicated_writer(self.ctx.tp_rank, self.ctx.pp_rank, self._cell_suffix()),
                meta=self._meta(),
            )
        return self._replicated[rollout]


def capture_name(name: str, offset: int, last_stage: bool) -> str | None:
    """The dump name of a stage's capture ``name`` (model-wide layer numbers), or None when a
    non-last stage must not dump it (its top-level ``output`` / ``decoder.output`` captures)."""
    from ftkit.model.stages import global_param_name

    if not last_stage and _TOP_LEVEL.match(name):
        return None
    return global_param_name(name, offset)
