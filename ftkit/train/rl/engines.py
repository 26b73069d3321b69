"""The inference engines of ``ftkit train``: one generic Ray actor around any engine.

``EngineActor`` is a plain class; the driver wraps it with ``ray.remote`` (one actor per
engine, ``ftkit.train.control.engine_pool``). It holds one ``ftkit.engines.protocol.Engine``,
built by ``build_engine`` from the run's ``generation.kind``: ``megatron`` (ftkit's own
``MegatronEngine``: a TP=1 megatron-core ``GPTModel`` built here, after
``init_local_parallel``, so it has its own world of one and never joins a training group) or
``vllm`` (``VllmEngine``: a vLLM process in the vLLM virtualenv, TP ``engine_tp``, float32,
started from the run's Hugging Face model directory). What is the run's and not the engine's
lives here, the same for every kind: the event log (``engine-r<engine>-i<n>.jsonl``,
``engine_restart`` first when the actor replaces a failed one), the fault points, the canary,
the weights version, the seeds.

Contract:

* ``weights_format()``: what the engine takes (``WeightsFormat``: names, dtype, signed zeros);
  the driver sends the weights in those names (``engine_tensors``) and logs ``weights_sent`` as
  ``expected_weights`` of them (``ftkit.engines.protocol``), whatever the kind.
* ``load_weights(state, version, rollout, attempt=0)`` loads ``state`` in place, emits
  ``engine_weights`` (the engine's ``HeldWeights``: what it computes with afterwards) and
  returns its total, which must equal the driver's ``weights_sent`` total. The
  ``during_weight_sync`` fault point comes first (``stale-weights``: the engine answers as if
  it had loaded but keeps its previous weights, ``Engine.skip_next_load``; ``corrupt-engine``:
  the first tensor is sent with one bit flipped): FT102 reports both, FT114 the log-probs.
  ``attempt``: how many times this version was sent to this engine index before (a restarted
  engine is re-sent it). Then the canary set (``ftkit.train.rl.canary``) is scored
  (``Engine.score_rows``) and logged as ``canary_logprobs``.
* ``generate(prompts, rollout, first_index, greedy=False)`` returns ``(responses, logprobs)``,
  int64 and float32 ``[n, response_len]``: one response per prompt row and the engine's
  float32 log-prob of each token under the policy (the task's response tokens only). Sample
  ``i`` (its global index in the rollout, ``first_index + row``) is seeded with
  ``derive_seed("sample", seed, rollout, i)``, and the pool hands each engine whole chunks of
  ``GEN_CHUNK`` prompts (``split``), so with a batch-invariant engine (the megatron one) a
  response depends only on (weights, prompt, seed, rollout, sample index): never on which
  engine produced it or how many engines there are. A task with a ``stop_token`` (a prompt
  dataset: ``eos``) stops a response at it: the positions after it hold the task's
  ``pad_token`` with log-prob 0 (the driver's ``loss_mask`` leaves them out). A prompt's left
  padding (``RlTask.prompt_pads``) is handed to the engine, which masks it out (megatron) or
  drops it (vLLM). The run's sampling settings (``--temperature``, ``--top-p``, ``--top-k``:
  ``ftkit.engines.policy``) go to the engine; ``--stop`` strings are found afterwards on the
  text (``ftkit.tasks.stops``): the tokens after the one that completes a stop string become
  ``pad_token`` with log-prob 0, as after ``eos``. ``greedy``: temperature 0, the most likely
  allowed token, no random stream drawn (the evaluation of ``--best-metric eval_reward``); a
  position whose logits are not all finite gets the token ``-1`` and log-prob NaN with the
  megatron engine.

vLLM's sampler is not ftkit's inverse-CDF one, so a vLLM run's samples differ from a megatron
run's, and its log-probs differ from the trainer's by vLLM's arithmetic: FT114 holds them to
``--logprob-tolerance`` (a warning above it), not to the bit.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import ftkit.evidence.emit as emit

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.engines.protocol import Engine, WeightsFormat
    from ftkit.model.spec import ModelSpec
    from ftkit.tasks.protocols import RlTask
    from ftkit.tensors.transfer import PackedTensors
    from ftkit.train.plan.run_plan import RunPlan

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


def _megatron(plan: RunPlan, task: RlTask, run_dir: str, engine: int) -> Engine:
    """ftkit's own engine: the run's model at TP=1 in a world of its own, in the run's
    precision (bf16: the weights the cells send, computed with the trainer's kernels)."""
    from ftkit.engines.megatron import MegatronEngine
    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.model.hf_build import precision_dtype
    from ftkit.train.rank.precision import torch_dtype

    cfg = plan.config
    configure_determinism(cfg.compute.threads_per_rank)
    index = plan.placement.engine_device(engine)  # cells sharing GPUs: the placement's device
    init_local_parallel(plan.device, 0 if index is None else index)
    dtype = precision_dtype(plan.precision)  # a bf16 checkpoint read as it is stored (docs/training.md)
    model = build_gpt(plan.model, cfg.rng.seed, plan.device, dtype).eval().to(torch_dtype(plan.precision))
    return MegatronEngine(
        model,
        plan.device,
        pad_token=task.pad_token,
        chunk=GEN_CHUNK,
        vocab_size=task.vocab_size,
        score_chunk=cfg.batch.shard_samples,  # the trainer's micro-shard: its shapes, its bits
        label=f"engine {engine}",
    )


def _vllm(plan: RunPlan, task: RlTask, run_dir: str, engine: int) -> Engine:
    """A vLLM engine on the run's Hugging Face model (its log in ``logs/vllm-engine-<e>.log``)."""
    from ftkit.engines.vllm import VllmEngine

    log = os.path.join(run_dir, "logs", f"vllm-engine-{engine}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    cfg = plan.config
    return VllmEngine(
        str(plan.model.hf_dir),
        dtype="bfloat16" if plan.precision == "bf16" else "float32",
        seed=cfg.rng.seed,
        max_model_len=task.seq_len + 1,
        max_num_seqs=GEN_CHUNK,
        logprobs_mode="processed_logprobs",
        max_logprobs=-1,
        tensor_parallel_size=cfg.generation.tp,
        timeout_s=cfg.recovery.step_timeout,
        log_path=log,
    )


#: The engine of each ``generation.kind``.
ENGINES = {"megatron": _megatron, "vllm": _vllm}


def build_engine(plan: RunPlan, task: RlTask, run_dir: str, engine: int) -> Engine:
    """Engine ``engine`` of the run's ``generation.kind`` (``ENGINES``)."""
    return ENGINES[plan.config.generation.kind](plan, task, run_dir, engine)


def engine_tensors(state: dict[str, Tensor], fmt: WeightsFormat, model: ModelSpec) -> dict[str, Tensor]:
    """``state`` (a cell's TP=1 export: the megatron-core names) in the names the engines take
    (``fmt.names``): as it is, or through ``ftkit.model.hf_export.hf_tensors`` for ``"hf"``."""
    if fmt.names == "megatron":
        return state
    if fmt.names == "hf":
        from ftkit.model.hf_export import hf_tensors

        return hf_tensors([state], model.hf)
    raise ValueError(f"engines that take {fmt.names!r} names are unknown (megatron, hf)")


class EngineActor:
    """One inference engine of ``ftkit train`` (see the module docstring)."""

    def __init__(self, plan: RunPlan, run_dir: str, engine: int, restarted: tuple[str, str] | None = None) -> None:
        """``restarted``: ``(cause, during)`` when this engine replaces one that failed; it is
        logged as ``engine_restart``, the first event of this engine's log."""
        from ftkit.events.writer import EventWriter
        from ftkit.train.control.rundir import run_name
        from ftkit.train.faults.points import injector_for

        self.cfg = plan.config  # validated once, by the command
        self.engine = engine
        self.task = plan.task.build()
        self.version: int | None = None
        self.events = EventWriter(
            os.path.join(run_dir, "events"),
            run=run_name(run_dir),
            role="engine",
            cell=None,
            rank=engine,
        )  # file engine-r<engine>-i<n>.jsonl
        if restarted is not None:
            emit.engine_restart(self.events, engine=engine, cause=restarted[0], during=restarted[1])
            self.events.sync()
        self.faults = injector_for(plan.faults, self.events, "engine", engine=engine)
        self.llm = build_engine(plan, self.task, run_dir, engine)
        tokens = self.task.response_tokens  # None: the whole vocabulary, no mask to apply
        self.allowed = None if len(tokens) == self.task.vocab_size else tokens

    def ready(self) -> int:
        """Returns the engine index once constructed (lets the driver wait for startup)."""
        return self.engine

    def node(self) -> str:
        """The Ray node id (hex) this engine runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def weights_format(self) -> WeightsFormat:
        """What the engine takes: the names, dtype and signed-zero handling of its weights."""
        from ftkit.engines.protocol import WeightsFormat

        return WeightsFormat(self.llm.names, self.llm.dtype, self.llm.signed_zeros)

    def load_weights(
        self, state: dict[str, Tensor] | PackedTensors, version: int, rollout: int, attempt: int = 0
    ) -> str:
        """Load ``state`` as weights version ``version`` (to generate rollout ``rollout``);
        emit ``engine_weights`` and ``canary_logprobs``; return the fingerprint total of what
        the engine holds (the module docstring). ``state``: tensors, or the cell's
        ``PackedTensors`` (views of Ray's object store, only read)."""
        from ftkit.tensors.transfer import PackedTensors

        if isinstance(state, PackedTensors):
            state = state.unpack()
        sync_step = version * self.cfg.batch.steps_per_rollout
        fault = self.faults.at("during_weight_sync", step=sync_step, attempt=attempt, rollout=rollout)
        if fault == "stale-weights":
            self.llm.skip_next_load()
        elif fault == "corrupt-engine":
            from ftkit.train.faults.injector import flip_bit

            name = next(iter(state))
            state = {**state, name: state[name].clone()}
            flip_bit(state[name])
        held = self.llm.load_weights(state, version)
        self.version = version
        emit.engine_weights(
            self.events, rollout=rollout, version=version, engine=self.engine, total=held.total, params=held.params
        )
        self._score_canaries(version, rollout)
        self.events.sync()
        return held.total

    def _score_canaries(self, version: int, rollout: int) -> None:
        """Log ``canary_logprobs``: the engine's log-probs of the canary set under the weights
        just loaded (``ftkit.train.rl.canary``)."""
        import torch

        from ftkit.train.rl.canary import canary_fields, canary_tokens

        tokens, mask = canary_tokens(self.task, self.cfg.rng.seed, GEN_CHUNK)
        pads = self._pads(tokens[:, : self.task.prompt_len])
        # the responses' positions only, as the trainer scores them (ftkit.model.output_positions)
        lp = torch.from_numpy(self.llm.score_rows(tokens.tolist(), self.allowed, pads, self.task.response_len))
        fields = canary_fields(lp, mask)
        emit.canary_logprobs(self.events, rollout=rollout, version=version, engine=self.engine, **fields)

    def generate(self, prompts: Tensor, rollout: int, first_index: int, greedy: bool = False) -> tuple[Tensor, Tensor]:
        """``(responses, logprobs)``: int64 and float32 ``[n, response_len]`` for ``prompts``
        ``[n, P]`` (the module docstring); ``greedy``: ``rollout`` and ``first_index`` unused."""
        import torch

        from ftkit.tensors.seeds import derive_seed

        n, r, stop = prompts.shape[0], self.task.response_len, self.task.stop_token
        smp = self.cfg.sampling
        seeds = [derive_seed("sample", self.cfg.rng.seed, rollout, first_index + i) for i in range(n)]
        gens = self.llm.generate(
            prompts.tolist(),
            r,
            seeds,
            temperature=0.0 if greedy else smp.temperature,
            allowed=self.allowed,
            stop=None if stop is None else [stop],
            pads=self._pads(prompts),
            top_p=smp.top_p,
            top_k=smp.top_k,
        )
        out = torch.full((n, r), self.task.pad_token, dtype=torch.int64)  # after a stop: pad, log-prob 0
        logprobs = torch.zeros((n, r), dtype=torch.float32)
        for i, g in enumerate(gens):
            m = len(g.tokens)
            out[i, :m] = torch.from_numpy(g.tokens)
            logprobs[i, :m] = torch.from_numpy(g.logprobs)
        if smp.stop:  # cut after the token that completes a stop string (ftkit.tasks.stops)
            lengths, _ = self.task.response_ends(out)
            after = torch.arange(r)[None, :] >= lengths[:, None]
            out, logprobs = out.masked_fill(after, self.task.pad_token), logprobs.masked_fill(after, 0.0)
        return out, logprobs

    def _pads(self, prompts: Tensor) -> list[int] | None:
        """The left padding of each prompt row, None for a task whose prompts are never padded."""
        pads = self.task.prompt_pads(prompts)
        return None if pads is None else [int(x) for x in pads]

    def shutdown(self) -> None:
        """Flush and close the event log first (the driver waits for it a bounded time), then
        close the engine (a vLLM process may take seconds to exit)."""
        self.events.close()
        self.llm.close()
