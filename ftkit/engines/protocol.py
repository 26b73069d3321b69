"""The one seam every inference engine sits behind (ftkit's megatron engine, vLLM).

An engine holds a weights version, proves what it holds, and generates with per-token
log-probs. The trainer side drives it like this (the contract):

1. ``sent = expected_weights(tensors, engine.dtype, engine.signed_zeros)``: the fingerprint
   of exactly what is sent, cast to the engine's dtype where it differs, -0.0 folded into +0.0
   where the engine cannot hold signed zeros apart (log this as ``weights_sent``).
2. ``held = engine.load_weights(tensors, version)``: the update happens in place (no restart,
   no disk round trip); the returned ``HeldWeights`` is the fingerprint of what the engine
   *computes with* afterwards, read back from its own layout and mapped to the names sent
   (log it as ``engine_weights``). ``held.total != sent[0]`` is FT102.
3. ``engine.score(canary)``: log-probs of a fixed token sequence, re-scored after every sync;
   a canary that did not move after an update that should move it is a stale engine even when
   the fingerprint cannot see the kernels' own copy (``HeldWeights.source`` says what it saw).
4. ``engine.generate(prompts, max_tokens, seeds)``: one ``Generation`` per prompt, sampled
   from a stream that depends only on its seed; ``logprobs[i]`` is the engine's log-prob of
   ``tokens[i]`` (float32).

Tensors are keyed by Hugging Face names (``model.layers.0.self_attn.q_proj.weight``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch


@dataclass(frozen=True)
class Generation:
    """One sampled response: ``tokens`` int64 ``[n]`` and the engine's log-prob of each,
    ``logprobs`` float32 ``[n]``."""

    tokens: np.ndarray
    logprobs: np.ndarray


@dataclass(frozen=True)
class HeldWeights:
    """The fingerprint of what an engine holds after a sync.

    ``source`` names what was read: ``"kernel"`` (the tensors the compute kernels read, mapped
    back bitwise) or ``"loaded"`` (the tensors as loaded, before the engine repacked them for
    its kernels: the canary must back it). ``seconds``: the time the load took."""

    version: int
    total: str
    params: dict[str, str]
    dtype: str
    source: str
    seconds: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)


class Engine(Protocol):
    """What the trainer side may call on any engine (see the module docstring)."""

    dtype: str
    signed_zeros: bool

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> HeldWeights: ...

    def held(self) -> HeldWeights: ...

    def score(self, tokens: Sequence[int]) -> np.ndarray: ...

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, seeds: Sequence[int], temperature: float = 1.0
    ) -> list[Generation]: ...

    def close(self) -> None: ...


def expected_weights(
    tensors: Mapping[str, torch.Tensor], dtype: str, signed_zeros: bool = True
) -> tuple[str, dict[str, str]]:
    """``(total, {name: fingerprint})`` of ``tensors`` cast to ``dtype`` (a torch dtype name),
    with -0.0 folded into +0.0 unless ``signed_zeros``: what an engine of that dtype must
    report holding after loading them."""
    import torch

    target = getattr(torch, dtype)
    cast = {n: t.detach().to(target) for n, t in tensors.items()}
    return fingerprint_held(cast, signed_zeros)


def fingerprint_held(tensors: Mapping[str, torch.Tensor], signed_zeros: bool) -> tuple[str, dict[str, str]]:
    """``fingerprint_tensors`` of ``tensors``, with -0.0 folded into +0.0 unless ``signed_zeros``
    (the one routine both sides of an engine's check use)."""
    import torch

    from ftkit.tensors.fingerprint import combine, fingerprint

    if signed_zeros:
        per_name = {n: fingerprint(t) for n, t in tensors.items()}
    else:  # folded one tensor at a time: a model's weights are never held twice
        per_name = {n: fingerprint(torch.where(t == 0, torch.zeros_like(t), t)) for n, t in tensors.items()}
    return combine(per_name), per_name
