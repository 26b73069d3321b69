"""``StepDump``: per-step tensor dumps of a chosen module, in ftkit's dump layout.

    with run.dump(step, model.module.layers[0], activations=True, grads=True, params=False):
        loss = model(x).loss; loss.backward()

On entering, hooks (``ftkit.dumps.capture.ModuleCapture``) are put on ``module`` and every
submodule; on leaving, the captured tensors are written (``ftkit.dumps.writer.DumpWriter``) to
``<run>/dumps/<prefix>/<phase>/rollout_<r>/step<step>-ms<rank>.safetensors`` plus its index, and
a ``dump_written`` event (with ``step``) is logged. Names are ``<module path>.output``,
``.output_grad`` (and ``<param>.param`` / ``.grad`` with ``params=True``), relative to
``module``; the data-parallel rank is the micro-shard (its batch is its shard of the step's
data), so ``compare-dumps RUN_A RUN_B`` pairs the tensors of two runs of any world size that
cut their batches alike. Parameters and gradients are replicated after the all-reduce: with
``params=True`` only rank 0 captures them. Backward must run inside the block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class StepDump:
    """One rank's dump of one step (a context manager); see the module docstring."""

    def __init__(
        self,
        run: Any,  # the EvidenceRun (not imported: it imports this module)
        step: int,
        module: torch.nn.Module,
        *,
        rollout: int = 0,
        prefix: str = "train",
        phase: str = "fwd_bwd",
        activations: bool = True,
        grads: bool = True,
        params: bool = False,
    ) -> None:
        from ftkit.dumps.capture import ModuleCapture

        self.run, self.step, self.rollout, self.prefix, self.phase = run, step, rollout, prefix, phase
        self.capture = ModuleCapture(
            module, activations=activations, grads=grads, params=params and run.rank == 0, tp_rank=0, tp_size=1
        )

    def __enter__(self) -> StepDump:
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        from ftkit.dumps.writer import DumpWriter

        self.capture.__exit__(*exc)
        if exc[0] is not None:
            return
        writer = DumpWriter(
            self.run.dir / "dumps",
            prefix=self.prefix,
            phase=self.phase,
            rollout=self.rollout,
            writer=f"step{self.step:06d}-ms{self.run.rank:03d}",
            meta={"cell": self.run.rank, "rank": 0},
        )
        self.capture.write_to(writer, step=self.step, micro_shard=self.run.rank)
        info = writer.write()
        import ftkit.evidence.emit as emit

        emit.dump_written(
            self.run.log,
            rollout=self.rollout,
            step=self.step,
            phase=self.phase,
            path=str(info.path),
            tensors=info.tensors,
            bytes=info.bytes,
        )
