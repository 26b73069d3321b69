"""The sections of a run's config, each with its ``Place``: what it means for the run.

A section is a small frozen pydantic model; its ``PLACE`` says whether its fields decide the
run's result (a resumed session must keep them: ``resume="fixed"``; the TP x PP layout only
with ``--allow-layout-change``: ``resume="layout"``; the precision only with
``--allow-precision-change``: ``resume="precision"``), or only how the run is launched
(``resume="free"``), and whether they decide which tensors a run's dumps hold and their shapes
(``pairs_dumps``: runs that differ there cannot compare tensor for tensor). Everything that
needs those facts (resume compatibility, dump pairing, the command line) derives them from
here (``ftkit.train.config.places``); a field has a meaning only through its section. The
sections of how a run is launched (``resume="free"``: cells, engines, deadlines, faults, dumps,
checkpoints, output) are in ``ftkit.train.config.launch``.

Each field has a *flat name* (its alias, else its own name): the key of the flat record
``run.json``, the ``run_started`` event and checkpoints hold, and of the command-line option.
Flat names are unique across sections. New kinds of thing plug in as fields of their section:
a Hugging Face path beside ``model.preset``, prompts beside ``task.reward``, a loss kind or
GRPO clip / KL beside ``objective.lr``, the inference engine's kind in ``generation`` (it decides
the samples, so it is fixed on resume; ``engine.count`` is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

if TYPE_CHECKING:
    from ftkit.train.rl.grpo import GrpoConfig

DumpPart = Literal["activations", "grads", "weights"]
DUMP_WHAT: tuple[DumpPart, ...] = ("activations", "grads", "weights")


@dataclass(frozen=True)
class Place:
    """What a section's fields mean for a run (see the module docstring)."""

    resume: Literal["fixed", "layout", "precision", "free"]
    pairs_dumps: bool


#: ``json_schema_extra`` of a field that a ``--config`` file sets but no command-line option does.
FILE_ONLY: JsonDict = {"cli": False}


class Section(BaseModel):
    """A config section: frozen, no unknown fields, fields by name or flat name (alias)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    PLACE: ClassVar[Place]


# --- what determines the result -------------------------------------------------------------
class ModelSection(Section):
    """The model trained: a preset, or a Hugging Face causal-LM directory or ``.gguf`` file.
    Plain data: ``ftkit.train.plan.run_plan.build_plan`` resolves it (``ftkit.model.spec.resolve_model``)
    and records a path absolute, with ``model_digest``, the digest of the model directory's
    content: computed when not given; when given (a resumed run's ``run.json``) the model must
    still have it, else the run would train another model."""

    PLACE = Place("fixed", pairs_dumps=True)
    preset: str = Field(
        "tiny",
        alias="model",
        description="Model: a preset (tiny, small) or the path of a Hugging Face causal-LM directory "
        "or .gguf file (docs/models.md).",
    )
    digest: str = Field(
        "",
        alias="model_digest",
        description="Content digest of the model at a path (recorded by ftkit; empty for a preset).",
        json_schema_extra=FILE_ONLY,
    )


class BatchSection(Section):
    """The batch geometry: a rollout of ``samples_per_rollout`` samples is trained in
    ``steps_per_rollout`` optimizer steps, each cut into ``micro_shards`` micro-shards."""

    PLACE = Place("fixed", pairs_dumps=True)
    samples_per_rollout: int = Field(64, ge=1, description="Samples (prompt+response) per rollout.")
    steps_per_rollout: int = Field(2, ge=1, description="Optimizer steps per rollout.")
    micro_shards: int = Field(8, ge=1, description="Micro-shards per optimizer step.")

    @property
    def step_samples(self) -> int:
        """Samples per optimizer step (B / K)."""
        return self.samples_per_rollout // self.steps_per_rollout

    @property
    def shard_samples(self) -> int:
        """Samples per micro-shard (B / (K * M))."""
        return self.step_samples // self.micro_shards


class TaskSection(Section):
    """What the engines are asked and how their answers are scored."""

    PLACE = Place("fixed", pairs_dumps=True)
    group_size: int = Field(8, ge=1, description="Responses per prompt (advantage group).")
    response_len: int = Field(
        8,
        ge=1,
        description="Tokens per response: the addition task generates exactly this many; with --prompts the "
        "most a response may have (it stops at eos; the rest is padding, not learned).",
    )
    prompts: str | None = Field(
        None,
        description="Prompt dataset: a JSONL file, one object per line (docs/rl.md); needs a model path with a "
        "tokenizer (--model PATH). Default: the embedded addition task.",
    )
    prompts_digest: str = Field(
        "",
        description="Content digest of the prompt file (recorded by ftkit; empty without prompts).",
        json_schema_extra=FILE_ONLY,
    )
    input_key: str = Field("prompt", description="The prompt's key in each line of --prompts.")
    label_key: str = Field(
        "answer", description="The reference answer's key in each line of --prompts (empty: no labels)."
    )
    max_prompt_len: int = Field(
        64,
        ge=1,
        description="Tokens per prompt with --prompts (chat template applied): shorter ones are left-padded, a "
        "longer one is an error naming its line.",
    )
    reward: str = Field(
        "task",
        description="task: the addition task's verifiable reward; deterministic_random: 0/1 from a stable "
        "hash of prompt and response tokens (fault tests); exact_match, format: the built-in text rewards; "
        "MODULE:FUNCTION: a plug-in importable from the working directory or the Python path; NAME: a plug-in "
        "installed in the ftkit.rewards entry-point group (docs/rl.md).",
    )

    @field_validator("prompts")
    @classmethod
    def _absolute_prompts(cls, v: str | None) -> str | None:
        return None if v is None else str(Path(v).absolute())

    @model_validator(mode="after")
    def _prompt_options(self) -> TaskSection:
        # the file's digest is recorded (and a recorded one checked) by ftkit.train.plan.run_plan.build_plan
        if self.prompts is None and self.prompts_digest:
            raise ValueError("prompts_digest is for a prompt file (prompts is not set)")
        if self.prompts is None:
            fields = type(self).model_fields
            given = [n for n in ("input_key", "label_key", "max_prompt_len") if getattr(self, n) != fields[n].default]
            if given:
                raise ValueError(f"{', '.join(given)} apply to prompts only (give --prompts FILE, or drop them)")
        elif self.reward == "task":
            raise ValueError(
                "reward 'task' is the addition task's; with prompts choose a text reward "
                "(e.g. --reward exact_match, or MODULE:FUNCTION)"
            )
        return self

    @field_validator("reward")
    @classmethod
    def _check_reward(cls, v: str) -> str:
        v = v.strip()
        if not v or any(c.isspace() for c in v):
            raise ValueError("reward must be a built-in name, MODULE:FUNCTION or a plug-in name, without spaces")
        return v


class SeedSection(Section):
    """The seed of init, sampling and every RNG stream."""

    PLACE = Place("fixed", pairs_dumps=True)
    seed: int = Field(0, ge=0, description="Seed of init, sampling and every RNG stream.")


class ScheduleSection(Section):
    """How long the run is: a resumed session may raise it (never lower it)."""

    PLACE = Place("free", pairs_dumps=True)
    rollouts: int = Field(8, ge=1, description="Rollouts to train.")


class ObjectiveSection(Section):
    """The loss and the optimizer: REINFORCE, or GRPO (``ftkit.train.rl.grpo``) with its clip
    range, KL coefficient to the frozen initial model and aggregation."""

    PLACE = Place("fixed", pairs_dumps=False)
    lr: float = Field(
        5e-3, ge=0, description="AdamW learning rate (0 trains nothing: the weights stay bitwise the initial ones)."
    )
    loss: Literal["reinforce", "grpo"] = Field(
        "reinforce",
        description="reinforce: -A * log p of the sampled tokens; grpo: PPO-clipped importance ratio against "
        "the engines' recorded log-probs, optional k3 KL to the initial model (docs/rl.md).",
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="GRPO: the ratio is clipped below at 1 - clip_low.")
    clip_high: float = Field(
        0.2, ge=0, allow_inf_nan=False, description="GRPO: the ratio is clipped above at 1 + clip_high (DAPO: 0.28)."
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="GRPO: weight of the k3 KL estimate to the frozen initial model (0: no reference model).",
    )
    aggregation: Literal["token", "sequence"] = Field(
        "token",
        description="GRPO: token (every learned token weighs the same; no length bias) or sequence "
        "(mean per response, then over responses).",
    )

    def grpo(self) -> GrpoConfig:
        """The GRPO objective's settings."""
        from ftkit.train.rl.grpo import GrpoConfig

        return GrpoConfig(self.clip_low, self.clip_high, self.kl_coef, self.aggregation)


class GenerationSection(Section):
    """Which inference engine generates the rollouts (it decides the samples: fixed on resume),
    and how far its log-probs may be from the trainer's (rule FT114)."""

    PLACE = Place("fixed", pairs_dumps=False)
    kind: Literal["megatron", "vllm"] = Field(
        "megatron",
        alias="engine_kind",
        description="megatron: ftkit's megatron-core engine, its log-probs bitwise the trainer's at TP=1; "
        "vllm: real vLLM engines (a Hugging Face --model, scripts/setup_vllm.sh; docs/rl.md).",
    )
    tp: int = Field(
        1,
        ge=1,
        le=8,
        alias="engine_tp",
        description="Tensor-parallel ranks of each vLLM engine (one vLLM worker process per rank; "
        "must split the model's heads); megatron engines run at 1.",
    )
    logprob_tolerance: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="FT114: largest |engine - trainer| token log-prob difference tolerated where they are "
        "not bitwise equal by construction (vllm engines, or tp > 1); above it, a warning. Default: 1e-3 in "
        "fp32, 5e-2 in bf16 (resolved with the precision, recorded in run.json).",
    )

    #: The default ``logprob_tolerance`` of each precision (``ftkit.train.plan.run_plan``): bf16's
    #: 8-bit mantissa moves a TP=2 trainer's log-probs up to 0.008 from a TP=1 engine's where
    #: fp32's move 2.4e-7 (docs/training.md, "Precision").
    TOLERANCE: ClassVar[dict[str, float]] = {"fp32": 1e-3, "bf16": 5e-2}


class SamplingSection(Section):
    """How the engines sample the rollouts' responses, as vLLM and TRL name it (it decides the
    samples: fixed on resume). The log-probs, the engines' and the trainer's, are of the
    temperature-scaled distribution before top-k / top-p (``ftkit.engines.policy``; docs/rl.md,
    "Sampling"). Stop strings and ``ignore_eos`` need a prompt task (``--prompts``): the built-in
    addition task has no text."""

    PLACE = Place("fixed", pairs_dumps=False)
    temperature: float = Field(
        1.0,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="Sampling temperature; 0: greedy (the most likely token; log-probs of temperature 1). "
        "Other than 0 and 1 needs --loss grpo.",
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Nucleus sampling: draw from the most likely tokens whose mass reaches P (1: off).",
    )
    top_k: int = Field(0, ge=0, description="Draw from the K most likely tokens only (0: off).")
    stop: tuple[str, ...] = Field(
        (),
        max_length=16,
        description="A string that ends a response (repeatable; the response keeps its tokens, the reward's "
        "text ends before it, as vLLM's stop).",
    )
    ignore_eos: bool = Field(
        False, description="Do not end a response at the tokenizer's eos token (vLLM's ignore_eos)."
    )

    def describe(self) -> str:
        """The settings that differ from plain sampling at temperature 1, for the run header
        (``""`` when none does): ``temperature 0.7, top-p 0.9, stop ('\\n\\n',)``."""
        default = SamplingSection()
        changed = [
            n
            for n in ("temperature", "top_p", "top_k", "stop", "ignore_eos")
            if getattr(self, n) != getattr(default, n)
        ]
        return ", ".join(f"{n.replace('_', '-')} {getattr(self, n)!r}" for n in changed)

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not v for v in value):
            raise ValueError("an empty stop string would end every response at once")
        return value


class ReductionSection(Section):
    """How gradients are summed across micro-shards and cells."""

    PLACE = Place("fixed", pairs_dumps=False)
    reduce: Literal["exact", "float"] = Field(
        "exact",
        description="exact: int64 fixed-point reduction (membership invariant); "
        "float: plain float all-reduce (faster, not invariant).",
    )
    bookkeeping: bool = Field(
        True,
        description="False turns off fingerprints, witness and exact reduction (overhead bench).",
        json_schema_extra=FILE_ONLY,
    )


class ComputeSection(Section):
    """Where and with how many threads a rank computes (both change float bits)."""

    PLACE = Place("fixed", pairs_dumps=False)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when available.")
    threads_per_rank: int = Field(
        1, ge=1, le=64, description="torch intra-op threads per rank.", json_schema_extra=FILE_ONLY
    )


class PrecisionSection(Section):
    """The number format of training: ``fp32`` computes everything in float32; ``bf16`` runs
    forward and backward in bfloat16 (parameters and activations) and steps AdamW on float32
    master weights, the bf16 weights re-cast from them after each step (docs/training.md,
    "Precision"). It changes bits, so a resume keeps it unless ``--allow-precision-change``
    says otherwise. ``auto`` is resolved with the device once, by the plan
    (``ftkit.train.plan.run_plan.resolve_precision``): ``run.json`` records ``fp32`` or ``bf16``."""

    PLACE = Place("precision", pairs_dumps=False)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="fp32: float32 throughout; bf16: bf16 weights and activations, float32 master weights, "
        "optimizer state and exact reduction (docs/training.md); auto: bf16 on cuda (fp32 on a GPU without "
        "native bf16), fp32 on cpu.",
    )


class LayoutSection(Section):
    """A cell's TP x PP layout: it changes float bits, so a resume keeps it unless
    ``--allow-layout-change`` says otherwise (the change is then logged as one)."""

    PLACE = Place("layout", pairs_dumps=False)
    tp: int = Field(1, ge=1, le=8, description="Tensor-parallel ranks per cell.")
    pp: int = Field(1, ge=1, le=8, description="Pipeline-parallel ranks per cell.")

    @property
    def ranks(self) -> int:
        """Ranks per cell (TP x PP)."""
        return self.tp * self.pp


class EvalSection(Section):
    """How published checkpoints are scored, and on what: ``eval_prompts`` is read like ``task.prompts``
    (its digest recorded and checked the same way); it changes no trained bit, only eval_reward."""

    PLACE = Place("fixed", pairs_dumps=False)
    best_metric: Literal["reward", "eval_reward"] = Field(
        "reward",
        description="What ranks checkpoints: reward (the rollout's mean reward) or eval_reward (mean reward of "
        "the eval set, greedy decoding on the engines, at each publication: --eval-prompts, else the task's "
        "built-in held-out prompts; docs/rl.md).",
    )
    eval_prompts: str | None = Field(
        None,
        description="Held-out eval set: a JSONL file with the keys of --prompts, never trained on, scored greedily "
        "(eval_reward, logged) at each checkpoint publication (needs --prompts; docs/rl.md).",
    )
    eval_prompts_digest: str = Field(
        "",
        description="Content digest of the eval prompt file (recorded by ftkit; empty without eval_prompts).",
        json_schema_extra=FILE_ONLY,
    )

    @field_validator("eval_prompts")
    @classmethod
    def _absolute_eval_prompts(cls, v: str | None) -> str | None:
        return None if v is None else str(Path(v).absolute())

    @model_validator(mode="after")
    def _eval_digest(self) -> EvalSection:
        if self.eval_prompts is None and self.eval_prompts_digest:
            raise ValueError("eval_prompts_digest is for an eval prompt file (eval_prompts is not set)")
        return self
