"""The ``--inject`` grammar: fault kinds, the named points, ``FaultSpec`` and ``parse_spec``.

A spec is a comma-separated ``key=value`` list (docs/fault-injection.md)::

    kind=sigkill,point=during_reduce,cell=1,step=3           # rank 0 of cell 1, step 3, attempt 0
    kind=corrupt-engine,point=during_weight_sync,engine=0,step=2

``parse_spec`` validates one spec into a ``FaultSpec`` (within a run's ``FaultBounds`` when
given); a bad spec is a one-line ``ValueError`` naming the key and the allowed values. The
``--chaos`` expansion is ``ftkit.train.faults.chaos``, both together ``schedule.parse_specs``,
the injector that fires specs ``injector.FaultInjector``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ftkit.checkpoint.layout import FAULT_POINTS as PUBLISH_FAULT_POINTS

KINDS = (
    "sigkill",
    "exit",
    "exception",
    "hang",
    "nan-grad",
    "slow",
    "corrupt-transfer",
    "corrupt-engine",
    "stale-weights",
    "enospc",
    "preflight-fail",
)
TRAINER_POINTS = ("before_forward", "mid_backward", "before_reduce", "during_reduce", "after_reduce")
# Checkpoint publication (docs/checkpoints.md): every rank runs publish_preflight; the other
# phases run in the checkpoint publisher, the driver (their specs name no cell), and
# publish_write also in the rank that writes the files (rank 0 of the writing cell: cell=).
PUBLISH_POINTS = PUBLISH_FAULT_POINTS
WRITER_POINTS = tuple(p for p in PUBLISH_POINTS if p != "publish_preflight")
RANK_WRITE_POINT = "publish_write"  # with cell=: rank 0 of that cell, once it wrote the files
POINTS = (*TRAINER_POINTS, "during_weight_sync", "during_dump_write", "during_heal", *PUBLISH_POINTS)
# Where each kind applies. during_weight_sync is where a rank exports (cell=) or an engine
# loads (engine=) a weights version; engines have no other point.
KIND_POINTS: dict[str, tuple[str, ...]] = {
    **{k: POINTS for k in ("sigkill", "exit", "exception", "hang", "slow")},
    "nan-grad": ("mid_backward", "before_reduce"),
    "corrupt-transfer": ("during_heal",),
    "corrupt-engine": ("during_weight_sync",),
    "stale-weights": ("during_weight_sync",),  # the engine silently keeps its previous weights
    "enospc": PUBLISH_POINTS,  # OSError(ENOSPC) raised in that phase of the publication
    "preflight-fail": ("publish_preflight",),
}
KEYS = ("kind", "point", "cell", "rank", "step", "attempt", "engine", "seconds")
DEFAULT_SLOW_SECONDS = 1.0
Role = Literal["trainer", "engine", "driver"]


@dataclass(frozen=True)
class FaultBounds:
    """What a spec may name in a run: cells, ranks per cell, engines, optimizer steps, and
    the steps per rollout (weights are synced before multiples of it)."""

    cells: int
    ranks: int
    engines: int
    steps: int
    steps_per_rollout: int


@dataclass(frozen=True)
class FaultSpec:
    """One fault to inject. Rank faults name ``cell`` (and ``rank``, default 0); engine faults
    name ``engine`` (point ``during_weight_sync``). ``step`` is run-global (``None``: the first
    matching point, only allowed for ``during_heal``); ``attempt`` is the attempt of that step
    (or heal, or weight sync) the fault strikes."""

    kind: str
    point: str
    cell: int | None = None
    rank: int | None = None
    step: int | None = None
    attempt: int = 0
    engine: int | None = None
    seconds: float = DEFAULT_SLOW_SECONDS

    @property
    def role(self) -> Role:
        """Which kind of process the spec strikes."""
        if self.engine is not None:
            return "engine"
        return "driver" if self.point in WRITER_POINTS and self.cell is None else "trainer"

    def text(self) -> str:
        """The spec in the ``--inject`` grammar (round-trips through ``parse_spec``)."""
        parts = [f"kind={self.kind}", f"point={self.point}"]
        for key in ("cell", "rank", "engine", "step"):
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={value}")
        if self.attempt:
            parts.append(f"attempt={self.attempt}")
        if self.kind == "slow":
            parts.append(f"seconds={self.seconds!r}")
        return ",".join(parts)


def _int(spec: str, key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"inject spec {spec!r}: {key} must be an integer >= 0, not {value!r}")
    return n


def parse_spec(spec: str, bounds: FaultBounds | None = None) -> FaultSpec:
    """One ``--inject`` spec; ``bounds`` (when given) bounds cell, rank, engine and step."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key:
            raise ValueError(f"inject spec {spec!r}: {part.strip()!r} is not key=value (keys: {', '.join(KEYS)})")
        if key not in KEYS:
            raise ValueError(f"inject spec {spec!r}: unknown key {key!r} (keys: {', '.join(KEYS)})")
        if key in fields:
            raise ValueError(f"inject spec {spec!r}: {key} given twice")
        fields[key] = value
    kind, point = fields.get("kind"), fields.get("point")
    if kind not in KINDS:
        raise ValueError(f"inject spec {spec!r}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if point not in KIND_POINTS[kind]:
        raise ValueError(f"inject spec {spec!r}: point for kind={kind} must be one of {', '.join(KIND_POINTS[kind])}")
    num = {k: _int(spec, k, v) for k, v in fields.items() if k in ("cell", "rank", "step", "attempt", "engine")}
    if "seconds" in fields:
        if kind != "slow":
            raise ValueError(f"inject spec {spec!r}: seconds applies to kind=slow only")
        try:
            seconds = float(fields["seconds"])
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < 1e6:
            raise ValueError(f"inject spec {spec!r}: seconds must be a number >= 0, not {fields['seconds']!r}")
    else:
        seconds = DEFAULT_SLOW_SECONDS
    if "engine" in num and ("cell" in num or "rank" in num):
        raise ValueError(f"inject spec {spec!r}: give engine= (an engine) or cell= (a rank), not both")
    if "engine" in num and point != "during_weight_sync":
        raise ValueError(f"inject spec {spec!r}: engine= needs point=during_weight_sync (the engines' fault point)")
    if point in WRITER_POINTS and point != RANK_WRITE_POINT and ("cell" in num or "rank" in num):
        raise ValueError(f"inject spec {spec!r}: point={point} strikes the checkpoint publisher (the driver): no cell=")
    if point == RANK_WRITE_POINT and num.get("rank", 0) != 0:
        raise ValueError(
            f"inject spec {spec!r}: point={point} with cell= strikes the rank that writes the files, rank 0 of the "
            "cell: no rank="
        )
    if "engine" not in num and "cell" not in num and point not in WRITER_POINTS:
        raise ValueError(f"inject spec {spec!r}: point={point} strikes a rank: give cell= (and rank=, default 0)")
    if kind in ("corrupt-engine", "stale-weights") and "engine" not in num:
        raise ValueError(f"inject spec {spec!r}: kind={kind} strikes an engine: give engine=")
    if "step" not in num and point != "during_heal":
        raise ValueError(f"inject spec {spec!r}: step= is required for point={point}")
    out = FaultSpec(
        kind=kind,
        point=point,
        cell=num.get("cell"),
        rank=num.get("rank", 0) if "cell" in num else None,
        step=num.get("step"),
        attempt=num.get("attempt", 0),
        engine=num.get("engine"),
        seconds=seconds,
    )
    if bounds is not None:
        _check_bounds(spec, out, bounds)
    return out


def _check_bounds(spec: str, f: FaultSpec, bounds: FaultBounds) -> None:
    steps, K = bounds.steps, bounds.steps_per_rollout
    if f.point == "during_weight_sync":
        steps += 1  # the final weights (version ``rollouts``) are synced "before" step ``steps``
    limits = {"cell": bounds.cells, "rank": bounds.ranks, "engine": bounds.engines, "step": steps}
    for key, limit in limits.items():
        value = getattr(f, key)
        if value is not None and value >= limit:
            raise ValueError(f"inject spec {spec!r}: {key} must be below {limit} for this config, not {value}")
    if f.point == "during_weight_sync" and f.step is not None and f.step % K:
        raise ValueError(
            f"inject spec {spec!r}: weights are synced before steps 0, {K}, ... "
            f"(multiples of steps_per_rollout): step must be one of them"
        )
