"""The simulated run's world (``SimWorld``): its processes' ``EventWriter`` files on one simulated
clock, the cells' membership (alive cells, epoch, dead cells awaiting their heal), the state
fingerprints each rank holds after a step, and where the one violation of a spec goes.

Everything is a deterministic function of the ``SyntheticSpec``: the clock starts at a fixed
time plus the seed and moves 0.5 ms per event, a writer's pid is 10,000 plus the number of events
before it, the faults' steps come from ``random.Random(seed)``. The run itself is
``ftkit.testing.synthetic``; the faults and heals ``ftkit.testing.synthetic_faults``; a step's
commit on every rank ``ftkit.testing.synthetic_steps``.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.events.writer import EventWriter
from ftkit.evidence import emit
from ftkit.tensors.fingerprint import state_total
from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec, tensor_names

if TYPE_CHECKING:
    from ftkit.events.envelope import CellStatus

Fingerprint = tuple[str, dict[str, Any], dict[str, Any]]  # total, params, optimizer


class SimWorld:
    """The simulated run's state and its writers (see the module docstring); ``events`` counts
    the events written so far."""

    def __init__(self, out_dir: Path, spec: SyntheticSpec) -> None:
        if spec.violation is not None and spec.violation not in VIOLATIONS:
            raise ValueError(f"unknown violation {spec.violation!r}; one of {VIOLATIONS}")
        if spec.samples_per_rollout % spec.steps_per_rollout:
            raise ValueError("samples_per_rollout must be a multiple of steps_per_rollout")
        self.spec, self.dir = spec, out_dir / "events"
        self.rng = random.Random(spec.seed)
        self.now = 1_700_000_000.0 + spec.seed
        self.ranks = spec.tp * spec.pp
        names = tensor_names(spec.tensors)
        self.stage_names = [names[i :: spec.pp] for i in range(spec.pp)]
        self.events = 0
        v = spec.violation
        needs_fault = v in ("FT107",) and spec.faults == 0
        n_faults = max(spec.faults, 1 if needs_fault else 0) if spec.cells > 1 else 0
        candidates = list(range(1, max(1, spec.steps - 1 - spec.heal_after))) or list(range(1, max(1, spec.steps - 1)))
        self.fault_steps = sorted(self.rng.sample(candidates, min(n_faults, len(candidates))))
        self.violation_step = self._violation_step()
        self.violation_left = spec.violation  # injected once, at violation_step or the next step that allows it
        self.grpo = spec.loss == "grpo" or v == "FT114"
        self.injected_faults: list[int] = []
        self.healed = 0
        self.driver = self._writer("driver", None, None)
        self.rank_writers: dict[tuple[int, int], EventWriter] = {}
        self.engine_writers = [self._writer("engine", None, e) for e in range(spec.engines)]
        self.epoch = 0
        self.alive: list[int] = list(range(spec.cells))
        self.dead: dict[int, int] = {}  # cell -> step at which to heal
        self._fp_cache: tuple[int, dict[int, Fingerprint]] = (-1, {})

    def _violation_step(self) -> int | None:
        v, steps = self.spec.violation, self.spec.steps
        if v is None:
            return None
        if v == "FT109":
            return steps - 1
        touched = {f + d for f in self.fault_steps for d in (0, 1, 1 + self.spec.heal_after)}
        clean = [s for s in range(steps) if s not in touched]
        return clean[0] if v in ("FT101",) else clean[len(clean) // 2]

    def _clock(self) -> float:
        self.now += 0.0005
        self.events += 1
        return self.now

    def _writer(self, role: str, cell: int | None, rank: int | None) -> EventWriter:
        return EventWriter(
            self.dir,
            self.spec.run,
            role,
            cell,
            rank,
            clock=self._clock,
            pid=10_000 + self.events,
            host=f"sim-{cell if cell is not None else 'driver'}",
        )

    def cell_state(self, cell: int, old: CellStatus, new: CellStatus, reason: str) -> None:
        """The driver logs a cell's state change."""
        emit.cell_state(self.driver, cell=cell, old=old, new=new, reason=reason)

    def reconfigure(self, alive: list[int], reason: str) -> None:
        """The membership becomes ``alive``, in a new epoch."""
        before, self.alive = self.alive, sorted(alive)
        self.epoch += 1
        emit.reconfigure(self.driver, epoch=self.epoch, alive_before=before, alive_after=self.alive, reason=reason)

    def start_cell(self, cell: int) -> None:
        """The processes of ``cell`` start: a writer (a new incarnation) per rank."""
        for rank in range(self.ranks):
            self.rank_writers[(cell, rank)] = self._writer("trainer", cell, rank)

    def fingerprints(self, step: int) -> dict[int, Fingerprint]:
        """Each rank's state fingerprint after ``step`` (the same in every cell)."""
        if self._fp_cache[0] != step:
            fps = {}
            for rank in range(self.ranks):
                tp_rank, stage = rank % self.spec.tp, rank // self.spec.tp
                params = {n: digest(self.spec.seed, step, tp_rank, n) for n in self.stage_names[stage]}
                opt = {n: digest("opt", self.spec.seed, step, tp_rank, n) for n in self.stage_names[stage]}
                fps[rank] = (state_total(params, opt), params, opt)
            self._fp_cache = (step, fps)
        return self._fp_cache[1]


def digest(*parts: Any) -> str:
    """A deterministic 32-hex-digit digest of ``parts`` (a simulated fingerprint)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def canary(version: int) -> dict[str, Any]:
    """The canary scores of a weights version (the same for every engine and cell)."""
    return {"rows": 2, "logprobs": [-0.015625 * (version + 1) * (i + 1) for i in range(8)]}


def die(writer: EventWriter) -> None:
    """What a killed process leaves: its lines so far, no ``log_closed`` (the descriptor just goes)."""
    writer.sync()
    fd, writer._fd = writer._fd, None  # noqa: SLF001 - simulating a process killed mid-run
    if fd is not None:
        os.close(fd)
