"""The types of a run's timeline (built by ``ftkit.analysis.timeline.build_timeline``).

A :class:`Timeline` holds cell lanes of state :class:`Interval` s, :class:`Marker` s (one
event worth drawing: a fault, a heal, a reconfigure, ...; with the file and line it was
logged at) and :class:`StepBin` s (step attempts and metric statistics aggregated over
``width`` consecutive steps). Times are the log's unix seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ftkit.analysis.logprob_view import LogprobView


@dataclass
class Interval:
    state: str
    start: float
    end: float
    reason: str | None = None


@dataclass
class Marker:
    kind: str  # fault | detected | heal | reconfigure | discarded | weights | engine | checkpoint | rejected
    time: float
    lane: str  # "driver", "steps", "cell N", "engine N"
    label: str
    file: str
    line: int
    step: int | None = None


@dataclass
class StepBin:
    first: int  # first step of the bin (bin covers [first, first + width))
    t0: float = math.inf
    t1: float = -math.inf
    steps: int = 0
    attempts: int = 0
    committed: int = 0
    not_committed: int = 0
    metrics: dict[str, list[float]] = field(default_factory=dict)  # name -> [n, sum, min, max]

    def merge(self, other: StepBin) -> None:
        self.t0, self.t1 = min(self.t0, other.t0), max(self.t1, other.t1)
        self.steps += other.steps
        self.attempts += other.attempts
        self.committed += other.committed
        self.not_committed += other.not_committed
        for name, (n, s, lo, hi) in other.metrics.items():
            add_stat(self.metrics, name, n, s, lo, hi)


@dataclass
class Timeline:
    run: str | None = None
    status: str | None = None
    start: float = math.inf
    end: float = -math.inf
    events: int = 0
    lanes: dict[str, list[Interval]] = field(default_factory=dict)
    markers: list[Marker] = field(default_factory=list)
    bins: list[StepBin] = field(default_factory=list)
    width: int = 1  # steps per bin
    metric_names: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    strides: dict[str, int] = field(default_factory=dict)  # "kind@lane" -> one routine marker kept per N
    skipped: int = 0
    logprobs: LogprobView = field(default_factory=LogprobView)

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 0.0) if self.events else 0.0

    def markers_of(self, *kinds: str) -> list[Marker]:
        return [m for m in self.markers if m.kind in kinds]


def add_stat(stats: dict[str, list[float]], name: str, n: float, s: float, lo: float, hi: float) -> None:
    cur = stats.get(name)
    if cur is None:
        stats[name] = [n, s, lo, hi]
    else:
        cur[0] += n
        cur[1] += s
        cur[2] = min(cur[2], lo)
        cur[3] = max(cur[3], hi)
