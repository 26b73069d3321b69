"""A stand-in for a megatron ``GPTModel`` in engine tests: logits chosen by the test, computed the
way the engine expects (sequence-first hidden states through ``output_layer``, which the engine's
sampling pass narrows to one position, then ``[b, s, V]``), so the generation loop runs as on a
real model without building one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


class FakeLM(torch.nn.Module):
    """``fill(logits)`` writes the logits ``[s, b, V]`` (sequence first) of every position."""

    def __init__(self, vocab_size: int, fill: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.vocab_size, self.fill = vocab_size, fill
        self.output_layer = torch.nn.Identity()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: object) -> torch.Tensor:
        hidden = torch.zeros((tokens.shape[1], tokens.shape[0], self.vocab_size))
        self.fill(hidden)
        return self.output_layer(hidden).transpose(0, 1)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return iter([torch.nn.Parameter(torch.zeros(1))])  # one dtype, as the engine checks
