"""The attention mask of a batch of ``[prompt | response]`` rows whose prompts are left-padded.

megatron-core's convention (what ``ftkit.model.attention.SDPAttention`` reads): a bool
``[n, 1, S, S]`` tensor, ``True`` where query ``q`` must not attend to key ``k``. The mask is the
causal one plus: no query attends to a pad key of its row, except a pad query to itself (a row
of the softmax needs one visible key; a pad's output is never learned or scored). ``None``
stands for the causal mask alone, what a task without padding (``prompt_pads`` is ``None``)
gives, so its batches run exactly as before.

* ``padding_mask(pads, seq_len)``: the mask of rows with ``pads[i]`` left pads;
* ``sequence_mask(task, tokens)``: the mask of full sequences of ``task`` (``None`` without padding);
* ``chunk_mask(task, prompts, rows, seq_len)``: an engine's chunk of ``rows`` sequences whose first
  ``len(prompts)`` rows hold ``prompts`` (the others are filler, unpadded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.rl.task import RlTask


def padding_mask(pads: Tensor, seq_len: int) -> Any:
    """``[n, 1, S, S]`` bool, ``True`` = masked (module docstring)."""
    import torch

    at = torch.arange(seq_len)
    future = at[None, :] > at[:, None]  # [q, k]: k after q
    pad_key = at[None, None, :] < pads[:, None, None]  # [n, 1 (q), k]
    itself = at[:, None] == at[None, :]
    return (future[None] | (pad_key & ~itself[None]))[:, None]


def sequence_mask(task: RlTask, tokens: Tensor) -> Any:
    """The mask of ``tokens`` ``[n, seq_len]`` (prompt then response rows of ``task``), or ``None``."""
    pads = task.prompt_pads(tokens[:, : task.prompt_len].cpu())
    return None if pads is None else padding_mask(pads, tokens.shape[1]).to(tokens.device)


def chunk_mask(task: RlTask, prompts: Tensor, rows: int, seq_len: int) -> Any:
    """The mask of an engine's chunk (module docstring), or ``None``."""
    import torch

    pads = task.prompt_pads(prompts)
    if pads is None:
        return None
    return padding_mask(torch.cat([pads, pads.new_zeros(rows - pads.shape[0])]), seq_len)
