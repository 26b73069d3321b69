"""The fault injector the fault points call (``FaultInjector``), and what a fault does.

``FaultInjector`` lives in one process (a rank, an engine or the driver): its ``at(point, ...)``
is called at every named fault point; when a spec matches it logs ``fault_injected``, fsyncs
the log, and only then fires. Each spec fires at most once per process incarnation, and only
on the attempt it names, so a retried step (``attempt + 1``) runs without the injection.

Contract of ``at``: ``sigkill`` kills the process with ``SIGKILL``; ``exit`` ends it with
``os._exit(1)``; ``exception`` raises ``InjectedFault``; ``hang`` never returns; ``slow``
sleeps ``seconds`` (default 1) and returns ``None``; ``nan-grad``, ``corrupt-transfer`` and
``corrupt-engine`` / ``stale-weights`` return the kind and the caller acts (poison the
micro-shard's gradient, ``flip_bit`` the heal payload or the engine's loaded weights, skip
the engine's copy of the new weights); so do ``enospc`` and
``preflight-fail`` at the checkpoint publication points (``ftkit.checkpoint.preflight.fire``
raises ``OSError(ENOSPC)`` / fails the rank's preflight). No match returns ``None``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, Protocol

from ftkit.evidence import emit
from ftkit.train.faults.spec import FaultSpec, Role

if TYPE_CHECKING:
    import torch


class InjectedFault(RuntimeError):
    """Raised by ``FaultInjector.at`` for ``kind=exception``."""


class FaultLog(emit.EventSink, Protocol):
    """The process's event log (an ``EventWriter``): ``emit`` an event, ``sync`` it to disk."""

    def sync(self) -> None: ...


class FaultInjector:
    """The specs that strike this process (``role``, ``cell``/``rank`` or ``engine``), armed.

    ``log`` is the process's ``EventWriter``: ``fault_injected`` goes there
    (``ftkit.evidence.emit``) and is synced, so it is on disk before the fault fires. ``at``
    costs a dict lookup at a point that no spec names."""

    def __init__(
        self,
        specs: Sequence[FaultSpec],
        log: FaultLog,
        role: Role,
        cell: int | None = None,
        rank: int | None = None,
        engine: int | None = None,
    ) -> None:
        self._log, self._cell, self._rank, self._engine = log, cell, rank, engine
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
        emit.fault_injected(
            self._log,
            kind=s.kind,
            point=s.point,
            cell=self._cell,
            rank=self._rank,
            rollout=rollout,
            step=step,
            attempt=attempt,
            engine=self._engine,
        )
        self._log.sync()
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
