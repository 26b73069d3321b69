"""The trainer's attention mask of a batch of ``[prompt | response]`` rows of a task.

``sequence_mask(task, tokens)``: the mask of full sequences of ``task``: the rows' left
padding (``RlTask.prompt_pads``) masked out with ``ftkit.engines.policy.padding_mask``
(megatron-core's convention, the same the megatron engine gives its model), or ``None`` (the
causal mask alone) for a task without padding, so its batches run exactly as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.protocols import RlTask


def sequence_mask(task: RlTask, tokens: Tensor) -> Any:
    """The mask of ``tokens`` ``[n, seq_len]`` (prompt then response rows of ``task``), or ``None``."""
    from ftkit.engines.policy import padding_mask

    pads = task.prompt_pads(tokens[:, : task.prompt_len].cpu())
    return None if pads is None else padding_mask(pads, tokens.shape[1]).to(tokens.device)
