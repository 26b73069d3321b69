"""Where a prompt task's response ends: at the tokenizer's ``eos`` (unless ``ignore_eos``) or
after the token that completes the first stop string (``--stop``), whichever comes first.

The engines stop at ``eos`` themselves; stop strings are found afterwards, on the text, by the
engine actor (``ftkit.train.rl.engines``): a response is sampled token by token from a stream
that depends only on its seed, so cutting it after the token that completes a stop string gives
the tokens an engine stopping there would have given (only the compute after it is spent in
vain). vLLM's conventions: the text is decoded with special tokens skipped and a stop string is
searched in it; the response keeps the tokens through the one that completes it (they are learned,
as ``eos`` is); the text a reward sees ends *before* the stop string (vLLM's
``include_stop_str_in_output=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Stops:
    """What ends a response: ``eos`` (None: ``ignore_eos``) and the ``strings`` of ``--stop``,
    read through ``tokenizer``."""

    tokenizer: Any
    eos: int | None
    strings: tuple[str, ...] = ()

    def end(self, ids: Sequence[int]) -> tuple[int, bool]:
        """``(length, stopped)`` of one response's tokens: the tokens through the first ``eos``
        or through the one that completes the first stop string; ``len(ids)`` and False when
        neither occurs (the response was cut at the limit)."""
        ids = list(ids)
        end, stopped = len(ids), False
        if self.eos is not None and self.eos in ids:
            end, stopped = ids.index(self.eos) + 1, True
        if self.strings:
            text_end = self._string_end(ids[: end - 1] if stopped else ids)
            if text_end is not None:
                end, stopped = text_end, True
        return end, stopped

    def ends(self, responses: Tensor) -> tuple[Any, Any]:
        """int64 ``[n]`` lengths and bool ``[n]`` stopped (``end`` of each row of ``responses``)."""
        import torch

        rows = [self.end(r) for r in responses.tolist()]
        return torch.tensor([n for n, _ in rows], dtype=torch.int64), torch.tensor([s for _, s in rows])

    def text(self, ids: Sequence[int]) -> str:
        """What a reward sees of a response's tokens (through its end, ``eos`` dropped): the
        decoded text, special tokens skipped, cut before the first stop string."""
        text = self._decode(ids)
        at = [i for i in (text.find(s) for s in self.strings) if i >= 0]
        return text[: min(at)] if at else text

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(t) for t in ids if int(t) >= 0], skip_special_tokens=True))

    def _string_end(self, ids: list[int]) -> int | None:
        """The length of the shortest prefix of ``ids`` whose text holds a stop string (None: no
        prefix does). Decoding is monotone in the prefix, so a binary search finds it in
        ``log2(len)`` decodes after the one of the whole response."""

        def holds(n: int) -> bool:
            text = self._decode(ids[:n])
            return any(s in text for s in self.strings)

        if not holds(len(ids)):
            return None
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
        return lo
