"""The report's view of engine-vs-trainer log-probs: per step, per response position, per version.

``LogprobView`` folds the ``logprob_check`` events (GRPO runs: a rollout's first step) and the
``canary_logprobs`` events (every ``ftkit train`` run at ``pp=1``) of a log into the tables the
HTML report draws (``ftkit.report.logprob_html``): for each checked step the compared tokens,
the differing ones, max / mean |delta| and the mean k3; the same by response position over the
whole run; and for each weights version how many engines and trainers scored the canary set
and how far the engines' scores are from the first trainer's. The verdict on them is rule
FT114's; this is what a reader looks at to see *where* a mismatch sits. Sums and maxima only,
so the view does not depend on the order of the events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tally:
    """Compared tokens and their mismatch figures (sums, for means over the finite tokens)."""

    tokens: int = 0
    differing: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    abs_sum: float = 0.0
    k3_sum: float = 0.0

    def add(self, stats: dict[str, Any]) -> None:
        tokens, nonfinite = int(stats["tokens"]), int(stats["nonfinite"])
        finite = max(0, tokens - nonfinite)
        self.tokens += tokens
        self.differing += int(stats["differing"])
        self.nonfinite += nonfinite
        self.max_abs = max(self.max_abs, float(stats["max_abs"]))
        self.abs_sum += float(stats["mean_abs"]) * finite
        self.k3_sum += float(stats["k3"]) * finite

    @property
    def mean_abs(self) -> float:
        return self.abs_sum / max(1, self.tokens - self.nonfinite)

    @property
    def k3(self) -> float:
        return self.k3_sum / max(1, self.tokens - self.nonfinite)


@dataclass
class CanaryVersion:
    """One weights version's canary scores: the first trainer's, and each engine's distance to it."""

    trainer: list[float] | None = None
    trainers: int = 0
    engines: dict[int, list[float]] = field(default_factory=dict)

    def compared(self) -> tuple[int, int, float]:
        """``(engines compared, differing tokens summed over them, max |delta|)``."""
        if self.trainer is None:
            return 0, 0, 0.0
        n, differing, worst = 0, 0, 0.0
        for values in self.engines.values():
            n += 1
            if len(values) != len(self.trainer):
                differing += max(len(values), len(self.trainer))
                worst = math.inf
                continue
            for a, b in zip(values, self.trainer):
                if a != b:
                    differing += 1
                    d = abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
                    worst = max(worst, d)
        return n, differing, worst


@dataclass
class LogprobView:
    steps: dict[tuple[int, int], Tally] = field(default_factory=dict)  # (rollout, step) -> tally
    positions: dict[int, Tally] = field(default_factory=dict)
    canaries: dict[int, CanaryVersion] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.steps or self.canaries)

    def check(self, ev: dict[str, Any]) -> None:
        """A ``logprob_check`` event."""
        self.steps.setdefault((int(ev["rollout"]), int(ev["step"])), Tally()).add(ev["total"])
        for k, stats in enumerate(ev["positions"]):
            self.positions.setdefault(k, Tally()).add(stats)

    def canary(self, ev: dict[str, Any]) -> None:
        """A ``canary_logprobs`` event (engine or trainer)."""
        values = [float(x) for x in ev["logprobs"]]
        version = self.canaries.setdefault(int(ev["version"]), CanaryVersion())
        if ev.get("engine") is not None:
            version.engines.setdefault(int(ev["engine"]), values)
        else:
            version.trainers += 1
            if version.trainer is None:
                version.trainer = values
