"""Fault injection: the ``--inject`` / ``--chaos`` grammar and the injector the fault points call.

A spec is a comma-separated ``key=value`` list (docs/fault-injection.md)::

    kind=sigkill,point=during_reduce,cell=1,step=3           # rank 0 of cell 1, step 3, attempt 0
    kind=corrupt-engine,point=during_weight_sync,engine=0,step=2

``parse_specs`` validates specs (and expands ``--chaos``, see ``ftkit.train.chaos``) into
``FaultSpec`` values; a bad spec is a one-line ``ValueError`` naming the key and the allowed
values. ``FaultInjector`` lives in one process (a rank or an engine): its ``at(point, ...)``
is called at every named fault point; when a spec matches it logs ``fault_injected``, fsyncs
the log, and only then fires. Each spec fires at most once per process incarnation, and only
on the attempt it names, so a retried step (``attempt + 1``) runs without the injection.

Contract of ``at``: ``sigkill`` kills the process with ``SIGKILL``; ``exit`` ends it with
``os._exit(1)``; ``exception`` raises ``InjectedFault``; ``hang`` never returns; ``slow``
sleeps ``seconds`` (default 1) and returns ``None``; ``nan-grad``, ``corrupt-transfer`` and
``corrupt-engine`` return the kind and the caller acts (poison the micro-shard's gradient,
``flip_bit`` the heal payload or the engine's loaded weights); so do ``enospc`` and
``preflight-fail`` at the checkpoint publication points (``ftkit.checkpoint.preflight.fire``
raises ``OSError(ENOSPC)`` / fails the rank's preflight). No match returns ``None``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from ftkit.checkpoint.layout import FAULT_POINTS as PUBLISH_FAULT_POINTS

if TYPE_CHECKING:
    import torch

KINDS = (
    "sigkill",
    "exit",
    "exception",
    "hang",
    "nan-grad",
    "slow",
    "corrupt-transfer",
    "corrupt-engine",
    "enospc",
    "preflight-fail",
)
TRAINER_POINTS = ("before_forward", "mid_backward", "before_reduce", "during_reduce", "after_reduce")
# Checkpoint publication (docs/checkpoints.md): every rank runs publish_preflight; the other
# phases run in the checkpoint writer, the driver (their specs name no cell).
PUBLISH_POINTS = PUBLISH_FAULT_POINTS
WRITER_POINTS = tuple(p for p in PUBLISH_POINTS if p != "publish_preflight")
POINTS = (*TRAINER_POINTS, "during_weight_sync", "during_dump_write", "during_heal", *PUBLISH_POINTS)
# Where each kind applies. during_weight_sync is where a rank exports (cell=) or an engine
# loads (engine=) a weights version; engines have no other point.
KIND_POINTS: dict[str, tuple[str, ...]] = {
    **{k: POINTS for k in ("sigkill", "exit", "exception", "hang", "slow")},
    "nan-grad": ("mid_backward", "before_reduce"),
    "corrupt-transfer": ("during_heal",),
    "corrupt-engine": ("during_weight_sync",),
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


class InjectedFault(RuntimeError):
    """Raised by ``FaultInjector.at`` for ``kind=exception``."""


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
        return "driver" if self.point in WRITER_POINTS else "trainer"

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
    if point in WRITER_POINTS and ("cell" in num or "rank" in num or "engine" in num):
        raise ValueError(f"inject spec {spec!r}: point={point} strikes the checkpoint writer (the driver): no cell=")
    if "engine" not in num and "cell" not in num and point not in WRITER_POINTS:
        raise ValueError(f"inject spec {spec!r}: point={point} strikes a rank: give cell= (and rank=, default 0)")
    if kind == "corrupt-engine" and "engine" not in num:
        raise ValueError(f"inject spec {spec!r}: kind=corrupt-engine strikes an engine: give engine=")
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


def parse_specs(inject: Sequence[str], chaos: str | None, bounds: FaultBounds | None = None) -> list[FaultSpec]:
    """Every ``--inject`` spec, then the ``--chaos`` expansion (deterministic in its seed)."""
    specs = [parse_spec(s, bounds) for s in inject]
    if chaos is not None:
        from ftkit.train.chaos import expand_chaos

        specs += expand_chaos(chaos, bounds)
    return specs


class FaultInjector:
    """The specs that strike this process (``role``, ``cell``/``rank`` or ``engine``), armed.

    ``emit`` is ``EventWriter.emit`` (``emit("fault_injected", **fields)``) and ``sync`` its
    ``sync``: the event is on disk before the fault fires. ``at`` costs a dict lookup at a
    point that no spec names."""

    def __init__(
        self,
        specs: Sequence[FaultSpec],
        emit: Callable[..., Any],
        sync: Callable[[], Any],
        role: Role,
        cell: int | None = None,
        rank: int | None = None,
        engine: int | None = None,
    ) -> None:
        self._emit, self._sync, self._cell, self._rank, self._engine = emit, sync, cell, rank, engine
        self._armed: dict[str, list[FaultSpec]] = {}
        for s in specs:
            target = s.engine == engine if s.role == "engine" else (s.cell, s.rank) == (cell, rank)
            if s.role == role and target:
                self._armed.setdefault(s.point, []).append(s)

    @property
    def armed(self) -> list[FaultSpec]:
        """Specs that may still fire in this process."""
        return [s for specs in self._armed.values() for s in specs]

    def at(self, point: str, *, step: int | None = None, attempt: int = 0, rollout: int | None = None) -> str | None:
        """Fault point ``point`` of ``step`` (run-global) / ``attempt``: fire a matching spec."""
        specs = self._armed.get(point)
        if not specs:
            return None
        for s in specs:
            if s.attempt == attempt and (s.step is None or s.step == step):
                specs.remove(s)
                return self._fire(s, step, attempt, rollout)
        return None

    def _fire(self, s: FaultSpec, step: int | None, attempt: int, rollout: int | None) -> str | None:
        self._emit(
            "fault_injected",
            kind=s.kind,
            point=s.point,
            cell=self._cell,
            rank=self._rank,
            rollout=rollout,
            step=step,
            attempt=attempt,
            engine=self._engine,
        )
        self._sync()
        if s.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
            _hang()  # SIGKILL is delivered before this runs
        if s.kind == "exit":
            os._exit(1)
        if s.kind == "exception":
            raise InjectedFault(f"injected fault: {s.text()}")
        if s.kind == "hang":
            _hang()
        if s.kind == "slow":
            time.sleep(s.seconds)
            return None
        return s.kind


def _hang() -> NoReturn:
    """Stop making progress, forever (the process stays alive until killed)."""
    while True:
        time.sleep(3600)


def flip_bit(tensor: torch.Tensor, index: int = 0) -> None:
    """Flip the lowest bit of element ``index`` (flat, row-major) of ``tensor`` in place.

    For floats this is the last mantissa bit: the value stays finite and nearly equal, so only
    a bitwise fingerprint can tell. ``tensor`` must be contiguous."""
    import torch

    if not tensor.is_contiguous():
        raise ValueError("flip_bit needs a contiguous tensor")
    flat = tensor.detach().view(-1)
    if not -flat.numel() <= index < flat.numel():
        raise IndexError(f"flip_bit: index {index} outside a tensor of {flat.numel()} elements")
    index %= flat.numel()
    raw = flat[index : index + 1].view(torch.uint8)
    raw[0 if sys.byteorder == "little" else -1] ^= 1  # the byte holding the lowest bits
