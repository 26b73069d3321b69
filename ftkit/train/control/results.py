"""What ``run_training`` reports: ``StepOutcome`` (a committed step, as the step coordinator
returns it), ``StepReport`` after every committed step (live progress),
``RunResult`` at the end (with ``analyze``: the analyzer's result over the run's own log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftkit.train.config import TrainConfig


@dataclass
class StepOutcome:
    """A committed step (a step that cannot commit raises ``RunFailed`` instead)."""

    rollout: int
    step: int
    attempts: int  # attempts it took (1 without faults)
    loss: float
    grad_norm: float
    tokens: int
    seconds: float  # from the first attempt's start to the commit
    cells_alive: int  # live cells after the step
    phases: dict[str, float] = field(default_factory=dict)  # ``ftkit.train.control.step_clock.attempt_phases``
    shard_seconds: list[float | None] = field(default_factory=list)  # per micro-shard, of the committed attempt
    metrics: dict[str, float] = field(default_factory=dict)  # the ranks' RL metrics (``Reduced.metrics``)


@dataclass
class StepReport:
    """What the driver knows after one committed optimizer step (for live progress)."""

    rollout: int
    rollouts: int
    step: int
    steps: int
    attempts: int  # attempts the step took to commit (1 without faults)
    loss: float
    grad_norm: float
    reward: float
    tokens_per_s: float
    seconds: float
    cells_alive: int
    cells: int
    # the rollout's metrics (``ftkit.train.rl.rollout_stats``) and the step's (``StepOutcome.metrics``)
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, out: StepOutcome, cfg: TrainConfig, rollout_values: dict[str, float], tokens_per_s: float
    ) -> StepReport:
        """The report of the committed step ``out`` of a run of ``cfg`` (``rollout_values``: its
        rollout's ``metric`` values, ``reward`` the mean reward)."""
        reward = rollout_values["reward"]
        return cls(
            out.rollout,
            cfg.schedule.rollouts,
            out.step,
            cfg.total_steps,
            out.attempts,
            out.loss,
            out.grad_norm,
            reward,
            tokens_per_s,
            out.seconds,
            out.cells_alive,
            cfg.cluster.cells,
            {**{k: v for k, v in rollout_values.items() if k != "reward"}, **out.metrics},
        )

    @property
    def committed(self) -> bool:
        """Always true: a step that cannot commit ends the run (``RunFailed``) instead."""
        return True


@dataclass
class RunResult:
    """The outcome of ``run_training``."""

    run_dir: Path
    run: str
    steps_committed: int
    steps_total: int
    seconds: float
    final_files: list[str]
    rewards: list[float] = field(default_factory=list)  # mean reward per rollout (of this session)
    engine_totals: list[list[str]] = field(default_factory=list)  # per version from first_rollout, per engine
    analysis: Any = None  # ftkit.analysis.engine result
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # one per publication boundary
    first_rollout: int = 0  # the first rollout this session trained (> 0: resumed from a checkpoint)


def analyze(run_dir: Path) -> Any:
    """The analyzer's result over the run's own event log."""
    from ftkit.analysis.engine import analyze_paths

    return analyze_paths([run_dir / "events"])
