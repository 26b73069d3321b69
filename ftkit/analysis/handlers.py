"""The replay's own handler of each event type: what every event contributes to the shared state.

``EventHandlers.core_handlers()`` maps an event type to its handler ``(event, stream, line)``;
the replay calls it before the rules subscribed to the type, so rules see the state with the
event already applied. Step evidence goes to the open ``StepRecord`` (``ftkit.analysis.watermark``),
deaths and reconfigurations to the membership, faults, heals and checkpoints to the recovery
table, driver step declarations and ``log_closed`` to the closure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ftkit.analysis.records import RolloutRecord, StepRecord
from ftkit.analysis.watermark import Watermark
from ftkit.events.envelope import DEAD_STATES
from ftkit.findings import Severity
from ftkit.tensors.fingerprint import combine, state_total

Handler = Callable[[dict[str, Any], int, int], None]


class EventHandlers(Watermark):
    """The core event handlers (state in ``ReplayState``)."""

    outcome_hooks: list[Callable[..., None]] = []  # rules' ``outcome`` (see Replay.__init__)

    def compact_handlers(self) -> list[Callable[[tuple[Any, ...], int, int], None]]:
        """The handler of each compact record code (``ftkit.analysis.parallel.HOT_TYPES``)."""
        return [self._step_outcome_c, self._fingerprint_c, self._witness_counts_c]

    def core_handlers(self) -> dict[str, Handler]:
        """Event type -> the replay's handler of it."""
        return {
            "run_started": self._run_started,
            "run_resumed": self._run_resumed,
            "run_finished": self._run_finished,
            "evidence_profile": self._evidence_profile,
            "cell_state": self._cell_state,
            "reconfigure": self._reconfigure,
            "step_outcome": self._step_outcome,
            "state_fingerprint": self._fingerprint,
            "witness_counts": self._witness_counts,
            "witness_allocated": self._witness_allocated,
            "grad_nonfinite": self._grad_nonfinite,
            "fault_injected": self._fault,
            "heal": self._heal,
            "checkpoint_published": self._checkpoint_closed,
            "checkpoint_rejected": self._checkpoint_closed,
            "metric": self._metric,
            "log_closed": self._log_closed,
            "placement": self._placement,
            "engine_failed": self._engine_failed,
            "engine_restart": self._engine_restart,
            "weights_sent": self._weights,
            "engine_weights": self._weights,
        }

    def _run_started(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if self.run_started is None:
            self.run_started = ev
        else:
            self.report("FT111", "run_started logged twice", Severity.warning, where=self.where(fi, line))

    def _evidence_profile(self, ev: dict[str, Any], fi: int, line: int) -> None:
        """The producer's promises, taken once, from the producer that wrote the run: the line
        right after ``run_started`` in the same driver log, agreeing with the run directory's
        ``run.json`` when the log lies in one. Anything else is a forged or damaged line (FT111),
        ignored: the log is then held to everything, as ``ftkit train``'s."""
        where = self.where(fi, line)
        if self.profile is not None or self.steps_closed:  # a later one could only promise less
            self.report("FT111", "evidence_profile logged twice or after steps", where=where)
            return
        started = self.run_started
        if started is None or ev["source"] != started["source"] or ev["seq"] != started["seq"] + 1:
            self.report(
                "FT111",
                "evidence_profile is not the line right after run_started in the driver's log: a producer "
                "logs its promises there, once; ignored (the log is held to every kind at every step)",
                where=where,
            )
            return
        problem = _recorded_profile_problem(ev, where[0])
        if problem is not None:
            self.report("FT111", f"{problem}; ignored (the log is held to every kind at every step)", where=where)
            return
        self.profile = ev

    def _run_finished(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.run_finished = (ev, self.where(fi, line))
        if ev["status"] == "completed" and ev["source"].get("role") == "driver":
            self.recovery.run_completed()

    def _placement(self, ev: dict[str, Any], fi: int, line: int) -> None:
        """Where an actor ran; a trainer's line without its ``cell`` (or an engine's without its
        ``engine``) says nothing of whom it places: a damaged line (FT111), not a crash."""
        role = ev.get("role")
        key = "cell" if role == "trainer" else "engine"
        index, rank = ev.get(key), ev.get("rank") or 0
        if type(index) is not int or type(rank) is not int:
            self.report(
                "FT111",
                f"placement of a{'n' if key == 'engine' else ''} {role} without an integer {key!r}"
                f"{'' if type(rank) is int else ' or rank'}: a damaged line",
                where=self.where(fi, line),
            )
            return
        self.placement[(str(role), index, rank)] = ev

    def _engine_failed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.closure.engine_failed(ev["engine"], ev["time"])
        self.recovery.engine_failed(ev["time"], ev["engine"], ev["reason"], self.where(fi, line))

    def _engine_restart(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.engine_restarted(ev["time"], ev["engine"])

    def placement_summary(self) -> dict[str, Any] | None:
        """Where each cell's ranks and each engine ran last (``None``: no placement logged):
        ``{"nodes": n, "cells": {cell: [node per rank]}, "engines": {engine: node}}``, a node
        written as its address and the first 8 hex digits of its id."""
        if not self.placement:
            return None
        cells: dict[str, list[str]] = {}
        engines: dict[str, str] = {}
        for (role, index, _rank), ev in sorted(self.placement.items()):
            node = f"{ev['address']}/{ev['node_id'][:8]}"
            if role == "trainer":
                cells.setdefault(str(index), []).append(node)
            else:
                engines[str(index)] = node
        nodes = {n for ns in cells.values() for n in ns} | set(engines.values())
        return {"nodes": len(nodes), "cells": cells, "engines": engines}

    def _run_resumed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        """A later session of the run (``ftkit.analysis.resumed``)."""
        from ftkit.analysis.resumed import on_run_resumed

        on_run_resumed(self, ev, fi, line)

    def _cell_state(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.cell_status[ev["cell"]] = ev["new"]
        if ev["new"] == "alive":  # the driver declares the cell back from the next step on
            deaths = self.deaths.get(ev["cell"])
            if deaths and deaths[-1][1] is None:
                deaths[-1][1] = self.max_step + 1
        if ev["new"] in DEAD_STATES:  # "stopped" is a deliberate stop at a step boundary, not a death
            self._died(ev["cell"])
            self.closure.declared_dead(ev["cell"], ev["time"])
            rollout = max(self.rollouts) if self.rollouts else None
            self.recovery.cell_failed(ev["time"], ev["cell"], ev["reason"], self.where(fi, line), rollout)

    def _reconfigure(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.epochs[ev["epoch"]] = frozenset(ev["alive_after"])
        self.recovery.reconfigured(ev["time"])

    # The three step-evidence handlers below run for most events of a log: they call
    # ``self.locate`` (not ``where``) and avoid ``setdefault(k, {})`` (a dict built per call) for speed.
    # Each has a twin entry point taking a compact record (``ftkit.analysis.parallel``: the fields of
    # a line a worker process decoded, checked and reduced); both share the code after the fields.
    def _step_outcome(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is not None:
            self._outcome_at(rec, ev["epoch"], ev["cell"], self._rank(ev), ev["outcome"], ev["time"], fi, line)

    def _step_outcome_c(self, c: tuple[Any, ...], fi: int, line: int) -> None:
        rec = self._record_at(fi, line, "step_outcome", (c[4], c[5], c[6]), c[7], c[8], c[1], c[9])
        if rec is not None:
            self._outcome_at(rec, c[11], c[7], self._rank_of(c[8], fi), c[10], c[1], fi, line)
        for hook in self.outcome_hooks:
            hook(c[7], c[8] if c[9] else (self.file_source[fi] or {}).get("rank"), c[5], c[6], c[10], fi, line)

    def _outcome_at(
        self, rec: StepRecord, epoch: int, cell: int, rank: int | None, outcome: str, time: float, fi: int, line: int
    ) -> None:
        if rec.epoch is None:
            rec.epoch = epoch
        ranks = rec.outcomes.get(cell)
        if ranks is None:
            ranks = rec.outcomes[cell] = {}
        ranks[rank] = (outcome, self.locate(fi, line))
        if outcome != "committed":
            self.recovery.detected(time)
        else:
            self.recovery.committed(time)

    def _fingerprint(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rank, total = self._rank(ev), ev["total"]
        detail = rec.fp_detail.get((rank, total))  # its total was recomputed: equal parts need no new hash
        if detail is None or detail[0] != ev["params"] or detail[1] != ev["optimizer"]:
            total = self._recompute(ev, fi, line, state_total(ev["params"], ev["optimizer"]))
            detail = rec.fp_detail.get((rank, total))
        self._fingerprint_at(rec, rank, ev["cell"], total, detail, fi, line, ev["params"], ev["optimizer"])
        if ev.get("weights") is not None:
            rec.fp_weights.setdefault((rank, total), ev["weights"])

    def _fingerprint_c(self, c: tuple[Any, ...], fi: int, line: int) -> None:
        """A compact fingerprint (``c[11]``: its parts as the worker encoded them): the same as
        above, with one more shortcut -- parts encoded as the group's were are the group's parts."""
        rec = self._record_at(fi, line, "state_fingerprint", (c[4], c[5], c[6]), c[7], c[8], c[1], c[9])
        if rec is None:
            return
        rank, total, blob = self._rank_of(c[8], fi), c[10], c[11]
        detail = rec.fp_detail.get((rank, total))
        if detail is not None and rec.fp_blobs.get((rank, total)) == blob:
            self._fingerprint_at(rec, rank, c[7], total, detail, fi, line, None, None)
            return
        params, optimizer = orjson.loads(blob)
        if detail is None or detail[0] != params or detail[1] != optimizer:
            parts = state_total(params, optimizer)
            if total != parts:
                self._contradicted("state_fingerprint", total, parts, fi, line)
                total = parts
            detail = rec.fp_detail.get((rank, total))
        if detail is None:
            rec.fp_blobs[(rank, total)] = blob
        self._fingerprint_at(rec, rank, c[7], total, detail, fi, line, params, optimizer)

    def _fingerprint_at(
        self,
        rec: StepRecord,
        rank: int | None,
        cell: int,
        total: str,
        detail: Any,
        fi: int,
        line: int,
        params: Any,
        optimizer: Any,
    ) -> None:
        cells = rec.fingerprints.get(rank)
        if cells is None:
            cells = rec.fingerprints[rank] = {}
        cells[cell] = total
        if detail is None:
            rec.fp_detail[(rank, total)] = (params, optimizer, cell, self.locate(fi, line))

    def _weights(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self._recompute(ev, fi, line, combine(ev["params"]))
        src = self.file_source[fi] or {}
        if ev["type"] == "weights_sent":
            self.recovery.activity(ev["time"])
        if ev["type"] == "engine_weights" and src.get("role") == "engine" and ev["engine"] != src.get("rank"):
            self.report(
                "FT111",
                f"engine_weights of engine {ev['engine']} written by engine {src.get('rank')}'s process: "
                f"only an engine reports what it holds",
                where=self.where(fi, line),
            )

    def _recompute(self, ev: dict[str, Any], fi: int, line: int, parts: str) -> str:
        """A fingerprint line's ``total`` must be the function of its per-tensor entries that the
        writer computed it with (``parts``): a total its parts contradict is a damaged line (FT111),
        and from here on the line stands for what its parts say (``ev["total"]`` is replaced), so
        the rules compare the per-tensor entries across cells and with the weights sent."""
        if ev["total"] != parts:
            self._contradicted(ev["type"], ev["total"], parts, fi, line)
            ev["total"] = parts
        return parts

    def _contradicted(self, t: str, total: str, parts: str, fi: int, line: int) -> None:
        self.report(
            "FT111",
            f"{t} total {total[:12]} is not the fingerprint of its own per-tensor "
            f"entries ({parts[:12]}): a damaged or forged line",
            where=self.where(fi, line),
        )

    def _witness_counts(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is not None:
            self._witness_at(rec, ev["cell"], ev["ids"], ev["counts"], ev["contributions"], fi, line)

    def _witness_counts_c(self, c: tuple[Any, ...], fi: int, line: int) -> None:
        rec = self._record_at(fi, line, "witness_counts", (c[4], c[5], c[6]), c[7], c[8], c[1], c[9])
        if rec is not None:
            self._witness_at(rec, c[7], c[10], c[11], c[12], fi, line)

    def _witness_at(
        self, rec: StepRecord, cell: int, ids: list[int], counts: list[int], contribs: list[float], fi: int, line: int
    ) -> None:
        """One cell's witness counts of a step attempt. Every cell (every incarnation: a healed or
        restarted one too) reads them from the same reduced gradient, so ids, counts and
        contributions must equal the first report's bit for bit; a report that differs is a
        conflict (FT101). A line whose lists are not aligned, or whose counts and contributions
        are values no gradient gives (a count below 1, a negative contribution),
        is damaged (FT111); a report equal to the first was checked with it (one check per step,
        not per cell)."""
        rec.witness_cells.add(cell)
        first = rec.witness
        if first is not None and ids == first[0] and counts == first[1] and _same_values(contribs, first[4]):
            return
        problem = _witness_problem(ids, counts, contribs)
        if problem is not None:
            self.report(
                "FT111", f"witness_counts of step {rec.step} from cell {cell}: {problem}", where=self.where(fi, line)
            )
        if first is None:
            rec.witness = (ids, counts, cell, self.locate(fi, line), contribs)
        else:
            what = "counts" if ids != first[0] or counts != first[1] else "contributions"
            rec.witness_conflicts.append((cell, self.locate(fi, line), what))

    def _witness_allocated(self, ev: dict[str, Any], fi: int, line: int) -> None:
        ro = self.rollouts.get(ev["rollout"])
        if ro is None:
            if self.rollout_marks and ev["rollout"] < min(self.rollout_marks):  # already closed
                self.late[0] += 1
                self.late[1] = self.late[1] or self.where(fi, line)
                return
            ro = self.rollouts[ev["rollout"]] = RolloutRecord(ev["rollout"])
            self.recovery.rollout_opened(ev["rollout"])
        if ev["attempt"] >= ro.alloc_attempt:
            ro.allocate(ev["ids"], ev["expected"], ev["attempt"], self.where(fi, line))

    def _grad_nonfinite(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self._progress(fi, line, ev["step"], ev["rollout"])
        self.recovery.detected(ev["time"], ev["cell"])

    def _metric(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["step"] is not None and ev["source"].get("role") == "driver":
            self.recovery.activity(ev["time"])
            self.closure.declare_step(ev["step"])
            self.declared_step = max(self.declared_step, ev["step"])
            self.step_phases.add(ev)

    def _log_closed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["lines"] != ev["seq"]:
            self.report(
                "FT111",
                f"log_closed says {ev['lines']} line(s) were written before it, but its seq is {ev['seq']}",
                where=self.where(fi, line),
            )
        self.closed[fi] = True
        peak, role = ev.get("peak_rss_bytes"), ev["source"].get("role")
        if type(peak) is int and peak > 0 and isinstance(role, str):
            self.peak_rss[role] = max(self.peak_rss.get(role, 0), peak)

    def _fault(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.closure.fault(fi, ev["kind"])
        self.recovery.fault(ev, self.where(fi, line))

    def _heal(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.healed(ev["time"], ev["cell"], ev["bytes"], ev["epoch"])
        self.healed.add(ev["cell"])

    def _checkpoint_closed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.checkpoint_closed(ev["time"], "rejected" if ev["type"] == "checkpoint_rejected" else "published")


def _recorded_profile_problem(ev: dict[str, Any], log: str) -> str | None:
    """How an ``evidence_profile`` contradicts the ``run.json`` of the run directory its log lies in
    (``RUN/events/``): a run written by ``ftkit train`` (no ``producer``) promises everything and
    logs no profile; one written by the evidence API records its producer and profile there.
    None when they agree or there is no readable ``run.json`` to hold it to."""
    import json
    from pathlib import Path

    from ftkit.tensors.untrusted import NotRegular, read_regular

    events = Path(log).parent
    if events.name != "events":
        return None
    try:
        record = json.loads(read_regular(events.parent / "run.json"))
    except (OSError, NotRegular, ValueError):
        return None
    if not isinstance(record, dict) or record.get("schema") != "ftkit.run/1":
        return None
    if "producer" not in record:
        return (
            f"evidence_profile of {ev['producer']!r} in a run that run.json says ftkit train wrote "
            "(it promises everything)"
        )
    if record.get("producer") != ev["producer"] or record.get("evidence_profile") != ev["kinds"]:
        return (
            f"evidence_profile ({ev['producer']}: {ev['kinds']}) is not the one run.json records "
            f"({record.get('producer')}: {record.get('evidence_profile')})"
        )
    return None


def _same_values(a: list[float], b: list[float]) -> bool:
    """``a == b``, NaN equal to NaN (a non-finite gradient gives NaN on every cell alike)."""
    return a == b or (len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b)))


def _witness_problem(ids: list[int], counts: list[int], contribs: list[float]) -> str | None:
    """Why a ``witness_counts`` line cannot be what a reduced witness gradient gave, or None: one
    count and one contribution per id, every count at least 1 (ids with a zero count are not
    logged), no contribution negative (a sum of gradient norms; 1.0 per occurrence from the
    evidence API's sample ids). A non-finite contribution is a non-finite gradient, not a damaged
    line (the guard's and FT106's business). One pass at C speed over each list."""
    if not len(ids) == len(counts) == len(contribs):
        return (
            f"{len(ids)} ids, {len(counts)} counts and {len(contribs)} contributions (one each per id): a damaged line"
        )
    if counts and min(counts) < 1:
        return "a count below 1 (only ids with a non-zero count are logged): a damaged or forged line"
    if contribs:
        least = min(contribs)  # NaN first in the list hides the rest from min: look then
        if least < 0 or (least != least and any(c < 0 for c in contribs)):
            return "a negative contribution (a sum of gradient norms): a damaged or forged line"
    return None
