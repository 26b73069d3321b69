"""Fake cells for the driver-side unit tests: no Ray, no processes, no sleeping.

A ``FakeRef`` answers at a moment of a fake clock with a value or a problem (``dead``,
``exception``, ``collective``), or never. ``FakeRefs`` gives ``RefWaiter`` its primitives
over them (``poll`` advances the clock to the next answer, or by the whole timeout when none
comes). A ``FakeCell`` has the ``Cell`` methods the coordinator and the healer call; what each
call answers is scripted per (method, cell, step, attempt), and every call is logged in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ftkit.train.control.cell_state import CellBook, CellState
from ftkit.train.control.roster import CellRoster
from ftkit.train.control.waiting import RefWaiter
from ftkit.train.rank.step_types import Committed, HealReport, Reduced, StepTask


@dataclass(eq=False)
class FakeRef:
    """One rank's answer: ``value`` at ``at`` (fake seconds), or ``problem`` (kind, text)."""

    value: Any = None
    problem: tuple[str, str] | None = None
    at: float = 0.0  # math.inf: never


class FakeRefs:
    """``RefWaiter``'s primitives over ``FakeRef`` values and a fake clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timeouts: list[float] = []  # every poll's timeout, in order

    def poll(self, pending: list[FakeRef], timeout_s: float) -> tuple[list[FakeRef], list[FakeRef]]:
        self.timeouts.append(timeout_s)
        first = min(pending, key=lambda r: r.at)
        if first.at > self.now + timeout_s:
            self.now += timeout_s
            return [], pending
        self.now = max(self.now, first.at)
        return [first], [r for r in pending if r is not first]

    def waiter(self, grace_s: float) -> RefWaiter:
        return RefWaiter(grace_s, poll=self.poll, get=lambda r: r.value, problem=lambda r: r.problem, clock=self.clock)

    def clock(self) -> float:
        return self.now


Script = dict[tuple[str, int, int, int], FakeRef]  # (method, cell, step, attempt) -> what rank 0 answers


@dataclass(eq=False)
class FakeCell:
    """A cell of ``ranks`` ranks; ``script`` overrides an answer, ``log`` records each call."""

    index: int
    incarnation: int
    log: list[tuple[Any, ...]]
    script: Script
    ranks: int = 1
    placement_group: Any = None
    workers: list[Any] = field(default_factory=list)
    killed: bool = False

    def __post_init__(self) -> None:
        self.workers = [object()] * self.ranks

    def _answer(self, method: str, step: int, attempt: int, value: Callable[[int], Any]) -> list[FakeRef]:
        self.log.append((method, self.index, step, attempt))
        scripted = self.script.get((method, self.index, step, attempt))
        return [scripted if scripted is not None and r == 0 else FakeRef(value(r)) for r in range(self.ranks)]

    def init(self, host: str, port: int) -> list[FakeRef]:
        return self._answer("init", self.index, self.incarnation, lambda r: 1000 + r)

    def configure(self, epoch: int, alive: list[int]) -> list[FakeRef]:
        return self._answer("configure", epoch, 0, lambda r: None)

    def compute_reduce(self, task: StepTask, batch: Any) -> list[FakeRef]:
        self.log.append(("shards", self.index, task.step, task.attempt, task.shards))
        return self._answer(
            "compute_reduce",
            task.step,
            task.attempt,
            lambda r: Reduced(self.index, r, task.step, task.attempt, True, 1.5, 10),
        )

    def commit(self, step: int, attempt: int, write_dumps: bool) -> list[FakeRef]:
        return self._answer("commit", step, attempt, lambda r: Committed(self.index, r, step, attempt, 0.25, "ab"))

    def discard(self, step: int, attempt: int) -> list[FakeRef]:
        return self._answer("discard", step, attempt, lambda r: None)

    def serve_state(self, keys: list[str]) -> list[FakeRef]:
        return self._answer("serve_state", self.index, self.incarnation, lambda r: None)

    def load_state(self, keys: list[str], donor: int, epoch: int, step: int, attempt: int) -> list[FakeRef]:
        report = lambda r: HealReport(self.index, r, donor, True, 8, "ab", "ab", {})  # noqa: E731
        return self._answer("load_state", step, attempt, report)

    def kill(self, release_group: bool = True) -> None:
        self.log.append(("kill", self.index, self.incarnation))
        self.killed = True


@dataclass
class FakeRun:
    """A roster of ``cells`` fake cells, alive, with its log, script and clock."""

    cells: int = 2
    ranks: int = 1
    min_cells: int = 1
    heal: bool = True
    step_timeout: float = 60.0
    collective_timeout: float = 10.0
    log: list[tuple[Any, ...]] = field(default_factory=list)
    script: Script = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refs: FakeRefs = field(default_factory=FakeRefs)

    def __post_init__(self) -> None:
        self.book = CellBook(
            self.cells, SimpleNamespace(emit=lambda type_, **f: self.events.append((type_, f)) or True)
        )
        for c in range(self.cells):
            self.book.transition(c, CellState.starting, "run start")
            self.book.transition(c, CellState.alive, "started")
        fakes = {c: self.cell(c, 0) for c in range(self.cells)}
        self.roster = CellRoster(
            self.book,
            fakes,  # type: ignore[arg-type]
            self.refs.waiter(self.collective_timeout),
            lambda: None,
            step_timeout=self.step_timeout,
            min_cells=self.min_cells,
            restarts=self.heal,
        )

    def cell(self, index: int, incarnation: int) -> FakeCell:
        return FakeCell(index, incarnation, self.log, self.script, self.ranks)

    def states(self) -> list[tuple[int, str, str]]:
        """Every cell_state transition so far: (cell, old, new)."""
        return [(f["cell"], f["old"], f["new"]) for t, f in self.events if t == "cell_state"]

    def calls(self, method: str) -> list[tuple[Any, ...]]:
        return [c for c in self.log if c[0] == method]


def never() -> FakeRef:
    return FakeRef(at=math.inf)
