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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class RankDumps:
    """Dump state of one ``RankWorker`` (reads its cfg, model, ranks and event writer)."""

    def __init__(self, worker: Any) -> None:
        self.w = worker
        self.what = set(worker.cfg.dump_what)
        self.root = Path(worker.run_dir) / "dumps"
        self._replicated: dict[int, Any] = {}  # rollout -> open DumpWriter

    def _cell_suffix(self) -> int | None:
        return self.w.cell if self.w.cfg.dump_cells == "all" else None

    def _meta(self) -> dict[str, Any]:
        return {"cell": self.w.cell, "rank": self.w.rank, "tp": self.w.tp_rank, "pp": self.w.pp_rank}

    def _announce(self, rollout: int, info: Any) -> None:
        self.w.events.emit(
            "dump_written",
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

        cap = ModuleCapture(self.w.model, activations=acts, grads=grads)
        with cap:
            yield
        dw = DumpWriter(
            self.root,
            prefix="actor",
            phase="fwd_bwd",
            rollout=rollout,
            writer=microshard_writer(step, shard, self.w.tp_rank, self.w.pp_rank, self._cell_suffix()),
            meta=self._meta(),
        )
        cap.write_to(dw, step=step, micro_shard=shard)
        self.w.faults.at("during_dump_write", step=step, attempt=attempt, rollout=rollout)
        self._announce(rollout, dw.write())

    def replicated(
        self, rollout: int, step: int, enabled: bool, before_step: bool, write: bool = True, attempt: int = 0
    ) -> None:
        """Before the optimizer step: record weights (first step) and the reduced gradients.
        After it, on the rollout's last step: write the file when ``write`` (else drop the
        record: every live cell records, the driver picks one that saw the whole rollout)."""
        if not enabled:
            return
        from ftkit.tensors.sharding import param_sharding

        cfg = self.w.cfg
        k = step % cfg.steps_per_rollout
        if before_step:
            dw = self._writer(rollout)
            tp_size = cfg.tp
            for name, p in self.w.params:
                sh = param_sharding(p, self.w.tp_rank, tp_size)
                if k == 0 and "weights" in self.what:
                    dw.add(f"{name}.param", p, step=step, sharding=sh)
                if "grads" in self.what:
                    dw.add(f"{name}.grad", p.grad, step=step, sharding=sh)
            return
        if k == cfg.steps_per_rollout - 1 and rollout in self._replicated:
            dw = self._replicated.pop(rollout)
            if write and len(dw):
                self.w.faults.at("during_dump_write", step=step, attempt=attempt, rollout=rollout)
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
                writer=replicated_writer(self.w.tp_rank, self.w.pp_rank, self._cell_suffix()),
                meta=self._meta(),
            )
        return self._replicated[rollout]
