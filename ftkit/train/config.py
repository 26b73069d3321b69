"""The typed configuration of ``ftkit train`` (``TrainConfig``).

One pydantic model, ``extra="forbid"``, shared by the command (options, ``--config FILE``,
``--print-config``), the driver and every rank worker (which receives it as a plain dict via
``model_dump()``). Validation gives one clear line per bad value or bad combination;
``load_config`` turns a pydantic ``ValidationError`` into ``ftkit.errors.ConfigError`` (exit 2).

The batch geometry is fixed here: a rollout of ``samples_per_rollout`` samples is trained in
``steps_per_rollout`` optimizer steps of ``step_samples`` samples, each cut into
``micro_shards`` micro-shards of ``shard_samples`` samples. A micro-shard is the unit of work a
cell computes, so there must be at least as many micro-shards as cells.
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ftkit.errors import ConfigError

if TYPE_CHECKING:
    from ftkit.train.faults import FaultSpec

DumpPart = Literal["activations", "grads", "weights"]
DUMP_WHAT: tuple[DumpPart, ...] = ("activations", "grads", "weights")
#: Seconds a starting actor may take to join its cell's world (imports on a loaded machine
#: are slow); the driver's TCPStore and the cells' worlds use it. Not a failure detector:
#: faults are detected by ``collective_timeout`` and ``step_timeout``.
STARTUP_TIMEOUT_S = 300.0


class TrainConfig(BaseModel):
    """Everything a training run needs to be reproduced (recorded in ``run.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(Path("runs/train"), description="Run directory to create.")
    overwrite: bool = Field(False, description="Replace an existing run directory.")
    cells: int = Field(2, ge=1, le=64, description="Independent model replicas (cells).")
    tp: int = Field(1, ge=1, le=8, description="Tensor-parallel ranks per cell.")
    pp: int = Field(1, ge=1, le=8, description="Pipeline-parallel ranks per cell.")
    engines: int = Field(1, ge=1, le=16, description="Inference engine actors.")
    rollouts: int = Field(8, ge=1, description="Rollouts to train.")
    steps_per_rollout: int = Field(2, ge=1, description="Optimizer steps per rollout.")
    samples_per_rollout: int = Field(64, ge=1, description="Samples (prompt+response) per rollout.")
    group_size: int = Field(8, ge=1, description="Responses per prompt (advantage group).")
    micro_shards: int = Field(8, ge=1, description="Micro-shards per optimizer step.")
    model: Literal["tiny", "small"] = Field("tiny", description="Model preset.")
    seed: int = Field(0, ge=0, description="Seed of init, sampling and every RNG stream.")
    reduce: Literal["exact", "float"] = Field(
        "exact",
        description="exact: int64 fixed-point reduction (membership invariant); "
        "float: plain float all-reduce (faster, not invariant).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when available.")
    ray_address: str | None = Field(
        None,
        description="Join this Ray cluster (host:port of its head) instead of starting a local one; "
        "cells and engines are spread over its nodes (docs/clusters.md).",
    )
    lr: float = Field(5e-3, gt=0, description="AdamW learning rate.")
    threads_per_rank: int = Field(1, ge=1, le=64, description="torch intra-op threads per rank.")
    response_len: int = Field(8, ge=1, description="Generated tokens per response.")
    reward: Literal["task", "deterministic_random"] = Field(
        "task",
        description="task: the addition task's verifiable reward; deterministic_random: "
        "0/1 from a stable hash of prompt and response tokens (fault tests).",
    )
    dump_rollouts: str = Field(
        "first,last",
        description="Rollouts to dump: 'none', 'all', or a comma list of 'first', 'last' and rollout indices.",
    )
    dump_what: tuple[DumpPart, ...] = Field(DUMP_WHAT, description="What dumps hold.")
    dump_cells: Literal["first", "all"] = Field(
        "first", description="Replicated state dumped by the first live cell, or by all cells."
    )
    collective_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a cross-cell collective waits for a peer before the step is discarded "
        "(a dead or hung cell).",
    )
    step_timeout: float = Field(
        60.0, gt=0, description="Seconds a step attempt may take before its unfinished cells are declared hung."
    )
    min_cells: int = Field(1, ge=1, description="Fewest live cells to go on with; below it the run fails (exit 1).")
    max_retries: int = Field(5, ge=0, description="Retries of one step after failed attempts; then the run fails.")
    heal: bool = Field(True, description="Restart failed cells and heal them from a live peer.")
    heal_timeout: float = Field(
        120.0, gt=0, description="Seconds a restarted cell may take to be placed and start before it is given up."
    )
    inject: tuple[str, ...] = Field(
        (),
        description="Faults to inject, one spec each: kind=...,point=...,cell=...,step=... (docs/fault-injection.md).",
    )
    chaos: str | None = Field(
        None, description="Random faults: mtbf=SECONDS,seed=N,max=K[,step_s=S] (docs/fault-injection.md)."
    )
    checkpoint_every: int = Field(
        1,
        ge=0,
        description="Publish a checkpoint every N rollouts (0: never; any --tp/--pp, stored in the TP=1/PP=1 "
        "layout; docs/checkpoints.md).",
    )
    keep_last: int = Field(2, ge=1, description="Checkpoints kept: the newest N ...")
    keep_best: int = Field(1, ge=0, description="... plus the best K by --best-metric (finite, untainted).")
    best_metric: Literal["reward", "eval_reward"] = Field(
        "reward",
        description="What ranks checkpoints: reward (the rollout's mean reward) or eval_reward (mean reward of "
        "the run's fixed held-out prompts, greedy decoding on the engines, at each publication).",
    )
    bookkeeping: bool = Field(
        True, description="False turns off fingerprints, witness and exact reduction (overhead bench)."
    )

    @model_validator(mode="before")
    @classmethod
    def _strict_types(cls, values: Any) -> Any:
        """Values are typed strictly, whether from options or a config file: an integer field
        takes an integer (not ``true``, not ``"2"``, not ``2.0``), a float field a finite number
        (not ``inf``, not NaN), a flag a boolean, a text field a string, a list field a list of
        strings. The message names the field."""
        if not isinstance(values, dict):
            return values
        for name, value in values.items():
            field = cls.model_fields.get(name)
            if field is not None:
                problem = _type_problem(field.annotation, value)
                if problem:
                    raise ValueError(f"{name}: {problem}")
        return values

    @field_validator("dump_rollouts")
    @classmethod
    def _check_dump_rollouts(cls, v: str) -> str:
        v = v.strip().lower()
        if v in ("none", "all"):
            return v
        for part in v.split(","):
            part = part.strip()
            if part not in ("first", "last") and not (part.isdigit()):
                raise ValueError(f"{part!r} is not 'first', 'last' or a rollout index")
        return v

    @model_validator(mode="after")
    def _check_geometry(self) -> TrainConfig:
        K, M, B = self.steps_per_rollout, self.micro_shards, self.samples_per_rollout
        if B % (K * M):
            raise ValueError(
                f"samples_per_rollout ({B}) must be divisible by steps_per_rollout * micro_shards ({K} * {M} = {K * M})"
            )
        if self.min_cells > self.cells:
            raise ValueError(f"min_cells ({self.min_cells}) must be at most cells ({self.cells})")
        if self.cells > M:
            raise ValueError(f"micro_shards ({M}) must be at least cells ({self.cells})")
        if B % self.group_size:
            raise ValueError(f"samples_per_rollout ({B}) must be divisible by group_size ({self.group_size})")
        from ftkit.model.presets import get_preset

        preset = get_preset(self.model)
        if preset.num_heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the {self.model} model's heads ({preset.num_heads})")
        if preset.vocab_size % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the vocabulary ({preset.vocab_size})")
        if preset.num_layers % self.pp:
            raise ValueError(
                f"pp ({self.pp}) must divide the {self.model} model's {preset.num_layers} layers "
                "(each pipeline stage holds the same number)"
            )
        if self.response_len >= preset.max_seq_len // 2:
            raise ValueError(
                f"response_len ({self.response_len}) must be below half the {self.model} model's "
                f"sequence length ({preset.max_seq_len})"
            )
        from ftkit.train.faults import parse_specs

        parse_specs(self.inject, self.chaos, self)  # a bad spec is a one-line ValueError
        if not self.bookkeeping and self.reduce == "exact":
            # bookkeeping off means the plain float path; say so rather than silently ignore.
            raise ValueError("bookkeeping=false needs reduce='float' (exact reduction is bookkeeping)")
        return self

    # --- derived geometry -------------------------------------------------------------
    @property
    def step_samples(self) -> int:
        """Samples per optimizer step (B / K)."""
        return self.samples_per_rollout // self.steps_per_rollout

    @property
    def shard_samples(self) -> int:
        """Samples per micro-shard (B / (K * M))."""
        return self.step_samples // self.micro_shards

    def fault_specs(self) -> list[FaultSpec]:
        """The faults to inject: ``inject`` then the ``chaos`` expansion (ftkit.train.faults)."""
        from ftkit.train.faults import parse_specs

        return parse_specs(self.inject, self.chaos, self)

    def resolved_device(self) -> str:
        """``cpu`` or ``cuda``; ``auto`` picks cuda when torch sees a GPU (imports torch)."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def dumps_rollout(self, rollout: int) -> bool:
        """Whether rollout ``rollout`` (0-based) is dumped according to ``dump_rollouts``."""
        if self.dump_rollouts == "none":
            return False
        if self.dump_rollouts == "all":
            return True
        wanted: set[int] = set()
        for part in self.dump_rollouts.split(","):
            part = part.strip()
            wanted.add(0 if part == "first" else self.rollouts - 1 if part == "last" else int(part))
        return rollout in wanted


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 40 else f"{text} ({type(value).__name__})"


def _type_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` does not strictly have type ``annotation`` (None when it does, or when the
    annotation is not one this check knows: pydantic then decides)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [_type_problem(a, value) for a in args]
        return None if any(p is None for p in problems) else next(p for p in problems if p)
    if annotation is type(None):
        return None if value is None else "expected nothing (null)"
    if annotation is bool:
        return None if isinstance(value, bool) else f"expected true or false, got {_describe(value)}"
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"expected an integer, got {_describe(value)}"
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {_describe(value)}"
        return None if math.isfinite(value) else f"expected a finite number, got {value}"
    if annotation is str or origin is Literal:
        return None if isinstance(value, str) else f"expected a string, got {_describe(value)}"
    if annotation is Path:
        return None if isinstance(value, (str, PurePath)) else f"expected a path (a string), got {_describe(value)}"
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return f"expected a list, got {_describe(value)}"
        inner = args[0] if args else Any
        for item in value:
            problem = _type_problem(inner, item)
            if problem:
                return f"in the list: {problem}"
        return None
    return None


def load_config(values: dict[str, Any]) -> TrainConfig:
    """Validate ``values`` into a ``TrainConfig``; any problem is a one-line ``ConfigError``."""
    try:
        return TrainConfig.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid value"))
        msg = msg.removeprefix("Value error, ")
        raise ConfigError(
            f"{loc}: {msg}" if loc else msg,
            hint="Fix the option or the --config file; --print-config shows the values in use.",
        ) from None
