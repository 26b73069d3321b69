"""``--engine vllm``: a real vLLM engine behind the engine seam of ``ftkit train``.

``VllmInferenceEngine`` is the Ray actor the driver starts per engine in place of the megatron
``InferenceEngine``, with the same calls (``ready``, ``node``, ``load_weights``, ``generate``,
``shutdown``); each owns one ``ftkit.engines.vllm.VllmEngine`` (a vLLM process in the vLLM
virtualenv, TP=1, float32, started from the run's Hugging Face model directory).

Contract (what differs from the megatron engine):

* ``load_weights(state, version, rollout, attempt)``: ``state`` is keyed by Hugging Face names
  (the driver converts the trainer's TP=1 state, ``ftkit.model.hf_export.hf_tensors``, and logs
  ``weights_sent`` as ``expected_weights`` of it: float32, signed zeros folded, since vLLM's
  CPU kernels cannot hold -0.0 apart). The update happens in place; ``engine_weights`` is the
  fingerprint of what vLLM *computes with* afterwards, read back from its kernels' own layout
  (``HeldWeights``), so FT102 compares the weights the kernels use with those sent. Faults at
  ``during_weight_sync``: ``stale-weights`` loads nothing (the engine answers as if it had),
  ``corrupt-engine`` sends one tensor with one bit flipped.
* The canary set is scored by vLLM itself (prompt log-probs of the full vocabulary, renormalised
  over the task's response tokens): the same quantity the trainer scores, from vLLM's kernels.
* ``generate``: vLLM samples up to ``response_len`` tokens per prompt from the task's response
  tokens only (``allowed_token_ids``), stopping after the task's ``stop_token`` where it has one
  (the rest of the row is the pad token with log-prob 0, as the megatron engine leaves it),
  temperature 1, seeded per sample with ``derive_seed("sample", seed, rollout, i)`` (``i`` the
  sample's index in the rollout), so a response does not depend on which engine produced it; the log-probs are vLLM's
  ``processed_logprobs`` (after the allowed-token mask: the policy's distribution). vLLM's
  sampler is not ftkit's inverse-CDF one, so a vLLM run's samples differ from a megatron run's.
  The number of training cells never reaches the engines, so 1 cell and 2 cells train on the
  same rollouts; whether another engine count samples the same tokens depends on vLLM's
  kernels being batch-independent (its seeds are per request), which ftkit does not claim.
  ``greedy``: temperature 0.
* A left-padded prompt (``RlTask.prompt_pads``: a prompt dataset's) is given to vLLM without its
  padding, in ``generate`` and in the canary scores, where the trainer and the megatron engine
  mask the pads out (``ftkit.train.rl.masks``); with rotary positions both compute the same
  distribution up to float rounding, which FT114 compares within ``--logprob-tolerance``.

Log-probs differ from the trainer's by vLLM's arithmetic (other kernels): FT114 holds them to
``--logprob-tolerance`` (a warning above it), not to the bit.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ftkit.train.rl.engines import GEN_CHUNK, EngineActor

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.train.config import TrainConfig


class VllmInferenceEngine(EngineActor):
    """One vLLM engine of ``ftkit train`` (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, run_dir: str, engine: int, restarted: tuple[str, str] | None = None) -> None:
        from ftkit.engines.vllm import VllmEngine

        super().__init__(cfg, run_dir, engine, restarted)
        log = os.path.join(run_dir, "logs", f"vllm-engine-{engine}.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        self.llm = VllmEngine(
            str(cfg.model_dir()),
            dtype="float32",
            seed=cfg.rng.seed,
            max_model_len=self.task.seq_len + 1,
            max_num_seqs=GEN_CHUNK,
            logprobs_mode="processed_logprobs",
            max_logprobs=-1,
            tensor_parallel_size=cfg.generation.tp,
            timeout_s=cfg.recovery.step_timeout,
            log_path=log,
        )

    def load_weights(self, state: dict[str, Tensor], version: int, rollout: int, attempt: int = 0) -> str:
        """Load ``state`` (Hugging Face names) as weights version ``version``; emit
        ``engine_weights`` (what the kernels hold) and ``canary_logprobs``; return the total."""
        fault = self.sync_fault(version, rollout, attempt)
        if fault == "stale-weights":
            self.llm.skip_next_load()
        elif fault == "corrupt-engine":
            from ftkit.train.faults.injector import flip_bit

            name = next(iter(state))
            state = {**state, name: state[name].clone()}
            flip_bit(state[name])
        held = self.llm.load_weights(state, version)
        self.version = version
        self.events.emit(
            "engine_weights", rollout=rollout, version=version, engine=self.engine, total=held.total, params=held.params
        )
        self._score_canaries(version, rollout)
        self.events.sync()
        return held.total

    def _score_canaries(self, version: int, rollout: int) -> None:
        import torch

        from ftkit.train.rl.canary import canary_fields, canary_tokens

        tokens, mask = canary_tokens(self.task, self.cfg.rng.seed, GEN_CHUNK)
        pads = self._pads(tokens[:, : self.task.prompt_len])
        lp = torch.zeros(tokens.shape, dtype=torch.float32)  # the last position predicts nothing, a pad 0
        for row in range(tokens.shape[0]):
            first = pads[row]  # vLLM is given the sequence without its prompt's left padding
            scores = self.llm.score(tokens[row, first:].tolist(), allowed=self._allowed())
            lp[row, first:-1] = torch.from_numpy(scores)
        self.events.emit(
            "canary_logprobs", rollout=rollout, version=version, engine=self.engine, **canary_fields(lp, mask)
        )

    def generate(self, prompts: Tensor, rollout: int, first_index: int, greedy: bool = False) -> tuple[Any, Any]:
        """``(responses, logprobs)``: int64 and float32 ``[n, response_len]`` (the module
        docstring); ``greedy``: temperature 0 (``rollout`` and ``first_index`` unused)."""
        import torch

        from ftkit.train.rl.seeds import derive_seed

        n, r, stop = prompts.shape[0], self.task.response_len, self.task.stop_token
        seeds = [derive_seed("sample", self.cfg.rng.seed, rollout, first_index + i) for i in range(n)]
        pads = self._pads(prompts)
        gens = self.llm.generate(
            [row[pads[i] :] for i, row in enumerate(prompts.tolist())],  # without the left padding
            r,
            seeds,
            temperature=0.0 if greedy else 1.0,
            allowed=self._allowed(),
            stop=None if stop is None else [stop],
        )
        out = torch.full((n, r), self.task.pad_token, dtype=torch.int64)  # after a stop: pad, log-prob 0
        logprobs = torch.zeros((n, r), dtype=torch.float32)
        for i, g in enumerate(gens):
            m = len(g.tokens)
            out[i, :m] = torch.from_numpy(g.tokens)
            logprobs[i, :m] = torch.from_numpy(g.logprobs)
        return out, logprobs

    def _pads(self, prompts: Tensor) -> list[int]:
        """The left padding of each prompt row (0 for a task whose prompts are never padded)."""
        pads = self.task.prompt_pads(prompts)
        return [0] * prompts.shape[0] if pads is None else [int(x) for x in pads]

    def _allowed(self) -> tuple[int, ...] | None:
        """The tokens vLLM may sample: the task's response tokens, ``None`` where they are the
        whole vocabulary (no mask to apply)."""
        tokens = self.task.response_tokens
        return None if len(tokens) == self.task.vocab_size else tokens

    def shutdown(self) -> None:
        """Flush and close the event log first (the driver waits for it a bounded time), then
        stop the vLLM process (it may take seconds to exit)."""
        super().shutdown()
        self.llm.close()
