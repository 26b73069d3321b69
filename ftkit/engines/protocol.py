"""The one seam every inference engine sits behind (ftkit's megatron engine, vLLM).

An engine holds a weights version, proves what it holds, and generates with per-token
log-probs. The trainer side (``ftkit.train.rl.engines.EngineActor``, whatever the engine)
drives it like this (the contract):

1. The engine declares what it takes: ``engine.names`` (``"hf"``: Hugging Face names,
   ``model.layers.0.self_attn.q_proj.weight``; ``"megatron"``: the TP=1 megatron-core model's
   own parameter names), ``engine.dtype`` (a torch dtype name) and ``engine.signed_zeros``
   (whether it holds -0.0 apart from +0.0); ``WeightsFormat`` carries the three to the side
   that exports the weights.
2. ``sent = expected_weights(tensors, engine.dtype, engine.signed_zeros)``: the fingerprint
   of exactly what is sent (in the engine's names), cast to the engine's dtype where it
   differs, -0.0 folded into +0.0 where the engine cannot hold signed zeros apart (log this as
   ``weights_sent``).
3. ``held = engine.load_weights(tensors, version)``: the update happens in place (no restart,
   no disk round trip); the returned ``HeldWeights`` is the fingerprint of what the engine
   *computes with* afterwards, read back from its own layout and mapped to the names sent
   (log it as ``engine_weights``). ``held.total != sent[0]`` is FT102. ``engine.held()`` reads
   the same fingerprint again without loading.
4. ``engine.skip_next_load()`` arms the ``stale-weights`` fault: the next ``load_weights`` is
   answered as if done, but the engine keeps the weights it held (one-shot).
5. ``engine.score(tokens, allowed)``: log-probs of one token sequence, float32
   ``[len(tokens) - 1]``; ``engine.score_rows(rows, allowed, pads, scored)``: float32 ``[n, S]``
   for rows of equal length ``S``, position ``t`` the log-prob of ``rows[:, t+1]``, the last
   position 0, positions inside a row's left padding (``pads[i]`` tokens) meaningless; with
   ``scored`` (an int) only the log-probs of each row's last ``scored`` tokens are asked for
   (``ftkit.model.output_positions``): the other positions may hold 0. The
   canary (a fixed set of rows) is re-scored after every sync: a canary that did not move
   after an update that should move it is a stale engine even when the fingerprint cannot see
   the kernels' own copy (``HeldWeights.source`` says what it saw).
6. ``engine.generate(prompts, max_tokens, seeds, temperature, allowed, stop, pads, top_p,
   top_k)``: one ``Generation`` per prompt, sampled from a stream that depends only on its seed
   (``temperature`` 0: greedy, no stream drawn), at ``temperature``, from the tokens top-k and
   top-p keep (``ftkit.engines.policy.truncate``: vLLM's rules; ``top_k`` 0 and ``top_p`` 1:
   off); ``logprobs[i]`` is the engine's log-prob of ``tokens[i]`` (float32) under the policy:
   the distribution restricted to the ``allowed`` token ids (None: the whole vocabulary), at
   ``temperature``, before top-k / top-p (at temperature 1 when greedy): the convention of
   ``ftkit.engines.policy``. A ``stop`` token ends a response (kept as its last
   token, so a response may be shorter than ``max_tokens``). ``pads``: the left padding of
   each prompt row, which the engine must not attend to (it may drop it). The trainer hands an
   engine whole chunks of ``GEN_CHUNK`` prompts (the last may be short, ``split``), so an
   engine whose kernels are batch-invariant samples the same tokens however the prompts are
   spread over the engines.
7. ``engine.close()`` releases what the engine holds (its process, if it has one).
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


@dataclass(frozen=True)
class WeightsFormat:
    """What an engine takes (item 1 of the contract): ``names`` ``"hf"`` or ``"megatron"``,
    ``dtype`` a torch dtype name, ``signed_zeros`` whether -0.0 is held apart from +0.0."""

    names: str
    dtype: str
    signed_zeros: bool


class Engine(Protocol):
    """What the trainer side may call on any engine (see the module docstring)."""

    names: str
    dtype: str
    signed_zeros: bool

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> HeldWeights: ...

    def skip_next_load(self) -> None: ...

    def held(self) -> HeldWeights: ...

    def score(self, tokens: Sequence[int], allowed: Sequence[int] | None = None) -> np.ndarray: ...

    def score_rows(
        self,
        rows: Sequence[Sequence[int]],
        allowed: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        scored: int | None = None,
    ) -> np.ndarray: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        seeds: Sequence[int],
        temperature: float = 1.0,
        allowed: Sequence[int] | None = None,
        stop: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> list[Generation]: ...

    def close(self) -> None: ...


FOLD_BATCH_BYTES = 1 << 30  # folded copies hashed together (on a GPU: one batch, one copy back)


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

    from ftkit.tensors.fingerprint import combine, fingerprints

    if signed_zeros:
        per_name = fingerprints(tensors)
    else:  # folded copies in batches of about FOLD_BATCH_BYTES: the weights are never held twice
        per_name, batch, held = {}, {}, 0
        for n, t in tensors.items():
            batch[n] = torch.where(t == 0, torch.zeros_like(t), t)
            held += t.numel() * t.element_size()
            if held >= FOLD_BATCH_BYTES:
                per_name |= fingerprints(batch)
                batch, held = {}, 0
        per_name |= fingerprints(batch)
        per_name = {n: per_name[n] for n in tensors}
    return combine(per_name), per_name
