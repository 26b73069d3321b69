"""The replay: walks the merged event stream once and keeps the shared state the rules read.

Per event it validates the line's structure (fast path, ``ftkit.events.validate``), checks the
per-file ``seq`` chain, updates the shared state and hands the event to the rules that
subscribed to its type. Step evidence (outcomes, fingerprints, witness counts) is gathered in
one ``StepRecord`` per open (rollout, step, attempt); a step is *closed* -- rules' ``on_step``
runs and the record is dropped -- once every active file that reports steps has reached step
``s + LAG`` (or ended), so everything that belongs to it has been read. A rollout is closed
when every such file has moved past it and its steps are closed. Memory therefore follows
the open steps and rollouts (plus one row per fault, checkpoint and non-finite step), never the
length of the log. Files are expected to be time-ordered (the writer's are: one process each).

Membership: ``alive(epoch)`` is the ``alive_after`` of the epoch's ``reconfigure``; epoch 0
without one is the set of cells ``alive`` by ``cell_state`` when its first step began, or all
``num_cells`` cells when the log has no ``cell_state``. A cell is *lost* for a step when it died
during it (see ``cell_lost``); lost cells are excused from "missing" checks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from ftkit.analysis.closure import Closure
from ftkit.analysis.records import RolloutRecord, RuleHooks, StepRecord, Where
from ftkit.analysis.recovery import RecoveryTracker
from ftkit.events.schema import DEAD_STATES, Source
from ftkit.events.validate import CHECKS, explain, known
from ftkit.findings import Finding, Severity

LAG = 2  # a step closes when every reporting file is this many steps ahead
MAX_STORED = 500  # findings kept per rule (all are counted)
STEP_TYPES = frozenset({"step_outcome", "state_fingerprint", "witness_counts", "grad_nonfinite"})


class _Skip(Exception):
    """The line cannot be used (already reported)."""


class NotPerProcess(Exception):
    """Raised (only when ``per_process`` is set) when a file turns out not to be one process's
    stream: a second source in it, a ``seq`` that goes back, or a source already read from another
    file. The caller replays again from a ``DemuxStream``."""


class Replay:
    def __init__(self, rule_classes: Iterable[Callable[[Replay], RuleHooks]]) -> None:
        self.locate: Callable[[int, int], Where] = lambda fi, line: (str(fi), line)
        self.per_process = False
        self.rules = [cls(self) for cls in rule_classes]
        self.by_code = {r.code: r for r in self.rules}
        self.findings: list[Finding] = []
        self.stored: Counter[str] = Counter()
        self.unknown_types: Counter[str] = Counter()
        self.by_type: Counter[str] = Counter()
        self.events = 0
        # run and membership
        self.run_started: dict[str, Any] | None = None
        self.run_finished: tuple[dict[str, Any], Where] | None = None
        self.runs: dict[str, Where] = {}
        self.after_finish: list[Any] = [0, None]
        self.epochs: dict[int, frozenset[int]] = {}
        self.cell_status: dict[int, str] = {}
        self.max_rank = -1
        # open steps and rollouts
        self.pending: dict[tuple[int, int, int], StepRecord] = {}
        self.rollouts: dict[int, RolloutRecord] = {}
        self.closed_below = 0
        self.late: list[Any] = [0, None]
        self.steps_closed = self.steps_committed = 0
        # per stream (a file, or one source of a demultiplexed log): see attach()
        self.seq_next: list[int] = []
        self.file_source: list[dict[str, Any] | None] = []
        self.claimed: set[bytes] = set()
        self.unordered: set[int] = set()
        self.last_time: list[float] = []
        self.first_time: list[float] = []
        self.file_step: dict[int, int] = {}
        self.file_rollout: dict[int, int] = {}
        self.step_marks: Counter[int] = Counter()
        self.rollout_marks: Counter[int] = Counter()
        self.file_cell: dict[int, int] = {}
        self.recovery = RecoveryTracker()
        self.closure = Closure()
        self.healed: set[int] = set()  # cells that received their state from a donor at some point
        self.cell_last: dict[int, int] = {}
        self.deaths: dict[int, list[list[Any]]] = {}
        self.max_step = -1
        self.placement: dict[tuple[str, int, int], dict[str, Any]] = {}  # (role, cell|engine, rank) -> latest
        core = {
            "run_started": self._run_started,
            "run_resumed": self._run_resumed,
            "run_finished": self._run_finished,
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
        }
        self.handlers: dict[str, list[Callable[[dict[str, Any], int, int], None]]] = {
            t: [core[t]] if t in core else [] for t in _all_types()
        }
        for rule in self.rules:
            for t in rule.events:
                self.handlers[t].append(rule.on_event)

    def attach(self, streams: int, locate: Callable[[int, int], Where], per_process: bool) -> None:
        """Size the per-stream state for ``streams`` streams; ``locate(stream, loc)`` gives the
        (file, line) of an item; ``per_process``: raise ``NotPerProcess`` instead of reading a
        stream that is not one source's lines in ``seq`` order."""
        self.locate, self.per_process = locate, per_process
        self.seq_next = [0] * streams
        self.file_source = [None] * streams
        self.last_time = [-math.inf] * streams
        self.first_time = [math.inf] * streams
        self.closure.attach(streams)
        self.closed = self.closure.closed

    # ----------------------------------------------------------------- reporting
    def where(self, fi: int, line: int) -> Where:
        return self.locate(fi, line)

    def add_finding(self, rule: RuleHooks, message: str, severity: Severity, evidence: dict[str, Any]) -> None:
        if self.stored[rule.code] >= MAX_STORED:
            return
        self.stored[rule.code] += 1
        where = evidence.pop("where", None)
        if where is not None:
            evidence["file"], evidence["line"] = where
        self.findings.append(
            Finding(
                code=rule.code,
                rule=rule.name,
                severity=severity,
                message=message,
                evidence={k: v for k, v in evidence.items() if v is not None},
                fix=rule.fix,
            )
        )

    def report(self, code: str, message: str, severity: Severity | None = None, **evidence: Any) -> None:
        """Report for rule ``code`` when it is selected (the replay's own checks use this)."""
        rule = self.by_code.get(code)
        if rule is not None:
            rule.report(message, severity, **evidence)

    def issue(self, file: str, line: int, kind: str, message: str) -> None:
        """A line the reader could not decode (FT111)."""
        sev = Severity.warning if kind in ("truncated", "duplicate") else Severity.error
        self.report("FT111", f"{kind} line: {message}", sev, file=file, line=line, kind=kind)

    # ----------------------------------------------------------------- the loop
    def feed(self, event: dict[str, Any] | None, fi: int, line: int) -> None:
        if event is None:
            self._file_ended(fi, line)
            return
        self.events += 1
        t: Any = event.get("type")  # any JSON value until its check passes
        check = CHECKS.get(t) if type(t) is str else None  # is_valid, inlined: this runs once per line
        if check is None or not check(event):
            if type(t) is not str:
                what = "no" if t is None else f"a JSON {type(t).__name__} as"
                self.report("FT111", f"invalid event: {what} type", where=self.where(fi, line))
                return
            if not known(t):
                self.unknown_types[t[:64]] += 1
                return
            self.report("FT111", f"invalid {t} event: {explain(event)}", where=self.where(fi, line))
            return
        self.by_type[t] += 1
        try:
            self._envelope(event, fi, line)
        except _Skip:
            return
        for handler in self.handlers[t]:
            handler(event, fi, line)

    def _envelope(self, ev: dict[str, Any], fi: int, line: int) -> None:
        """Per-line checks of the envelope: source, seq chain, time order, run name (hot path)."""
        src = ev["source"]
        if src != self.file_source[fi]:
            self._source_changed(fi, ev, line)
        seq = ev["seq"]
        if seq != self.seq_next[fi]:
            if seq < self.seq_next[fi] and self.per_process:
                raise NotPerProcess(f"seq goes back in {self.where(fi, line)[0]}")
            self._seq(fi, line, seq, self.seq_next[fi])
        self.seq_next[fi] = seq + 1
        t = ev["time"]
        if t < self.last_time[fi] - 1.0 and fi not in self.unordered:
            self.unordered.add(fi)
            self.report(
                "FT111",
                "events are not in time order in this file (a concatenation?); pass the per-process files",
                Severity.warning,
                where=self.where(fi, line),
            )
        self.last_time[fi] = t
        if ev["run"] not in self.runs:
            self.runs[ev["run"]] = self.where(fi, line)
            if len(self.runs) > 1:
                self.report(
                    "FT111", f"events of several runs in one log: {sorted(self.runs)}", where=self.where(fi, line)
                )
        if self.closed[fi]:  # the incarnation was reopened (EventWriter appends): its last line counts
            self.closed[fi] = False
        if self.run_finished is not None and ev["type"] not in ("log_closed", "run_resumed"):
            self.after_finish[0] += 1
            self.after_finish[1] = self.after_finish[1] or self.where(fi, line)

    def _seq(self, fi: int, line: int, seq: int, expected: int) -> None:
        if seq != expected:
            what = (
                f"seq gap: {expected}..{seq - 1} missing"
                if seq > expected
                else f"seq went back from {expected - 1} to {seq}"
            )
            self.report("FT111", f"{what} (lost or duplicated lines)", where=self.where(fi, line))

    def _source_changed(self, fi: int, ev: dict[str, Any], line: int) -> None:
        src = ev["source"]
        if self.file_source[fi] is None:
            if self.per_process:
                key = repr(sorted(src.items())).encode()
                if key in self.claimed:
                    raise NotPerProcess(f"{self.where(fi, line)[0]} continues a source read from another file")
                self.claimed.add(key)
            self._file_started(fi, src, line)
            self.closure.started(fi, ev)
            self.first_time[fi] = self.last_time[fi] = ev["time"]
        elif self.per_process:
            raise NotPerProcess(f"{self.where(fi, line)[0]} holds events of several sources")
        else:  # a demultiplexed stream holds one source: only a line with duplicate keys gets here
            self.report(
                "FT111", "a line's source could not be read consistently (duplicate keys?)", where=self.where(fi, line)
            )
            raise _Skip

    def _file_started(self, fi: int, src: dict[str, Any], line: int) -> None:
        try:
            Source.model_validate(src, strict=True)
        except ValidationError as exc:
            self.report("FT111", f"invalid source {src}: {exc.errors()[0]['msg']}", where=self.where(fi, line))
        self.file_source[fi] = src
        cell = src.get("cell")
        if src.get("role") == "trainer" and type(cell) is int:
            self.file_cell[fi] = cell

    def _file_ended(self, fi: int, line: int) -> None:
        self.file_cell.pop(fi, None)
        self.closure.ended(fi, self.file_source[fi], self.first_time[fi], self.where(fi, line))
        step = self.file_step.pop(fi, None)
        if step is not None:
            self._unmark(self.step_marks, step)
            self._unmark(self.rollout_marks, self.file_rollout.pop(fi))
            self._advance()

    # ----------------------------------------------------------------- watermark
    @staticmethod
    def _unmark(marks: Counter[int], value: int) -> None:
        marks[value] -= 1
        if not marks[value]:
            del marks[value]

    def _progress(self, fi: int, line: int, step: int, rollout: int) -> bool:
        """Record that file ``fi`` reached ``step``; False when the step is already closed."""
        last = self.file_step.get(fi)
        if last == step:  # the common case: one more event of the file's current step
            return True
        if step < self.closed_below:
            self.late[0] += 1
            self.late[1] = self.late[1] or self.where(fi, line)
            return False
        if last is None or step > last:
            if last is not None:
                self._unmark(self.step_marks, last)
                self._unmark(self.rollout_marks, self.file_rollout[fi])
            self.file_step[fi] = step
            if step > self.max_step:
                self.max_step = step
            cell = self.file_cell.get(fi)
            if cell is not None:
                if step > self.cell_last.get(cell, -1):
                    self.cell_last[cell] = step
                deaths = self.deaths.get(cell)
                if deaths and deaths[-1][1] is None and step > deaths[-1][0]:
                    deaths[-1][1] = step  # a new incarnation reports: the cell is back
            self.file_rollout[fi] = max(rollout, self.file_rollout.get(fi, rollout))
            self.step_marks[step] += 1
            self.rollout_marks[self.file_rollout[fi]] += 1
            if last is not None and last not in self.step_marks and last < min(self.step_marks):
                self._advance()  # the slowest file moved on
        return True

    def _advance(self, final: bool = False) -> None:
        if not final and not self.step_marks:
            return  # no file reports steps right now: wait for the next one (or the end)
        step_mark = min(self.step_marks) if not final else math.inf
        roll_mark = min(self.rollout_marks) if not final else math.inf
        limit = step_mark - LAG + 1
        if limit > self.closed_below and self.pending:
            for key in sorted(k for k in self.pending if k[1] < limit):
                self._close_step(self.pending.pop(key))
        if limit > self.closed_below and limit != math.inf:
            self.closed_below = int(limit)
        open_rollouts = {k[0] for k in self.pending}
        for r in sorted(self.rollouts):
            if r < roll_mark and r not in open_rollouts:
                self._close_rollout(self.rollouts.pop(r))

    def finish(self) -> None:
        self._advance(final=True)
        for label, where in self.closure.cut_streams():
            self.report(
                "FT111",
                f"the log of {label} ends without log_closed and the driver did not declare it dead: lines were cut",
                where=where,
            )
        lost = self.closure.lost_steps()
        if lost:
            self.report(
                "FT112",
                f"the driver trained step(s) {_ranges(lost)} but no rank logged anything of them",
                steps=lost[:100],
            )
        for rule in self.rules:
            rule.finish()

    @property
    def duration(self) -> float | None:
        """Seconds from the earliest to the latest event (None for an empty log)."""
        started = [t for t in self.first_time if t != math.inf]
        return max(self.last_time) - min(started) if started else None

    # ----------------------------------------------------------------- membership
    def alive(self, epoch: int | None, rec: StepRecord) -> frozenset[int] | None:
        """Alive set of ``epoch`` (see the module docstring); None when it cannot be known."""
        if epoch in self.epochs:
            return self.epochs[epoch]
        if epoch is None or self.epochs and epoch > min(self.epochs):
            return None
        if rec.alive_snapshot:
            alive = rec.alive_snapshot
        elif self.run_started is not None:
            alive = frozenset(range(self.run_started["num_cells"]))
        else:
            alive = frozenset(rec.outcomes) | {c for fps in rec.fingerprints.values() for c in fps}
        self.epochs[epoch] = alive
        return alive

    @property
    def ranks_per_cell(self) -> int:
        if self.run_started is not None:
            tp: int = self.run_started["tp"]
            pp: int = self.run_started["pp"]
            return max(1, tp * pp)
        return self.max_rank + 1

    def cell_lost(self, cell: int, step: int) -> bool:
        """The cell died during ``step``: the driver declared it ``errored`` while the run was at
        ``step`` or before, and it had not come back by then (the driver declared it ``alive``
        again, or a new incarnation reported a later step). Only the driver's declaration makes a
        death: a rank log that merely ends proves nothing (it may be cut)."""
        return any(died <= step and (back is None or step < back) for died, back in self.deaths.get(cell, ()))

    def _died(self, cell: int) -> None:
        deaths = self.deaths.setdefault(cell, [])
        if not deaths or deaths[-1][1] is not None:
            deaths.append([max(self.cell_last.get(cell, -1), self.max_step), None])

    # ----------------------------------------------------------------- core handlers
    def _record(self, ev: dict[str, Any], fi: int, line: int) -> StepRecord | None:
        key = (ev["rollout"], ev["step"], ev["attempt"])
        rec = self.pending.get(key)
        if rec is not None and self.file_step.get(fi) == key[1]:
            return rec  # the common case, without a call
        if rec is None:
            if not self._progress(fi, line, key[1], key[0]):
                return None
            snapshot = frozenset(c for c, s in self.cell_status.items() if s == "alive") if self.cell_status else None
            rec = self.pending[key] = StepRecord(key[0], key[1], key[2], ev["time"], snapshot)
            self.closure.see_step(key[1])
            if key[0] not in self.rollouts:
                self.rollouts[key[0]] = RolloutRecord(key[0])
        elif not self._progress(fi, line, key[1], key[0]):
            return None
        return rec

    def _rank(self, ev: dict[str, Any]) -> int | None:
        rank = ev.get("rank")
        if rank is None:
            rank = ev["source"].get("rank")
        if type(rank) is int and rank > self.max_rank:
            self.max_rank = rank
        return rank

    def _run_started(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if self.run_started is None:
            self.run_started = ev
        else:
            self.report("FT111", "run_started logged twice", Severity.warning, where=self.where(fi, line))

    def _placement(self, ev: dict[str, Any], fi: int, line: int) -> None:
        index = ev["cell"] if ev["role"] == "trainer" else ev["engine"]
        if type(index) is int:
            self.placement[(ev["role"], index, ev.get("rank") or 0)] = ev

    def _engine_failed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.closure.engine_failed(ev["engine"], ev["time"])

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

    def _run_finished(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.run_finished = (ev, self.where(fi, line))

    def _cell_state(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.cell_status[ev["cell"]] = ev["new"]
        if ev["new"] == "alive":  # the driver declares the cell back from the next step on
            deaths = self.deaths.get(ev["cell"])
            if deaths and deaths[-1][1] is None:
                deaths[-1][1] = self.max_step + 1
        if ev["new"] in DEAD_STATES:  # "stopped" is a deliberate stop at a step boundary, not a death
            self._died(ev["cell"])
            self.closure.declared_dead(ev["cell"], ev["time"])
            self.recovery.detected(ev["time"], ev["cell"])

    def _reconfigure(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.epochs[ev["epoch"]] = frozenset(ev["alive_after"])
        self.recovery.reconfigured(ev["time"])

    def _step_outcome(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rec.epoch = ev["epoch"] if rec.epoch is None else rec.epoch
        rec.outcomes.setdefault(ev["cell"], {})[self._rank(ev)] = (ev["outcome"], self.where(fi, line))
        if ev["outcome"] != "committed":
            self.recovery.detected(ev["time"])

    def _fingerprint(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rank, total = self._rank(ev), ev["total"]
        rec.fingerprints.setdefault(rank, {})[ev["cell"]] = total
        if (rank, total) not in rec.fp_detail:
            rec.fp_detail[(rank, total)] = (ev["params"], ev["optimizer"], ev["cell"], self.where(fi, line))

    def _witness_counts(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rec.witness_cells.add(ev["cell"])
        if rec.witness is None:
            rec.witness = (ev["ids"], ev["counts"], ev["cell"], self.where(fi, line))
        elif ev["ids"] != rec.witness[0] or ev["counts"] != rec.witness[1]:
            rec.witness_conflicts.append((ev["cell"], self.where(fi, line)))

    def _witness_allocated(self, ev: dict[str, Any], fi: int, line: int) -> None:
        ro = self.rollouts.get(ev["rollout"])
        if ro is None:
            if self.rollout_marks and ev["rollout"] < min(self.rollout_marks):  # already closed
                self.late[0] += 1
                self.late[1] = self.late[1] or self.where(fi, line)
                return
            ro = self.rollouts[ev["rollout"]] = RolloutRecord(ev["rollout"])
        if ev["attempt"] >= ro.alloc_attempt:
            ro.ids, ro.expected, ro.alloc_attempt = ev["ids"], ev["expected"], ev["attempt"]
            ro.where = self.where(fi, line)

    def _grad_nonfinite(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self._progress(fi, line, ev["step"], ev["rollout"])
        self.recovery.detected(ev["time"], ev["cell"])

    def _metric(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["step"] is not None and ev["source"].get("role") == "driver":
            self.closure.declare_step(ev["step"])

    def _log_closed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["lines"] != ev["seq"]:
            self.report(
                "FT111",
                f"log_closed says {ev['lines']} line(s) were written before it, but its seq is {ev['seq']}",
                where=self.where(fi, line),
            )
        self.closed[fi] = True

    def _fault(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.closure.fault(fi, ev["kind"])
        self.recovery.fault(ev, self.where(fi, line))

    def _heal(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.healed(ev["time"], ev["cell"])
        self.healed.add(ev["cell"])

    def _checkpoint_closed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.checkpoint_closed(ev["time"], "rejected" if ev["type"] == "checkpoint_rejected" else "published")

    # ----------------------------------------------------------------- closing
    def _close_step(self, rec: StepRecord) -> None:
        rec.committed_cells = frozenset(
            c for c, ranks in rec.outcomes.items() if any(o == "committed" for o, _ in ranks.values())
        )
        alive = self.alive(rec.epoch, rec)
        rec.live = alive if alive is not None else frozenset(rec.outcomes)
        rec.lost = frozenset(c for c in rec.live if self.cell_lost(c, rec.step))
        self.steps_closed += 1
        if rec.committed:
            self.steps_committed += 1
            ro = self.rollouts.get(rec.rollout)
            if ro is not None:
                ro.committed_steps += 1
                if rec.witness is not None:
                    ro.counted_steps += 1
                    tally = ro.tally
                    for i, n in zip(rec.witness[0], rec.witness[1]):
                        tally[i] = tally.get(i, 0) + n
        if rec.outcomes:
            self.recovery.step_closed(rec.t0, rec.committed, rec.attempt, rec.step)
        for rule in self.rules:
            rule.on_step(rec)

    def _close_rollout(self, ro: RolloutRecord) -> None:
        self.recovery.rollout_closed(ro.rollout, ro.deficit())
        for rule in self.rules:
            rule.on_rollout(ro)


def _ranges(values: list[int], limit: int = 8) -> str:
    """``1-3, 7`` (at most ``limit`` ranges, then ``...``)."""
    out: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out[:limit]) + (", ..." if len(out) > limit else "")


def _all_types() -> list[str]:
    from ftkit.events.schema import EVENT_TYPES

    return list(EVENT_TYPES)
