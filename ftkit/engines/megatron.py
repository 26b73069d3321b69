"""``MegatronEngine``: ftkit's own inference engine, a TP=1 megatron-core model behind the
engine protocol (``ftkit.engines.protocol.Engine``).

The engine is given a built model (``GPTModel`` in eval mode, in its own world of one: the
caller builds it with ``build_gpt`` after ``init_local_parallel``) and what it needs of the
run as plain values: the device, the pad token, the chunk size and the model's vocabulary
size. It never imports ``ftkit.train``.

Contract (what the protocol leaves to the engine):

* ``names`` is ``"megatron"``: ``load_weights`` takes the TP=1 model's ``named_parameters``
  names, exactly (a missing or extra name, another shape or dtype raises ``ValueError``);
  ``dtype`` is the model's parameter dtype and ``signed_zeros`` True: what it holds is the
  bits sent, so ``held`` fingerprints its parameters as they are (``source`` ``"kernel"``: the
  kernels read them directly) and equals ``fingerprint_tensors`` of what was sent.
* ``generate`` samples from the ``allowed`` tokens only (the policy, ``ftkit.engines.policy``)
  at ``temperature`` (0: greedy), with top-k / top-p (``policy.truncate``): inverse-CDF in
  float64 with one uniform per token from a CPU ``torch.Generator`` seeded with the prompt's
  seed (a token of probability 0, cut by top-k / top-p or underflowed, is never drawn), so a
  response depends only on (weights, prompt, seed, sampling settings): the model runs on fixed
  chunks of ``chunk`` sequences of fixed length (short chunks padded with filler rows), never on
  how the prompts were batched. The sampling passes keep each layer's keys and values
  (``ftkit.model.kv_cache.DecodeCache``): the first runs the model over the prompts, each next
  one over the token drawn last only, and each computes the output layer at the one position it
  samples. A ``stop`` token ends a response (the rest of the row is padding
  for the model; a chunk whose rows have all stopped runs no further forward pass). Greedy takes
  the most likely allowed token (ties: the first); a position whose logits are not all finite
  gets the token ``-1`` and log-prob NaN. Prompts keep their left padding (``pads``): the model
  masks it out (``policy.padding_mask``). The log-probs follow the policy's convention: of the
  temperature-scaled distribution before truncation, of the temperature-1 one when greedy.
* **Scored in the trainer's shapes.** The log-probs ``generate`` reports for sampled responses
  are not the sampling pass's: once a call's responses are drawn, the ``[prompt | response]``
  rows are scored again in forward passes of exactly ``score_chunk`` rows (the trainer's
  micro-shard: short passes filled with filler rows), through ``policy.policy_logprobs`` on the
  device, as the trainer scores a micro-shard. cuBLAS picks its kernels by shape, so only the
  same shapes through the same kernels give the trainer's bits (rule FT114 is bitwise at TP=1);
  the sampling pass runs other shapes (one query against the cached keys, one output position), so its own
  log-probs are close to the trainer's, not equal, on CPU as on CUDA. Positions after a stop
  token stay 0. The cost is one
  forward pass over the call's rows per ``max_tokens`` sampling passes (``bench/engine_rescore.py``).
  Greedy responses are re-scored too (a ``-1`` token keeps its NaN).
* ``score_rows`` runs the rows in one forward pass (the canary's shape, the trainer's too), with
  the same mask, and computes the log-probs on the device like the trainer (not on the host:
  the host's ``log_softmax`` rounds differently from the device's).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftkit.engines.protocol import Generation, HeldWeights

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch


class MegatronEngine:
    """A TP=1 megatron-core model as an inference engine (see the module docstring)."""

    names = "megatron"
    signed_zeros = True

    def __init__(
        self,
        model: Any,
        device: str,
        *,
        pad_token: int,
        chunk: int,
        vocab_size: int,
        score_chunk: int = 0,
        label: str = "engine",
    ) -> None:
        """``model``: the built model (eval mode, on ``device``); ``pad_token``: what fills a row
        after its stop token; ``chunk``: the rows of every sampling pass; ``vocab_size``: the
        model's vocabulary (the policy's support when ``allowed`` is None); ``score_chunk``: the
        rows of every scoring pass of sampled responses (the trainer's micro-shard; 0: report the
        sampling pass's log-probs); ``label``: how its errors name it."""
        dtypes = {p.dtype for p in model.parameters()}
        if len(dtypes) != 1:
            raise ValueError(f"{label}: the model's parameters mix dtypes {sorted(map(str, dtypes))}")
        self.model, self.device, self.label = model, device, label
        self.pad_token, self.chunk, self.vocab_size, self.score_chunk = pad_token, chunk, vocab_size, score_chunk
        self.dtype: str = str(dtypes.pop()).removeprefix("torch.")
        self.version = -1
        self._skip = False

    def skip_next_load(self) -> None:
        """Arm the ``stale-weights`` fault: the next ``load_weights`` checks and loads nothing."""
        self._skip = True

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> HeldWeights:
        """Copy every parameter from ``tensors`` in place; the fingerprint of what is held after."""
        import torch

        t0 = time.perf_counter()
        params = dict(self.model.named_parameters())
        missing, extra = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
        if missing or extra:
            raise ValueError(
                f"{self.label}: weights do not match the model (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for name, p in params.items():
            src = tensors[name]
            if src.shape != p.shape or src.dtype != p.dtype:
                raise ValueError(
                    f"{self.label}: {name} is {src.dtype}{tuple(src.shape)}, the model holds {p.dtype}{tuple(p.shape)}"
                )
        skip, self._skip = self._skip, False
        if not skip:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(tensors[name])
        self.version = version
        return self._held(time.perf_counter() - t0)

    def held(self) -> HeldWeights:
        """The fingerprint of the parameters the model computes with now."""
        return self._held(0.0)

    def _held(self, seconds: float) -> HeldWeights:
        from ftkit.engines.protocol import fingerprint_held

        params = {n: p.detach() for n, p in self.model.named_parameters()}
        total, per_name = fingerprint_held(params, signed_zeros=True)
        sources = dict.fromkeys(per_name, "kernel")
        return HeldWeights(self.version, total, per_name, self.dtype, "kernel", seconds, sources)

    def score(self, tokens: Sequence[int], allowed: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``[len(tokens) - 1]``: the log-prob of each token given the ones before."""
        return self.score_rows([tokens], allowed)[0, :-1]

    def score_rows(
        self,
        rows: Sequence[Sequence[int]],
        allowed: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        scored: int | None = None,
    ) -> np.ndarray:
        """float32 ``[n, S]`` of rows of equal length ``S``: position ``t`` holds the log-prob of
        ``rows[:, t+1]``, the last position 0 (a row's left padding, ``pads``, is masked out);
        ``scored``: only each row's last ``scored`` tokens are scored (the output layer runs at
        their positions only, as the trainer's does: ``ftkit.model.output_positions``), the
        other positions hold 0."""
        import torch

        from ftkit.engines.policy import allowed_index, padding_mask, policy_logprobs
        from ftkit.model.output_positions import output_positions
        from ftkit.model.output_positions import scored as scored_positions

        tokens = torch.tensor([list(r) for r in rows], dtype=torch.int64)
        support = self._allowed(allowed)
        positions = torch.arange(tokens.shape[1], dtype=torch.int64).unsqueeze(0).expand_as(tokens)
        attention = None if pads is None else padding_mask(torch.tensor(list(pads)), tokens.shape[1]).to(self.device)
        tokens = tokens.to(self.device)
        with torch.no_grad(), output_positions(self.model, scored_positions(scored)):
            logits = self.model(tokens, positions.to(self.device), attention)
            index = allowed_index(support.tolist(), logits.shape[-1])
            return policy_logprobs(logits, tokens, support, index).cpu().numpy()

    def _allowed(self, allowed: Sequence[int] | None) -> torch.Tensor:
        import torch

        support = range(self.vocab_size) if allowed is None else allowed
        return torch.tensor(list(support), dtype=torch.int64)

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
    ) -> list[Generation]:
        """One response of at most ``max_tokens`` tokens per prompt (the module docstring);
        prompts are rows of equal length; ``temperature`` 0 is greedy."""
        import torch

        if not (temperature >= 0 and 0 < top_p <= 1 and top_k >= 0):
            raise ValueError(f"{self.label}: temperature {temperature}, top_p {top_p}, top_k {top_k} out of range")
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        rows = torch.tensor([list(p) for p in prompts], dtype=torch.int64)
        n = rows.shape[0]
        pad_rows = None if pads is None else torch.tensor(list(pads), dtype=torch.int64)
        stops = None if not stop else torch.tensor(list(stop), dtype=torch.int64)
        out = torch.empty((n, max_tokens), dtype=torch.int64)
        logprobs = torch.empty((n, max_tokens), dtype=torch.float32)
        for a in range(0, n, self.chunk):
            b = min(n, a + self.chunk)
            chunk_pads = None if pad_rows is None else pad_rows[a:b]
            draw = None if temperature == 0.0 else _Draw(seeds[a:b], temperature, top_p, top_k)
            out[a:b], logprobs[a:b] = self._chunk(
                rows[a:b], max_tokens, draw, self._allowed(allowed), stops, chunk_pads
            )
        ends = []
        for i in range(n):
            m = max_tokens
            if stops is not None:
                hit = torch.isin(out[i], stops).nonzero()
                m = int(hit[0]) + 1 if len(hit) else max_tokens
            ends.append(m)
        if self.score_chunk > 0:
            missing = out < 0  # greedy: no finite logits, no token
            scored = self._rescore(
                rows, out.masked_fill(missing, self.pad_token), self._allowed(allowed), pad_rows, temperature
            )
            logprobs = scored.masked_fill(missing, torch.nan)
        return [Generation(tokens=out[i, :m].numpy(), logprobs=logprobs[i, :m].numpy()) for i, m in enumerate(ends)]

    def _rescore(
        self,
        prompts: torch.Tensor,
        responses: torch.Tensor,
        allowed: torch.Tensor,
        pads: torch.Tensor | None,
        temperature: float,
    ) -> torch.Tensor:
        """float32 ``[n, r]``: the policy's log-probs (at ``temperature``) of ``responses`` after ``prompts``, scored in
        passes of ``score_chunk`` rows (the module docstring); only positions up to a row's stop
        token are read by the caller."""
        import torch

        from ftkit.engines.policy import allowed_index, padding_mask, policy_logprobs
        from ftkit.model.output_positions import output_positions, scored

        n, p = prompts.shape
        r, k = responses.shape[1], self.score_chunk
        rows = torch.cat([prompts, responses], dim=1)
        s = rows.shape[1]
        positions = torch.arange(s, dtype=torch.int64, device=self.device).unsqueeze(0).expand(k, s)
        index = allowed_index(allowed.tolist(), max(self.vocab_size, int(rows.max()) + 1))
        out = torch.empty((n, r), dtype=torch.float32)
        with torch.no_grad(), output_positions(self.model, scored(r)):  # the trainer's positions too
            for a in range(0, n, k):
                b = min(n, a + k)
                tokens = torch.zeros((k, s), dtype=torch.int64)  # a short pass filled to `k` rows
                tokens[: b - a] = rows[a:b]
                tokens = tokens.to(self.device)
                attention = None
                if pads is not None:
                    attention = padding_mask(torch.cat([pads[a:b], pads.new_zeros(k - (b - a))]), s).to(self.device)
                logits = self.model(tokens, positions, attention)
                lp = policy_logprobs(logits, tokens, allowed, index, temperature)
                out[a:b] = lp[: b - a, p - 1 : p - 1 + r].cpu()
        return out

    def _chunk(
        self,
        prompts: torch.Tensor,
        r: int,
        draw: _Draw | None,
        allowed: torch.Tensor,
        stops: torch.Tensor | None,
        pads: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, logprobs)`` ``[k, r]`` of one chunk of ``k <= chunk`` prompts; ``draw``
        None: greedy."""
        import torch

        from ftkit.engines.policy import padding_mask, sampled_logprobs, truncate
        from ftkit.model.kv_cache import DecodeCache

        k, p = prompts.shape
        s = p + r
        tokens = torch.zeros((self.chunk, s), dtype=torch.int64)  # short chunks padded to `chunk` rows
        tokens[:k, :p] = prompts
        uniforms, temperature = None, 0.0
        if draw is not None:
            uniforms = torch.stack([torch.rand(r, generator=_generator(s), dtype=torch.float64) for s in draw.seeds])
            temperature = draw.temperature
        positions = torch.arange(s, dtype=torch.int64).unsqueeze(0).expand(self.chunk, s)
        attention = None  # the prompts' left padding unseen; filler rows unpadded
        if pads is not None:
            attention = padding_mask(torch.cat([pads, pads.new_zeros(self.chunk - k)]), s).to(self.device)
        logprobs = torch.zeros((k, r), dtype=torch.float32)
        done = torch.zeros(k, dtype=torch.bool)
        if stops is not None:  # positions after a row's stop token hold the pad token (log-prob 0)
            tokens[:k, p:] = self.pad_token
        cache = DecodeCache(self.model, self.chunk, s)
        with torch.no_grad():
            for j in range(r):
                if bool(done.all()):  # every row stopped: the rest of the chunk is padding
                    break
                n = p + j  # causal: the next token's logits see the first `n` tokens only
                fed = slice(0 if j == 0 else n - 1, n)  # the prompt, then the token drawn last
                mask = None if attention is None else attention[..., fed, :n]
                logits = cache.next_logits(tokens[:, fed].to(self.device), positions[:, fed].to(self.device), mask)
                at = logits[:k, 0].to("cpu")
                step = at.to(torch.float64)[:, allowed]
                if uniforms is None:  # greedy; ties go to the first allowed token
                    pick = step.argmax(dim=-1, keepdim=True)
                    finite = step.isfinite().all(dim=-1)
                    tokens[:k, p + j] = torch.where(finite, allowed[pick.squeeze(1)], -1)
                else:
                    assert draw is not None
                    probs = torch.softmax(step if temperature == 1.0 else step / temperature, dim=-1)
                    cdf = truncate(probs, draw.top_p, draw.top_k).cumsum(dim=-1)
                    # right: the first token whose cumulative mass passes the draw (never one of mass 0)
                    at_u = uniforms[:, j : j + 1] * cdf[:, -1:]
                    pick = torch.searchsorted(cdf, at_u, right=True).clamp_(max=len(allowed) - 1)
                    tokens[:k, p + j] = allowed[pick.squeeze(1)]
                logprobs[:, j] = sampled_logprobs(at, allowed, pick.squeeze(1), temperature)
                if uniforms is None:
                    logprobs[:, j] = torch.where(finite, logprobs[:, j], torch.nan)
                if stops is not None:
                    tokens[:k, p + j] = torch.where(done, self.pad_token, tokens[:k, p + j])
                    logprobs[:, j] = torch.where(done, 0.0, logprobs[:, j])
                    done |= torch.isin(tokens[:k, p + j], stops)
        return tokens[:k, p:], logprobs

    def close(self) -> None:
        """Nothing to release: the model goes with the process."""


@dataclass(frozen=True)
class _Draw:
    """How one chunk's sampled responses are drawn: a seed per row and the sampling settings."""

    seeds: Sequence[int]
    temperature: float
    top_p: float
    top_k: int


def _generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (a prompt's sampling stream)."""
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g
