"""``--chaos mtbf=SECONDS,seed=N,max=K[,step_s=S]``: random faults, expanded deterministically.

The expansion depends only on the chaos spec and the run's config, never on timing, so a chaos
run is reproducible and its specs can be printed (``--print-config`` shows the spec; the
``fault_injected`` events show what fired). How it works:

- ``mtbf`` is converted into steps with ``step_s``, the nominal seconds of one step
  (default 2): faults are on average ``max(1, mtbf / step_s)`` steps apart. Gaps are drawn
  from an exponential distribution (a Poisson process over steps) with ``random.Random(seed)``,
  rounded, at least one step; the first fault comes one gap after step 0. At most one fault
  per step and at most ``max`` faults (default 10); faults stop at the run's last step.
- Each fault picks a kind, then a target and a point where the kind applies. Process-ending
  kinds (``sigkill``, ``exit``, ``exception``, ``hang``) strike cells 1..C-1 only, so cell 0
  always survives and the run can always finish (with one cell they are not drawn); ``nan-grad``
  and ``slow`` strike any cell. On a step that starts a rollout (weights were just synced), an
  engine fault (``sigkill``, ``exit`` or ``exception`` at ``during_weight_sync``) is drawn one
  time in four. Chaos never draws ``corrupt-engine`` or ``stale-weights`` (they are meant to fail the analyzer), nor
  ``corrupt-transfer``, ``during_heal`` or ``during_dump_write`` (points a step may not reach).
- Every fault strikes attempt 0 of its step: the retry runs clean.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ftkit.train.faults.spec import KIND_POINTS, TRAINER_POINTS, FaultBounds, FaultSpec

CHAOS_KEYS = ("mtbf", "seed", "max", "step_s")
FATAL = ("sigkill", "exit", "exception", "hang")
# Relative weights of the trainer kinds drawn.
TRAINER_KINDS = {"sigkill": 3, "exit": 1, "exception": 2, "hang": 1, "nan-grad": 2, "slow": 1}
ENGINE_KINDS = ("sigkill", "exit", "exception")
ENGINE_ODDS = 0.25


@dataclass(frozen=True)
class Chaos:
    """A parsed ``--chaos`` spec."""

    mtbf: float
    seed: int = 0
    max: int = 10
    step_s: float = 2.0


def _value(text: str, key: str, raw: str) -> float:
    """``raw`` as the number ``key`` holds: seed an integer >= 0, max an integer >= 1,
    mtbf and step_s finite numbers > 0."""
    integer = key in ("seed", "max")
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = math.nan
    ok = value >= (1 if key == "max" else 0) if integer else 0 < value < math.inf
    if not ok:
        what = "an integer >= 1" if key == "max" else "an integer >= 0" if integer else "a number > 0"
        raise ValueError(f"chaos spec {text!r}: {key} must be {what}, not {raw!r}")
    return value


def parse_chaos(text: str) -> Chaos:
    """Validate a ``--chaos`` spec; a bad one is a one-line ``ValueError`` naming the key."""
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = (s.strip() for s in part.partition("="))
        if not sep or key not in CHAOS_KEYS:
            keys = ", ".join(k + "=" for k in CHAOS_KEYS)
            raise ValueError(f"chaos spec {text!r}: {part.strip()!r} is not one of {keys}")
        if key in values:
            raise ValueError(f"chaos spec {text!r}: {key} given twice")
        values[key] = _value(text, key, raw)
    if "mtbf" not in values:
        raise ValueError(f"chaos spec {text!r}: mtbf= (mean seconds between faults) is required")
    return Chaos(
        mtbf=values["mtbf"],
        seed=int(values.get("seed", 0)),
        max=int(values.get("max", 10)),
        step_s=values.get("step_s", 2.0),
    )


def expand_chaos(text: str, bounds: FaultBounds | None) -> list[FaultSpec]:
    """The fault specs of ``text`` for a run of ``bounds`` (grammar only, no specs, without one)."""
    chaos = parse_chaos(text)
    if bounds is None:
        return []
    rng = random.Random(chaos.seed)
    steps, K = bounds.steps, bounds.steps_per_rollout
    mean_gap = max(1.0, chaos.mtbf / chaos.step_s)
    kinds = [k for k in TRAINER_KINDS if bounds.cells > 1 or k not in FATAL]
    weights = [TRAINER_KINDS[k] for k in kinds]
    specs: list[FaultSpec] = []
    step = 0
    while len(specs) < chaos.max:
        step += max(1, round(rng.expovariate(1.0 / mean_gap)))
        if step >= steps:
            break
        if step % K == 0 and rng.random() < ENGINE_ODDS:
            kind = rng.choice(ENGINE_KINDS)
            specs.append(FaultSpec(kind, "during_weight_sync", step=step, engine=rng.randrange(bounds.engines)))
            continue
        kind = rng.choices(kinds, weights)[0]
        first = 1 if kind in FATAL else 0
        cell = rng.randrange(first, bounds.cells)
        point = rng.choice([p for p in TRAINER_POINTS if p in KIND_POINTS[kind]])
        specs.append(FaultSpec(kind, point, cell=cell, rank=rng.randrange(bounds.ranks), step=step))
    return specs
