"""Waiting for the cells' answers under deadlines, and what an answer that is not a value means.

``RefWaiter.wait(refs, timeout_s) -> Answers`` waits for every cell's refs (one per rank):
the deadline is ``timeout_s``; once any answer came (a value or a failure) the rest get at most
``grace_s`` more (a value means every peer passed the same collectives, a failure means the
attempt is lost anyway). Each answer is classified (``problem``): a value, a dead actor, a
``CollectiveError`` (a symptom: the rank is alive, a peer is not), another exception (the cell
failed), or no answer by the deadline (hung). ``wait`` never raises for a fault.

Death notifications: given a ``dead(cell)`` probe (Ray's actor table: ``ray_actor_dead``, a
GCS lookup of well under a millisecond, given up after ``PROBE_TIMEOUT_S``), ``wait`` polls in
slices of ``DEATH_POLL_S`` and asks it about the cells still pending: a cell Ray reports dead is failed at once (tens of
milliseconds after a kill, not at the deadline) and the others get the grace from then. A cell
still pending at the deadline after a peer failed in the same wait (dead, erred, or one of the
``peers`` the caller named, such as a heal's donor, found dead) is **blocked on a dead peer**,
not hung: it is reported in ``collective`` (the symptom) and not failed, and its own collective
timeout ends its call. A wait with named ``peers`` returns as soon as one of them is dead.

The Ray primitives (``poll``: ``ray.wait`` of one ref, ``get``, ``problem``, the clock) are
constructor arguments with Ray's as defaults, so the coordinator and the healer run over fake
cells in the unit tests (``tests/train/fakecells.py``) without Ray and without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Seconds added to every deadline derived from a timeout (scheduling, event fsyncs).
MARGIN_S = 2.0
#: Seconds between two death probes of the cells a wait still waits for.
DEATH_POLL_S = 0.25

Problem = tuple[str, str]  # (kind: dead | collective | exception, text)
Poll = Callable[[list[Any], float], tuple[list[Any], list[Any]]]
DeadProbe = Callable[[int], "str | None"]  # cell -> why Ray reports it dead, or None


@dataclass
class Answers:
    """What one wait over several cells' refs found."""

    values: dict[int, list[Any]] = field(default_factory=dict)  # cell -> per-rank results
    failed: dict[int, str] = field(default_factory=dict)  # cell -> cause (dead, hung, exception)
    collective: set[int] = field(default_factory=set)  # cells that saw a collective error
    blocked: dict[int, str] = field(default_factory=dict)  # cell -> the dead peer it waited on (in collective)

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


#: Longest a death probe may take: the actor table lives in Ray's GCS, and a lookup in a GCS
#: that died never returns (measured: over 110 s); the driver must keep polling and reach its own
#: GCS check (``GcsWatch``) before Ray's client gives up on the process at 60 s.
PROBE_TIMEOUT_S = 0.5
_probing = threading.Lock()  # at most one lookup in flight: a stuck one blocks no later probe


def ray_actor_dead(actor: Any) -> str | None:
    """Why Ray's actor table says ``actor`` (a handle) is dead, or None (alive, restarting, the
    table could not be read within ``PROBE_TIMEOUT_S``, or an earlier lookup is still stuck:
    the deadline still bounds the wait). The lookup runs on a daemon thread, so a GCS that does
    not answer costs the caller ``PROBE_TIMEOUT_S`` once, then nothing until it answers again."""
    if not _probing.acquire(blocking=False):
        return None
    found: list[Any] = []

    def lookup() -> None:
        try:
            from ray._private import state

            found.append(state.state.actor_table(actor._actor_id.hex()))
        except Exception:  # noqa: BLE001 - a probe only shortens waits; its failure changes nothing
            pass
        finally:
            _probing.release()

    thread = threading.Thread(target=lookup, name="ftkit-death-probe", daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S)
    info = found[0] if found else None
    if not isinstance(info, dict) or info.get("State") != "DEAD":
        return None
    return "the actor died (Ray's actor table reports it DEAD)"


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

    def wait(
        self,
        refs: dict[int, list[object]],
        timeout_s: float,
        dead: DeadProbe | None = None,
        peers: tuple[int, ...] = (),
    ) -> Answers:
        """Wait for every cell's refs (see the module docstring): ``dead`` probes pending cells
        and ``peers`` (cells whose refs are not waited for here) every ``DEATH_POLL_S``."""
        out = Answers()
        owner = {ref: (c, r) for c, rs in refs.items() for r, ref in enumerate(rs)}
        got: dict[int, dict[int, Any]] = {c: {} for c in refs}
        pending = list(owner)
        start = self.clock()
        deadline = start + timeout_s
        peer_dead: str | None = None
        while pending:
            left = deadline - self.clock()
            if left <= 0 or peer_dead is not None:
                self._at_deadline(out, {owner[ref][0] for ref in pending}, start, peer_dead)
                break
            ready, pending = self.poll(pending, min(left, DEATH_POLL_S) if dead is not None else left)
            if not ready:
                if dead is not None:
                    pending, peer_dead, found = self._probe(out, owner, pending, dead, peers)
                    if found:
                        deadline = min(deadline, self.clock() + self.grace_s)
                continue
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

    @staticmethod
    def _probe(
        out: Answers, owner: dict[Any, tuple[int, int]], pending: list[Any], dead: DeadProbe, peers: tuple[int, ...]
    ) -> tuple[list[Any], str | None, bool]:
        """Ask ``dead`` about the pending cells and the ``peers``: a dead pending cell is
        failed and its refs dropped. Returns the refs left, the first dead peer's description
        (or None) and whether a pending cell was found dead."""
        found = False
        for cell in sorted({owner[ref][0] for ref in pending} - set(out.failed)):
            cause = dead(cell)
            if cause is not None:
                out.failed[cell] = f"dead: {cause}"
                found = True
        if found:
            pending = [ref for ref in pending if owner[ref][0] not in out.failed]
        for peer in peers:
            cause = dead(peer)
            if cause is not None:
                return pending, f"cell {peer} ({cause})", found
        return pending, None, found

    def _at_deadline(self, out: Answers, cells: set[int], start: float, peer_dead: str | None) -> None:
        """The cells still pending: blocked on a dead peer when one failed (or a named peer
        died), else hung."""
        failed_peers = sorted(out.failed)
        if peer_dead is None and failed_peers:
            peer_dead = f"cell {failed_peers[0]} ({out.failed[failed_peers[0]]})"
        for cell in sorted(cells - set(out.failed)):
            if peer_dead is not None:
                out.collective.add(cell)
                out.blocked[cell] = peer_dead
            else:
                out.failed[cell] = f"hung: no answer after {self.clock() - start:.1f}s (deadline)"


#: How ``failed_flushes`` begins the cause of a call that did not answer in time (not a death seen).
NOT_FLUSHED = "did not flush its event log"


def failed_flushes(calls: dict[int, list[Any]], timeout_s: float) -> dict[int, str]:
    """Wait at most ``timeout_s`` in all for the log-flushing calls of every owner (a cell's ranks,
    an engine: ``owner -> refs``); return the owners whose calls raised (a process that died after
    its last use) or did not answer in time, each with the first line of its cause. The caller
    declares them (a death the analyzer then excuses from ending without ``log_closed``)."""
    import ray

    refs = [r for rs in calls.values() for r in rs]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    done = set(ready)
    failed: dict[int, str] = {}
    for owner, rs in calls.items():
        for ref in rs:
            if ref not in done:
                failed[owner] = f"{NOT_FLUSHED} within {timeout_s:.0f}s"
                break
            try:
                ray.get(ref, timeout=0)
            except Exception as exc:  # noqa: BLE001 - any failure of the call is the owner's death
                cause = getattr(exc, "cause", None) or exc
                first = str(cause).splitlines()[0] if str(cause) else ""
                failed[owner] = f"{type(cause).__name__}: {first[:200]}".rstrip(": ")
                break
    return failed
