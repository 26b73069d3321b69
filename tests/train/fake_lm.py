"""A stand-in for a megatron ``GPTModel`` in engine tests: logits chosen by the test, computed the
way the engine expects (sequence-first hidden states through ``output_layer``, which the engine's
scoring passes narrow to the scored positions, then ``[b, s, V]``; with megatron's
``inference_context``, as the sampling passes call it through ``ftkit.model.kv_cache``, the fed
tokens follow the ``sequence_len_offset`` tokens before them and the last position's logits come
back, ``[b, 1, V]``), so the generation loop runs as on a real model without building one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


class FakeLM(torch.nn.Module):
    """``fill(logits)`` writes the logits ``[s, b, V]`` (sequence first) of every position."""

    def __init__(self, vocab_size: int, fill: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.vocab_size, self.fill = vocab_size, fill
        self.output_layer = torch.nn.Identity()

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: object,
        inference_context: object = None,
        runtime_gather_output: bool | None = None,
    ) -> torch.Tensor:
        before = 0 if inference_context is None else inference_context.sequence_len_offset
        hidden = torch.zeros((before + tokens.shape[1], tokens.shape[0], self.vocab_size))
        self.fill(hidden)
        if inference_context is not None:  # megatron's materialize_only_last_token_logits
            return hidden[-1:].transpose(0, 1)
        return self.output_layer(hidden).transpose(0, 1)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return iter([torch.nn.Parameter(torch.zeros(1))])  # one dtype, as the engine checks
