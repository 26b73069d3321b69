"""The typed configuration of ``ftkit train`` (``TrainConfig``): one frozen pydantic model
of sections (``ftkit.train.config.sections``), ``extra="forbid"``.

It is data: built by the command (options, ``--config FILE``, ``--print-config``) or from a
resumed run's ``run.json`` and validated there, without reading anything beyond its values.
What a run derives from it (the model, the task, the faults, the device) and the checks that
need the model's shapes are ``ftkit.train.plan.run_plan.build_plan``'s, once per run; the plan carries
the config to the driver and every actor (validation does not run again on the way). Input comes in either form:
nested (``{"layout": {"tp": 2}}``) or flat by the fields' flat names (``{"tp": 2}``, what the
command line, older ``run.json`` files and older config files give); the record form
(``model_dump``: ``run.json``, the ``run_started`` event, checkpoints, ``--print-config``) is
the flat one, so records keep their shape. Validation gives one clear line per bad value or
bad combination, naming the flat field; ``load_config`` turns a pydantic ``ValidationError``
into ``ftkit.errors.ConfigError`` (exit 2).

The batch geometry is fixed here: a rollout of ``samples_per_rollout`` samples is trained in
``steps_per_rollout`` optimizer steps of ``step_samples`` samples, each cut into
``micro_shards`` micro-shards of ``shard_samples`` samples. A micro-shard is the unit of work a
cell computes, so there must be at least as many micro-shards as cells (``check_geometry``;
what the model's shapes allow is checked with the model, ``ftkit.train.plan.run_plan.check_model_fit``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer, model_validator

import ftkit.train.config.launch as launch
import ftkit.train.config.sections as s
from ftkit.errors import ConfigError
from ftkit.train.config.strict import type_problem

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo


#: Seconds a starting actor may take to join its cell's world (imports on a loaded machine
#: are slow); the driver's TCPStore and the cells' worlds use it. Not a failure detector:
#: faults are detected by ``collective_timeout`` and ``step_timeout``.
STARTUP_TIMEOUT_S = 300.0
#: The hint of every config error (``load_config``, ``ftkit.train.plan.run_plan.build_plan``).
CONFIG_HINT = "Fix the option or the --config file; --print-config shows the values in use."


class TrainConfig(BaseModel):
    """Everything a training run needs to be reproduced (recorded in ``run.json``): first
    what decides the result, then how the run is launched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: s.ModelSection = s.ModelSection()
    batch: s.BatchSection = s.BatchSection()
    task: s.TaskSection = s.TaskSection()
    rng: s.SeedSection = s.SeedSection()
    schedule: s.ScheduleSection = s.ScheduleSection()
    objective: s.ObjectiveSection = s.ObjectiveSection()
    generation: s.GenerationSection = s.GenerationSection()
    sampling: s.SamplingSection = s.SamplingSection()
    reduction: s.ReductionSection = s.ReductionSection()
    compute: s.ComputeSection = s.ComputeSection()
    precision: s.PrecisionSection = s.PrecisionSection()
    layout: s.LayoutSection = s.LayoutSection()
    eval: s.EvalSection = s.EvalSection()
    cluster: launch.ClusterSection = launch.ClusterSection()
    engine: launch.EngineSection = launch.EngineSection()
    recovery: launch.RecoverySection = launch.RecoverySection()
    faults: launch.FaultsSection = launch.FaultsSection()
    dumps: launch.DumpsSection = launch.DumpsSection()
    checkpoints: launch.CheckpointsSection = launch.CheckpointsSection()
    output: launch.OutputSection = launch.OutputSection()

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, values: Any) -> Any:
        """Flat names into their sections (nested sections merged with them); every value
        strictly typed (``ftkit.train.config.strict``), the message naming the flat field."""
        return nest(values) if isinstance(values, dict) else values

    @model_serializer(mode="wrap")
    def _flat(self, handler: Callable[[TrainConfig], dict[str, Any]]) -> dict[str, Any]:
        """The record form: one key per field, its flat name, in section order."""
        nested = handler(self)
        return {leaf.flat: nested[leaf.section][leaf.name] for leaf in leaves().values()}

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        check_geometry(self)
        if not self.reduction.bookkeeping and self.reduction.reduce == "exact":
            # bookkeeping off means the plain float path; say so rather than silently ignore.
            raise ValueError("bookkeeping=false needs reduce='float' (exact reduction is bookkeeping)")
        self._check_objective()
        self._check_sampling()
        self._check_eval()
        etp = self.generation.tp
        if etp != 1 and self.generation.kind != "vllm":
            # what vLLM can split is checked with the model (ftkit.train.plan.run_plan.check_engine_tp)
            raise ValueError(f"engine_tp ({etp}) needs engine_kind='vllm' (ftkit's megatron engines run at TP=1)")
        return self

    def _check_objective(self) -> None:
        """GRPO settings only with ``loss='grpo'``; GRPO computes its log-probs from the
        logits of one stage (``pp=1``)."""
        obj, default = self.objective, s.ObjectiveSection()
        if obj.loss == "grpo":
            if self.layout.pp > 1:
                raise ValueError("loss='grpo' needs pp=1 (its log-probs come from the full logits of one stage)")
            return
        for name in ("clip_low", "clip_high", "kl_coef", "aggregation"):
            if getattr(obj, name) != getattr(default, name):
                raise ValueError(f"{name} applies to loss='grpo' only (this run's loss is {obj.loss!r})")

    def _check_sampling(self) -> None:
        """A temperature other than 0 and 1 only with GRPO (REINFORCE learns the model's own
        cross-entropy, of temperature 1); stop strings and ``ignore_eos`` only with a prompt task."""
        smp = self.sampling
        if smp.temperature not in (0.0, 1.0) and self.objective.loss != "grpo":
            raise ValueError(
                f"temperature {smp.temperature} needs loss='grpo' (reinforce learns the log-probs of temperature 1; "
                "its only other setting is 0: greedy)"
            )
        if (smp.stop or smp.ignore_eos) and self.task.prompts is None:
            what = "stop" if smp.stop else "ignore_eos"
            raise ValueError(f"{what} needs prompts (--prompts FILE): the built-in addition task has no text or eos")

    def _check_eval(self) -> None:
        """``eval_prompts`` are text prompts of a prompt task, scored at each publication."""
        if self.eval.eval_prompts is None:
            return
        if self.task.prompts is None:
            raise ValueError(
                "eval_prompts need prompts (--prompts FILE): the built-in addition task has no text prompts to "
                "score; its eval_reward uses its own held-out problems (drop --eval-prompts)"
            )
        if self.checkpoints.every == 0:
            raise ValueError(
                "eval_prompts are scored at each checkpoint publication; checkpoint_every 0 publishes none"
            )

    # --- derived ----------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (rollouts x steps per rollout)."""
        return self.schedule.rollouts * self.batch.steps_per_rollout

    def dumps_rollout(self, rollout: int) -> bool:
        """Whether rollout ``rollout`` (0-based) is dumped according to ``dump_rollouts``."""
        from ftkit.dumps.rollout_set import dumps_rollout

        return dumps_rollout(self.dumps.rollouts, self.schedule.rollouts, rollout)


def check_geometry(cfg: TrainConfig) -> None:
    """The batch geometry and the cell count must fit together (a ``ValueError`` naming the
    flat fields)."""
    b, cells = cfg.batch, cfg.cluster.cells
    K, M, B = b.steps_per_rollout, b.micro_shards, b.samples_per_rollout
    if B % (K * M):
        raise ValueError(
            f"samples_per_rollout ({B}) must be divisible by steps_per_rollout * micro_shards ({K} * {M} = {K * M})"
        )
    if cfg.recovery.min_cells > cells:
        raise ValueError(f"min_cells ({cfg.recovery.min_cells}) must be at most cells ({cells})")
    if cells > M:
        raise ValueError(f"micro_shards ({M}) must be at least cells ({cells})")
    if B % cfg.task.group_size:
        raise ValueError(f"samples_per_rollout ({B}) must be divisible by group_size ({cfg.task.group_size})")


@dataclass(frozen=True)
class Leaf:
    """One config field: its section, its name there, its flat name and the section's place."""

    section: str
    name: str
    flat: str
    place: s.Place
    info: FieldInfo

    @property
    def cli(self) -> bool:
        """Whether a command-line option sets it (else a --config file only)."""
        extra = self.info.json_schema_extra
        return not (isinstance(extra, dict) and extra.get("cli") is False)


@functools.cache
def leaves() -> dict[str, Leaf]:
    """Every field of ``TrainConfig`` by flat name, in section order."""
    out: dict[str, Leaf] = {}
    for section, info in TrainConfig.model_fields.items():
        cls = info.annotation
        assert isinstance(cls, type) and issubclass(cls, s.Section), f"TrainConfig.{section} is not a section"
        for name, field in cls.model_fields.items():
            flat = field.alias or name
            assert flat not in out, f"flat name {flat!r} in two sections"
            out[flat] = Leaf(section, name, flat, cls.PLACE, field)
    return out


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (flat names, sections, or both; a flat name wins over the same field in a
    section) as sections of field names, each value strictly typed; unknown keys are left in
    place for pydantic to refuse by name."""
    by_leaf, sections = leaves(), TrainConfig.model_fields
    flat: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in values.items():
        if key in sections and isinstance(value, (dict, s.Section)):
            given = value.model_dump() if isinstance(value, s.Section) else value
            for name, v in given.items():
                leaf = next((f for f in by_leaf.values() if f.section == key and name in (f.name, f.flat)), None)
                if leaf is None:
                    rest.setdefault(key, {})[name] = v
                else:
                    flat.setdefault(leaf.flat, v)
        elif key in by_leaf:
            flat[key] = value
        else:
            rest[key] = value
    for name, value in flat.items():
        leaf = by_leaf[name]
        problem = type_problem(leaf.info.annotation, value)
        if problem:
            raise ValueError(f"{name}: {problem}")
        section = rest.setdefault(leaf.section, {})
        if isinstance(section, dict):
            section[leaf.name] = value
    return rest


def _flat_loc(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the flat field name where it is one (``layout.tp`` -> ``tp``)."""
    if len(loc) >= 2 and isinstance(loc[0], str) and isinstance(loc[1], str):
        for leaf in leaves().values():
            if leaf.section == loc[0] and loc[1] in (leaf.name, leaf.flat):
                return ".".join(str(p) for p in (leaf.flat, *loc[2:]))
    return ".".join(str(p) for p in loc)


def load_config(values: dict[str, Any]) -> TrainConfig:
    """Validate ``values`` (flat or nested) into a ``TrainConfig``; any problem is a one-line
    ``ConfigError``."""
    try:
        return TrainConfig.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _flat_loc(tuple(err.get("loc", ())))
        msg = str(err.get("msg", "invalid value"))
        msg = msg.removeprefix("Value error, ")
        raise ConfigError(f"{loc}: {msg}" if loc else msg, hint=CONFIG_HINT) from None
