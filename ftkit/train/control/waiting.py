"""Waiting for the cells' answers under deadlines, and what an answer that is not a value means.

``RefWaiter.wait(refs, timeout_s) -> Answers`` waits for every cell's refs (one per rank):
the deadline is ``timeout_s``; once any answer came (a value or a failure) the rest get at most
``grace_s`` more (a value means every peer passed the same collectives, a failure means the
attempt is lost anyway). Each answer is classified (``problem``): a value, a dead actor, a
``CollectiveError`` (a symptom: the rank is alive, a peer is not), another exception (the cell
failed), or no answer by the deadline (hung). ``wait`` never raises for a fault.

The Ray primitives (``poll``: ``ray.wait`` of one ref, ``get``, ``problem``, the clock) are
constructor arguments with Ray's as defaults, so the coordinator and the healer run over fake
cells in the unit tests (``tests/train/fakecells.py``) without Ray and without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Seconds added to every deadline derived from a timeout (scheduling, event fsyncs).
MARGIN_S = 2.0

Problem = tuple[str, str]  # (kind: dead | collective | exception, text)
Poll = Callable[[list[Any], float], tuple[list[Any], list[Any]]]


@dataclass
class Answers:
    """What one wait over several cells' refs found."""

    values: dict[int, list[Any]] = field(default_factory=dict)  # cell -> per-rank results
    failed: dict[int, str] = field(default_factory=dict)  # cell -> cause (dead, hung, exception)
    collective: set[int] = field(default_factory=set)  # cells that saw a collective error

    @property
    def clean(self) -> bool:
        return not self.failed and not self.collective


def ray_poll(pending: list[object], timeout_s: float) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` for one of ``pending`` (at most ``timeout_s``)."""
    import ray

    ready, rest = ray.wait(pending, num_returns=1, timeout=timeout_s)
    return list(ready), list(rest)


def ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref)


def classify(ref: Any) -> Problem | None:
    """``None`` when ``ref`` holds a value; else ``(kind, text)``: kind ``dead``,
    ``collective`` or ``exception``."""
    import ray

    from ftkit.train.rank.crosscell import CollectiveError

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as exc:
        return "dead", f"the actor died ({type(exc).__name__}: {_first_line(exc)})"
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
        if isinstance(cause, CollectiveError):
            return "collective", str(cause)
        return "exception", f"{type(cause).__name__}: {_first_line(cause)}"
    except ray.exceptions.RayError as exc:
        return "dead", f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


class RefWaiter:
    """Waits for refs (see the module docstring); ``grace_s`` is the collective timeout."""

    def __init__(
        self,
        grace_s: float,
        poll: Poll = ray_poll,
        get: Callable[[object], object] = ray_get,
        problem: Callable[[object], Problem | None] = classify,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s, self.poll, self.get, self.problem, self.clock = grace_s + MARGIN_S, poll, get, problem, clock

    def ready(self, refs: list[object], timeout_s: float) -> list[Any]:
        """The refs of ``refs`` that answered (value or failure) within ``timeout_s`` (0: now)."""
        done: list[Any] = []
        pending = list(refs)
        deadline = self.clock() + timeout_s
        while pending:
            got, pending = self.poll(pending, max(0.0, deadline - self.clock()))
            if not got:
                break
            done += got
        return done

    def wait(self, refs: dict[int, list[object]], timeout_s: float) -> Answers:
        """Wait for every cell's refs (see the module docstring)."""
        out = Answers()
        owner = {ref: (c, r) for c, rs in refs.items() for r, ref in enumerate(rs)}
        got: dict[int, dict[int, Any]] = {c: {} for c in refs}
        pending = list(owner)
        start = self.clock()
        deadline = start + timeout_s
        while pending:
            left = deadline - self.clock()
            ready, pending = self.poll(pending, max(0.0, left)) if left > 0 else ([], pending)
            if not ready:
                for ref in pending:
                    cell = owner[ref][0]
                    if cell not in out.failed:
                        out.failed[cell] = f"hung: no answer after {self.clock() - start:.1f}s (deadline)"
                break
            for ref in ready:
                cell, rank = owner[ref]
                problem = self.problem(ref)
                if problem is None:
                    got[cell][rank] = self.get(ref)
                else:
                    kind, text = problem
                    if kind == "collective":
                        out.collective.add(cell)
                    elif cell not in out.failed:
                        out.failed[cell] = f"{kind}: {text}" if rank == 0 else f"{kind} (rank {rank}): {text}"
                # an answer came: the others passed (or lost) the same collectives; the rest is short
                deadline = min(deadline, self.clock() + self.grace_s)
        for cell, ranks in got.items():
            if cell not in out.failed and cell not in out.collective and len(ranks) == len(refs[cell]):
                out.values[cell] = [ranks[r] for r in range(len(refs[cell]))]
        return out
