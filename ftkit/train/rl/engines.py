"""Inference engines: processes holding the current policy weights that generate responses.

``InferenceEngine`` is a plain class; the driver wraps it with ``ray.remote`` (one actor per
engine). Each holds a TP=1 megatron-core ``GPTModel`` (``build_gpt`` after
``init_local_parallel``), so it has its own world of one and never joins a training group.

Contract:

* ``load_weights(state, version, rollout, attempt=0)`` copies every parameter of the model from ``state`` (the
  names of the TP=1 model's ``named_parameters``, exactly: a missing or extra name raises),
  then fingerprints what the model *holds* afterwards and emits ``engine_weights``; it returns
  the fingerprint total, which must equal the driver's ``weights_sent`` fingerprint. The
  ``during_weight_sync`` fault point comes before the copy (``stale-weights``: the copy is
  skipped, the engine silently keeps its previous weights; ``corrupt-engine``: one bit of the
  loaded weights is flipped after the copy): FT102 reports both, FT114 the log-probs. Then it
  scores the canary set (``ftkit.train.rl.canary``) and logs ``canary_logprobs``.
* ``generate(prompts, rollout, first_index)`` samples ``response_len`` tokens per prompt and
  returns them with the policy's float32 log-prob of each (``ftkit.train.rl.policy``). A task
  with a ``stop_token`` (a prompt dataset: ``eos``) stops a response at it: the positions after
  it hold the task's ``pad_token`` with log-prob 0 (the driver's ``loss_mask`` leaves them out),
  and a chunk whose rows have all stopped runs no further forward pass.
  Sample ``i`` (its global index in the rollout, ``first_index + row``) draws from the stream
  ``("sample", seed, rollout, i)`` and the model runs on fixed chunks of ``GEN_CHUNK``
  sequences of fixed length, so a response depends only on (weights, prompt, seed, rollout,
  sample index): never on which engine produced it or how many engines there are.
  ``split(n, engines)`` gives each engine a contiguous range of whole chunks.

Sampling is temperature 1 over the task's response tokens only (the other logits are
ignored): inverse-CDF in float64 with one uniform per token from the sample's stream.
``generate(..., greedy=True)`` takes the most likely of those tokens instead and draws no
random number (the evaluation of ``--best-metric eval_reward``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ftkit.train.rl.seeds import torch_generator

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.config import TrainConfig

#: Sequences per forward pass of an engine; a fixed shape keeps results batch independent.
GEN_CHUNK = 16


def split(n: int, engines: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` sample ranges per engine, made of whole ``GEN_CHUNK``
    chunks (the last chunk of the rollout may be short); an engine may get an empty range."""
    chunks = -(-n // GEN_CHUNK)
    base, extra = divmod(chunks, engines)
    out, start = [], 0
    for e in range(engines):
        stop = min(n, start + (base + (1 if e < extra else 0)) * GEN_CHUNK)
        out.append((start, stop))
        start = stop
    return out


class EngineActor:
    """What every engine actor of ``ftkit train`` shares, whatever computes behind it: its
    config, index, task, event log (``engine-r<engine>-i<n>.jsonl``, ``engine_restart`` first
    when it replaces a failed one) and fault injector. ``InferenceEngine`` (megatron-core) and
    ``ftkit.train.rl.vllm_actor.VllmInferenceEngine`` add ``load_weights`` and ``generate``."""

    def __init__(self, cfg: TrainConfig, run_dir: str, engine: int, restarted: tuple[str, str] | None = None) -> None:
        """``restarted``: ``(cause, during)`` when this engine replaces one that failed; it is
        logged as ``engine_restart``, the first event of this engine's log."""
        from ftkit.events.writer import EventWriter
        from ftkit.train.control.rundir import run_name
        from ftkit.train.faults.points import injector_for

        self.cfg = cfg  # validated once, by the driver
        self.engine = engine
        self.task = self.cfg.rl_task()
        self.version: int | None = None
        self.events = EventWriter(
            os.path.join(run_dir, "events"),
            run=run_name(run_dir),
            role="engine",
            cell=None,
            rank=engine,
        )  # file engine-r<engine>-i<n>.jsonl
        if restarted is not None:
            self.events.emit("engine_restart", engine=engine, cause=restarted[0], during=restarted[1])
            self.events.sync()
        self.faults = injector_for(self.cfg, self.events, "engine", engine=engine)

    def ready(self) -> int:
        """Returns the engine index once constructed (lets the driver wait for startup)."""
        return self.engine

    def node(self) -> str:
        """The Ray node id (hex) this engine runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def sync_fault(self, version: int, rollout: int, attempt: int) -> str | None:
        """The ``during_weight_sync`` fault due at this load, if any (its kind)."""
        sync_step = version * self.cfg.batch.steps_per_rollout
        return self.faults.at("during_weight_sync", step=sync_step, attempt=attempt, rollout=rollout)

    def shutdown(self) -> None:
        """Flush and close the engine's event log."""
        self.events.close()


class InferenceEngine(EngineActor):
    """One megatron-core inference engine (see the module docstring for the contract)."""

    def __init__(self, cfg: TrainConfig, run_dir: str, engine: int, restarted: tuple[str, str] | None = None) -> None:
        from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel

        super().__init__(cfg, run_dir, engine, restarted)
        self.device = self.cfg.resolved_device()
        configure_determinism(self.cfg.compute.threads_per_rank)
        init_local_parallel(self.device)
        self.model = build_gpt(self.cfg.gpt_spec(), self.device).eval()

    def load_weights(self, state: dict[str, Tensor], version: int, rollout: int, attempt: int = 0) -> str:
        """Load ``state`` as weights version ``version`` (to generate rollout ``rollout``);
        emit ``engine_weights`` and return the fingerprint total of what the model holds.
        ``attempt``: how many times this version was sent to this engine index before (a
        restarted engine is re-sent it), the ``during_weight_sync`` fault point's attempt."""
        import torch

        from ftkit.tensors.fingerprint import fingerprint_tensors

        params = dict(self.model.named_parameters())
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or extra:
            raise ValueError(
                f"engine {self.engine}: weights do not match the model (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for name, p in params.items():
            src = state[name]
            if src.shape != p.shape or src.dtype != p.dtype:
                raise ValueError(
                    f"engine {self.engine}: {name} is {src.dtype}{tuple(src.shape)}, "
                    f"the model holds {p.dtype}{tuple(p.shape)}"
                )
        fault = self.sync_fault(version, rollout, attempt)
        with torch.no_grad():
            if fault != "stale-weights":
                for name, p in params.items():
                    p.copy_(state[name])
            if fault == "corrupt-engine":
                from ftkit.train.faults.injector import flip_bit

                flip_bit(next(iter(params.values())))
        total, per_tensor = fingerprint_tensors({n: p.detach() for n, p in params.items()})
        self.version = version
        self.events.emit(
            "engine_weights", rollout=rollout, version=version, engine=self.engine, total=total, params=per_tensor
        )
        self._score_canaries(version, rollout)
        self.events.sync()
        return total

    def _score_canaries(self, version: int, rollout: int) -> None:
        """Log ``canary_logprobs``: the policy's log-probs of the canary set under the weights
        just loaded (``ftkit.train.rl.canary``)."""
        import torch

        from ftkit.train.rl.canary import canary_fields, canary_tokens
        from ftkit.train.rl.masks import sequence_mask
        from ftkit.train.rl.policy import allowed_index, policy_logprobs

        tokens, mask = canary_tokens(self.task, self.cfg.rng.seed, GEN_CHUNK)
        allowed = torch.tensor(self.task.response_tokens, dtype=torch.int64)
        positions = torch.arange(tokens.shape[1], dtype=torch.int64).unsqueeze(0).expand_as(tokens)
        attention = sequence_mask(self.task, tokens)
        attention = None if attention is None else attention.to(self.device)
        with torch.no_grad():
            logits = self.model(tokens.to(self.device), positions.to(self.device), attention).to("cpu")
        lp = policy_logprobs(logits, tokens, allowed, allowed_index(self.task.response_tokens, logits.shape[-1]))
        self.events.emit(
            "canary_logprobs", rollout=rollout, version=version, engine=self.engine, **canary_fields(lp, mask)
        )

    def generate(self, prompts: Tensor, rollout: int, first_index: int, greedy: bool = False) -> tuple[Any, Any]:
        """``(responses, logprobs)``: int64 ``[n, response_len]``, one sampled response per row
        of ``prompts [n, P]``, and float32 ``[n, response_len]``, the policy's log-prob of each
        response token under the weights this engine holds (``ftkit.train.rl.policy``).

        ``greedy``: the most likely allowed token at each position instead (evaluation,
        ``--best-metric eval_reward``): no random stream is drawn, so it changes nothing a
        training rollout samples; ``rollout`` and ``first_index`` are then unused. A position
        whose logits are not all finite gets the token ``-1`` (no valid answer) and log-prob NaN.
        """
        import torch

        n = prompts.shape[0]
        out = torch.empty((n, self.task.response_len), dtype=torch.int64)
        logprobs = torch.empty((n, self.task.response_len), dtype=torch.float32)
        for start in range(0, n, GEN_CHUNK):
            rows = prompts[start : start + GEN_CHUNK]
            stop = start + rows.shape[0]
            out[start:stop], logprobs[start:stop] = self._generate_chunk(rows, rollout, first_index + start, greedy)
        return out, logprobs

    def _generate_chunk(self, prompts: Tensor, rollout: int, first_index: int, greedy: bool) -> tuple[Any, Any]:
        import torch

        from ftkit.train.rl.masks import chunk_mask
        from ftkit.train.rl.policy import sampled_logprobs

        k, p = prompts.shape
        r, s = self.task.response_len, self.task.seq_len
        tokens = torch.zeros((GEN_CHUNK, s), dtype=torch.int64)  # short chunks padded to GEN_CHUNK rows
        tokens[:k, :p] = prompts
        uniforms = None
        if not greedy:
            uniforms = torch.stack(
                [
                    torch.rand(
                        r,
                        generator=torch_generator("sample", self.cfg.rng.seed, rollout, first_index + i),
                        dtype=torch.float64,
                    )
                    for i in range(k)
                ]
            )
        allowed = torch.tensor(self.task.response_tokens, dtype=torch.int64)
        positions = torch.arange(s, dtype=torch.int64).unsqueeze(0).expand(GEN_CHUNK, s)
        attention = chunk_mask(self.task, prompts, GEN_CHUNK, s)  # the prompts' left padding unseen
        attention = None if attention is None else attention.to(self.device)
        logprobs = torch.zeros((k, r), dtype=torch.float32)
        stop, done = self.task.stop_token, torch.zeros(k, dtype=torch.bool)
        if stop is not None:  # positions after a row's stop token hold the pad token (log-prob 0)
            tokens[:k, p:] = self.task.pad_token
        with torch.no_grad():
            for j in range(r):
                if bool(done.all()):  # every row stopped: the rest of the chunk is padding
                    break
                logits = self.model(tokens.to(self.device), positions.to(self.device), attention)
                at = logits[:k, p - 1 + j].to("cpu")
                step = at.to(torch.float64)[:, allowed]
                if uniforms is None:  # greedy; ties go to the first allowed token
                    pick = step.argmax(dim=-1, keepdim=True)
                    finite = step.isfinite().all(dim=-1)
                    tokens[:k, p + j] = torch.where(finite, allowed[pick.squeeze(1)], -1)
                else:
                    cdf = torch.softmax(step, dim=-1).cumsum(dim=-1)
                    pick = torch.searchsorted(cdf, uniforms[:, j : j + 1] * cdf[:, -1:]).clamp_(max=len(allowed) - 1)
                    tokens[:k, p + j] = allowed[pick.squeeze(1)]
                logprobs[:, j] = sampled_logprobs(at, allowed, pick.squeeze(1))
                if uniforms is None:
                    logprobs[:, j] = torch.where(finite, logprobs[:, j], torch.nan)
                if stop is not None:
                    tokens[:k, p + j] = torch.where(done, self.task.pad_token, tokens[:k, p + j])
                    logprobs[:, j] = torch.where(done, 0.0, logprobs[:, j])
                    done |= tokens[:k, p + j] == stop
        return tokens[:k, p:], logprobs
