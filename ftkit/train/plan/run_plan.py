"""The run plan of ``ftkit train``: everything a run derives from its config, derived once.

A ``TrainConfig`` is data (what ``run.json`` records). ``build_plan(cfg)`` is the one place
that reads the world for it: it resolves ``--model`` (``ftkit.model.spec.resolve_model``: the
directory read and digested once), checks what needs the model's shapes (the layout, the
sequence length, prompts and vLLM against a preset, ``engine_tp`` against the heads), parses
the fault specs against the run's bounds and picks the device and, with it, the precision
(``auto``: bf16 on CUDA with native bf16, else fp32; recorded resolved, so a resumed session
keeps it). The command builds the plan (``ftkit train``, ``--resume``, ``--print-config``) and
hands it down: the driver, the cells'
rank workers and the engine actors take a ``RunPlan`` and derive nothing from the config
again. A ``RunPlan`` is a frozen value that pickles cheaply (Ray actors receive it by value):
the task travels as the ``TaskSpec`` that builds it, not as the task (a tokenizer and a
dataset).

Every problem is exit 2 with one line: a ``ConfigError`` with the same message and hint a
config validation error has (``ftkit.train.config.run.load_config``), an ``InputError`` for a
model path that is not a model, a ``ModelConfigError`` for a ``config.json`` ftkit cannot
represent.

Where a run is placed (cells and engines over the nodes, their GPU shares) and what a resumed
session starts from (its checkpoint, epochs, incarnations) need Ray and the locked run
directory: the driver plans them (``ftkit.train.control.placement``, ``RunPlan.placement`` from
``ftkit.train.plan.placement``, ``ftkit.train.recovery.resume_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.errors import ConfigError
from ftkit.train.config.run import CONFIG_HINT, TrainConfig

if TYPE_CHECKING:
    from ftkit.model.spec import ModelSpec
    from ftkit.tasks.protocols import RlTask
    from ftkit.train.faults.spec import FaultBounds, FaultSpec
    from ftkit.train.plan.placement import Placement


@dataclass(frozen=True)
class TaskSpec:
    """What builds a run's task (``build``): the prompt dataset ``prompts`` through the tokenizer
    of ``model_dir`` (its responses ending as ``stop`` / ``ignore_eos`` say), else the built-in
    addition task, over the synthetic vocabulary for a preset (``model_dir`` None), over the
    model's tokenizer for a model path."""

    response_len: int
    model_dir: Path | None = None
    vocab_size: int = 0
    prompts: Path | None = None
    input_key: str = "prompt"
    label_key: str | None = None
    max_prompt_len: int = 0
    eval_prompts: Path | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def build(self) -> RlTask:
        """The task; ``ConfigError`` (exit 2) for a ``response_len`` the addition task refuses,
        an unusable tokenizer or prompt file."""
        from ftkit.tasks.addition import task_for

        if self.prompts is not None:
            from ftkit.tasks.prompt_task import prompt_task

            assert self.model_dir is not None, "prompts need a model path (build_plan checks it)"
            return prompt_task(
                self.prompts,
                self.model_dir,
                self.vocab_size,
                input_key=self.input_key,
                label_key=self.label_key,
                max_prompt_len=self.max_prompt_len,
                response_len=self.response_len,
                eval_path=self.eval_prompts,
                stop=self.stop,
                ignore_eos=self.ignore_eos,
            )
        try:
            return task_for(self.response_len, self.model_dir, self.vocab_size)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="raise --max-response-len (config: response_len)") from None


@dataclass(frozen=True)
class RunPlan:
    """One run, planned (module docstring): ``config`` (model path absolute, its digest
    recorded: the form ``run.json`` holds), ``model``, ``task`` (what builds it), ``faults``
    (``--inject`` then the ``--chaos`` expansion), ``device`` (``cpu`` or ``cuda``) and
    ``placement`` (``ftkit.train.plan.placement``: GPU shares, devices, the cross-cell backend;
    ``build_plan`` gives a GPU to each actor, the driver, connected to Ray, replaces it with the
    plan of the cluster's GPUs); its ``precision`` is the config's, resolved with the device
    (``fp32`` or ``bf16``)."""

    config: TrainConfig
    model: ModelSpec
    task: TaskSpec
    faults: tuple[FaultSpec, ...]
    device: str
    placement: Placement

    @property
    def precision(self) -> str:
        """``fp32`` or ``bf16`` (``config.precision``, resolved by ``build_plan``)."""
        return self.config.precision.precision


def build_plan(cfg: TrainConfig) -> RunPlan:
    """The ``RunPlan`` of ``cfg`` (module docstring); resolves the model once."""
    from ftkit.model.spec import resolve_model
    from ftkit.train.faults.schedule import parse_specs

    try:
        model = resolve_model(cfg.model.preset, cfg.model.digest)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}", hint=CONFIG_HINT) from None
    cfg = recorded(cfg, model)
    device = resolve_device(cfg)
    precision = resolve_precision(cfg.precision.precision, device)
    if precision != cfg.precision.precision:
        cfg = cfg.model_copy(update={"precision": cfg.precision.model_copy(update={"precision": precision})})
    if cfg.generation.logprob_tolerance is None:  # the precision's (GenerationSection.TOLERANCE)
        tolerance = cfg.generation.TOLERANCE[precision]
        cfg = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"logprob_tolerance": tolerance})})
    try:
        check_model_fit(cfg, model)
        faults = tuple(parse_specs(cfg.faults.inject, cfg.faults.chaos, fault_bounds(cfg)))
    except ValueError as exc:
        raise ConfigError(str(exc), hint=CONFIG_HINT) from None
    return RunPlan(cfg, model, task_spec(cfg, model), faults, device, whole_gpus(device, cfg.layout.ranks))


def recorded(cfg: TrainConfig, model: ModelSpec) -> TrainConfig:
    """``cfg`` as ``run.json`` records it: the model's resolved name and digest, and the prompt
    file's digest (``ConfigError`` when a recorded one differs: the file has changed;
    ``InputError`` for a missing file)."""
    update: dict[str, Any] = {}
    if (model.name, model.digest) != (cfg.model.preset, cfg.model.digest):
        update["model"] = cfg.model.model_copy(update={"preset": model.name, "digest": model.digest})
    t, e = cfg.task, cfg.eval
    if t.prompts is not None:
        update["task"] = t.model_copy(update={"prompts_digest": file_digest("task", t.prompts, t.prompts_digest)})
    if e.eval_prompts is not None:
        digest = file_digest("eval", e.eval_prompts, e.eval_prompts_digest)
        update["eval"] = e.model_copy(update={"eval_prompts_digest": digest})
    return cfg.model_copy(update=update) if update else cfg


def file_digest(section: str, path: str, recorded: str) -> str:
    """The content digest of the prompt file ``path``; ``ConfigError`` when ``recorded`` (a
    resumed run's) is set and differs: the file has changed since the run started."""
    from ftkit.tasks.jsonl import JsonlPrompts

    digest = JsonlPrompts(path).digest()
    if recorded and recorded != digest:
        raise ConfigError(
            f"{section}: the prompt file {path} has changed: its content digest is {digest}, "
            f"the run recorded {recorded}",
            hint=CONFIG_HINT,
        )
    return digest


def eval_warnings(cfg: TrainConfig, task: RlTask) -> list[str]:
    """What the user should know about the eval set of ``cfg`` (``task`` built): eval prompts
    that are also training prompts (``PromptTask.eval_overlap``), or ``eval_reward`` ranking a
    prompt task's checkpoints by training prompts (no ``--eval-prompts``)."""
    if cfg.task.prompts is None:
        return []
    if cfg.eval.eval_prompts is None:
        if cfg.eval.best_metric != "eval_reward":
            return []
        return [
            "--best-metric eval_reward without --eval-prompts scores the first prompts of --prompts, which are "
            "trained on; give --eval-prompts FILE for a held-out set"
        ]
    from ftkit.tasks.prompt_task import PromptTask

    overlap = task.eval_overlap if isinstance(task, PromptTask) else 0
    if not overlap:
        return []
    return [
        f"{overlap} prompt(s) of the eval set {cfg.eval.eval_prompts} also appear in --prompts "
        f"{cfg.task.prompts}: they are trained on, so eval_reward is not held out for them"
    ]


def check_model_fit(cfg: TrainConfig, model: ModelSpec) -> None:
    """The layout, the task and the engines must fit ``model`` (a ``ValueError`` naming the
    flat fields; a ``ModelConfigError`` from the architecture's own layout check)."""
    name, tp, pp, arch = model.name, cfg.layout.tp, cfg.layout.pp, model.arch
    if cfg.task.prompts is not None and model.is_preset:
        raise ValueError(
            f"prompts need a model with a tokenizer; the preset {name!r} has none "
            "(give --model PATH, a Hugging Face model directory, or drop --prompts for the addition task)"
        )
    arch.check_layout(tp, pp)
    if arch.tied and pp > 1:
        # megatron-core syncs a tied embedding over its pipeline stages' embedding group
        # (CUDA only), and the cells' exact reduction does not hold that copy in step.
        raise ValueError(f"pp ({pp}) with the model's tied embeddings is not supported yet (use pp 1)")
    t = cfg.task
    if t.prompts is not None:
        if t.max_prompt_len + t.response_len > arch.max_seq_len:
            raise ValueError(
                f"max_prompt_len + response_len ({t.max_prompt_len} + {t.response_len}) must be at "
                f"most the {name} model's sequence length ({arch.max_seq_len})"
            )
    elif t.response_len >= arch.max_seq_len // 2:
        raise ValueError(
            f"response_len ({t.response_len}) must be below half the {name} model's "
            f"sequence length ({arch.max_seq_len})"
        )
    if cfg.generation.kind == "vllm" and model.is_preset:
        raise ValueError(
            f"engine_kind='vllm' needs a Hugging Face model (--model PATH): vLLM cannot load the {name!r} preset"
        )
    check_engine_tp(cfg.generation.tp, model)


def check_engine_tp(etp: int, model: ModelSpec) -> None:
    """``engine_tp`` > 1 only where vLLM can split the model: query heads and the MLP divide by
    it, key/value heads divide it or are divided by it (``engine_kind='vllm'``: the config's
    own check)."""
    if etp == 1:
        return
    arch = model.arch
    for what, n in (("num_attention_heads", arch.num_heads), ("intermediate_size", arch.ffn_hidden_size)):
        if n % etp:
            raise ValueError(f"engine_tp ({etp}) must divide the model's {what} ({n})")
    kv = arch.num_kv_heads
    if kv % etp and etp % kv:
        raise ValueError(f"engine_tp ({etp}) and the model's num_key_value_heads ({kv}) must divide one another")


def task_spec(cfg: TrainConfig, model: ModelSpec) -> TaskSpec:
    """What builds ``cfg``'s task for ``model`` (``TaskSpec``)."""
    t = cfg.task
    if model.is_preset:
        return TaskSpec(t.response_len)
    return TaskSpec(
        t.response_len,
        model.hf_dir,
        model.hf.vocab_size,
        None if t.prompts is None else Path(t.prompts),
        t.input_key,
        t.label_key or None,
        t.max_prompt_len,
        None if cfg.eval.eval_prompts is None else Path(cfg.eval.eval_prompts),
        cfg.sampling.stop,
        cfg.sampling.ignore_eos,
    )


def fault_bounds(cfg: TrainConfig) -> FaultBounds:
    """What a fault spec may name in ``cfg``'s run (cells, ranks, engines, steps)."""
    from ftkit.train.faults.spec import FaultBounds

    return FaultBounds(
        cfg.cluster.cells, cfg.layout.ranks, cfg.engine.count, cfg.total_steps, cfg.batch.steps_per_rollout
    )


def whole_gpus(device: str, ranks: int) -> Placement:
    """The placement before the cluster is known: a whole GPU per actor on CUDA, no sharing."""
    from ftkit.train.plan.placement import Placement

    if device != "cuda":
        return Placement(device, ranks_per_cell=ranks)
    return Placement(device, 1.0, 1.0, "nccl", False, ranks)


def resolve_device(cfg: TrainConfig) -> str:
    """``cpu`` or ``cuda``; ``auto`` picks cuda when torch sees a GPU (imports torch then)."""
    if cfg.compute.device != "auto":
        return cfg.compute.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_precision(precision: str, device: str) -> str:
    """``fp32`` or ``bf16``: ``auto`` is bf16 on cuda (fp32 on a visible GPU without native bf16,
    before Ampere), fp32 on cpu. ``ConfigError`` (exit 2) for bf16 on a CUDA device without
    native bf16 (torch would emulate it, slower than fp32); CPU torch computes bf16 everywhere
    (slower than fp32 on most CPUs: docs/training.md, "Precision")."""
    if device != "cuda" or precision == "fp32":
        return "fp32" if precision == "auto" else precision
    import torch

    if not torch.cuda.is_available() or torch.cuda.is_bf16_supported(including_emulation=False):
        return "bf16"  # (a driver without a GPU decides for a cluster's: bf16)
    if precision == "auto":
        return "fp32"
    raise ConfigError(
        f"precision: bf16, but the CUDA device {torch.cuda.get_device_name()} has no bf16 support",
        hint="use --precision fp32 on this GPU (bf16 needs compute capability 8.0 or newer)",
    )
