"""Mixed precision of one rank: the bf16 model, its float32 master weights, and how a bf16
gradient reaches the float32 rows of the exact reduction (docs/training.md, "Precision").

Contract:

* ``split_masters(model, precision) -> (weights, masters)``, called once on the freshly built
  model (``build_gpt(..., precision_dtype(precision))``: float32, or bf16 where a bf16 checkpoint was
  read as stored). ``fp32``: both are the model's own ``named_parameters()`` (the same list:
  nothing is copied, nothing changes). ``bf16``: ``masters`` are float32 parameters made of the
  built weights (same names, carrying megatron's tensor-parallel attributes, so TP sharding,
  grad norms and checkpoints read them as they read the model's): a float32 weight's master
  takes over its storage (no copy), a bf16 weight's is its exact upcast. Then the model is cast
  to bf16 in place (round-to-nearest-even, ``Module.to``; a no-op for a weight already bf16)
  and ``weights`` are its bf16 parameters. So the rank holds at most the masters plus the bf16
  weights (6 bytes a parameter), and a bf16 checkpoint's weights stay its bits. The masters and
  the optimizer state on them are the rank's state of record: fingerprints, heal, checkpoints,
  the final state and dumps of weights read them.
* ``recast(weights, masters)``: the bf16 weights re-cast from the masters (after every
  optimizer step and every restore of the masters: heal, resume); a no-op in fp32, where
  they are the same tensors. The bf16 weights are thus a function of the masters alone.
* ``GradStage(layout, precision, device)``: where a micro-shard's backward accumulates.
  ``bind(row, weights, witness)`` points every weight's ``.grad`` at a view of the zeroed
  float32 ``row`` (fp32) or of a zeroed bf16 staging row of the same layout (bf16; the witness,
  a float32 parameter, still accumulates straight into ``row``); ``land(row)`` then adds the
  staging row into ``row``. That addition is exact: every element of one of the two operands is
  zero and bf16 -> fp32 is exact, so ``row`` holds exactly the bf16 gradient, and the int64
  reduction (and its membership invariance) takes it as it takes an fp32 one. ``holds(row)``
  says whether every gradient still lives in its buffer (autograd accumulated in place).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.rank.reducer import GradLayout

Named = list[tuple[str, "Tensor"]]


def torch_dtype(precision: str) -> Any:
    """The torch dtype of the weights the model computes with in ``precision``."""
    from ftkit.model.hf_build import precision_dtype
    from ftkit.model.hf_build import torch_dtype as named

    return named(precision_dtype(precision))


def split_masters(model: Any, precision: str) -> tuple[Named, Named]:
    """``(weights, masters)`` of a freshly built ``model`` (module contract)."""
    import torch

    weights: Named = list(model.named_parameters())
    if precision == "fp32":
        return weights, weights
    dtype = torch_dtype(precision)
    masters: Named = []
    for name, p in weights:
        if p.dtype not in (torch.float32, dtype):
            raise ValueError(f"{name}: the model was built in {p.dtype}, masters are taken from float32 or {dtype}")
        data = p.detach() if p.dtype == torch.float32 else p.detach().float()  # the storage, or the exact upcast
        master = torch.nn.Parameter(data, requires_grad=p.requires_grad)
        master.__dict__.update(p.__dict__)  # tensor_model_parallel, partition_dim, ...
        masters.append((name, master))
    model.to(dtype)  # a float32 weight gets new bf16 storage; its master keeps the old one
    return list(model.named_parameters()), masters


def recast(weights: Named, masters: Named) -> None:
    """Copy every master into its weight, rounded to the weight's dtype (nearest even)."""
    import torch

    if weights is masters:
        return
    with torch.no_grad():
        for (_, w), (_, m) in zip(weights, masters):
            w.copy_(m)


class GradStage:
    """Where a micro-shard's backward accumulates (module contract)."""

    def __init__(self, layout: GradLayout, precision: str, device: str) -> None:
        import torch

        self.layout = layout
        self.stage: Tensor | None = None
        if precision != "fp32":
            self.stage = torch.zeros(layout.numel, dtype=torch_dtype(precision), device=device)

    def bind(self, row: Tensor, weights: Named, witness: Tensor | None) -> None:
        """Point every ``.grad`` at a zeroed view (``row`` is zeroed by the caller)."""
        grads = self.layout.unflatten(row)
        staged = grads
        if self.stage is not None:
            staged = self.layout.unflatten(self.stage.zero_())
        for name, p in weights:
            p.grad = staged[name]
        if witness is not None:
            witness.grad = grads["witness"]

    def land(self, row: Tensor) -> None:
        """Add the staged bf16 gradient into ``row`` (exact; nothing to do in fp32)."""
        if self.stage is not None:
            row.add_(self.stage)

    def holds(self, row: Tensor, weights: Named, witness: Tensor | None) -> bool:
        """Whether every gradient still views its buffer (``row``, or the staging row)."""
        stage = row if self.stage is None else self.stage

        def inside(g: Tensor | None, buf: Tensor) -> bool:
            lo = buf.data_ptr()
            return g is not None and lo <= g.data_ptr() < lo + buf.numel() * buf.element_size()

        return all(inside(p.grad, stage) for _, p in weights) and (witness is None or inside(witness.grad, row))
