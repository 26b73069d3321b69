"""The output layer at the sequence positions that are read, not at every position.

Over a large vocabulary the output layer is most of a small model's forward pass, and its
``[s, b, V]`` float32 logits most of the activations; a causal model's logits at one position
do not depend on which other positions get logits. So a caller that reads some positions only
has the output layer compute those (what Hugging Face calls ``logits_to_keep``):

- ``output_positions(model, positions)``: while open, ``model``'s output layer (megatron-core's
  ``GPTModel.output_layer``) takes the hidden states of ``positions`` (a slice of the sequence
  axis) only; the model then returns logits ``[b, w, V]`` (or, given ``labels`` ``[b, w]`` of
  those positions, the per-token loss ``[b, w]``). A pipeline stage without an output layer is
  left as it is. Nothing else changes: the layers below see every position.
- ``scored(width)``: the positions of a ``[prompt | response]`` row that predict its last
  ``width`` tokens (the response: every position a loss, a log-prob check or a canary reads),
  ``slice(-width - 1, -1)``; ``None`` (``width`` 0 or None): every position.
- ``widen(values, seq_len)``: ``[b, w]`` values of ``scored(w)`` placed in a ``[b, seq_len]``
  row layout (position ``t`` scores token ``t + 1``), 0 elsewhere.

The positions a caller keeps decide the output layer's matrix shapes, and on CUDA the kernels
(and so the bits) follow the shapes: the engines and the trainer keep the same ones
(``ftkit.engines.megatron``, ``ftkit.train.rank.compute``), so their log-probs stay bitwise equal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@contextlib.contextmanager
def output_positions(model: Any, positions: slice | None) -> Iterator[None]:
    """While open, ``model``'s output layer computes the logits of ``positions`` only (the module
    docstring); ``None``: every position."""
    layer = getattr(model, "output_layer", None)
    if positions is None or layer is None:
        yield
        return

    def keep(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return (args[0][positions], *args[1:]), kwargs  # hidden states [s, b, h]

    handle = layer.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def scored(width: int | None) -> slice | None:
    """The positions that predict a row's last ``width`` tokens (the module docstring)."""
    return slice(-width - 1, -1) if width else None


def widen(values: Tensor, seq_len: int) -> Tensor:
    """``[b, w]`` values of the positions ``scored(w)`` in a ``[b, seq_len]`` layout, 0 elsewhere
    (differentiable: a loss over the result reaches ``values``)."""
    import torch

    b, w = values.shape
    if w == seq_len:
        return values
    before = values.new_zeros(b, seq_len - 1 - w)
    return torch.cat([before, values, values.new_zeros(b, 1)], dim=1)
