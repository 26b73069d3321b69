"""The replay: walks the merged event stream once and keeps the shared state the rules read.

Per event it validates the line's structure (fast path, ``ftkit.events.validate``), checks the
per-stream ``seq`` chain, time order and run name (the envelope), updates the shared state
(``ftkit.analysis.handlers``) and hands the event to the rules that subscribed to its type. Step
evidence is gathered in open records closed by a watermark (``ftkit.analysis.watermark``), so
memory follows the open steps, never the length of the log; membership (who was alive, who was
lost) is in ``ftkit.analysis.membership``; the shared state and the reporting in
``ftkit.analysis.replay_state``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from ftkit.analysis.closure import stream_label
from ftkit.analysis.handlers import EventHandlers, Handler
from ftkit.analysis.parallel import HOT_TYPES
from ftkit.analysis.records import RuleHooks
from ftkit.analysis.rule_clock import clock_rules
from ftkit.analysis.watermark import LAG
from ftkit.events.envelope import Source
from ftkit.events.schema import EVENT_TYPES
from ftkit.events.validate import CHECKS, explain, known
from ftkit.findings import Severity

__all__ = ["LAG", "NotPerProcess", "Replay"]

TICK = 1 << 8  # events between two progress calls (the bar moves on logs of a few hundred lines)
#: Event types that may follow ``run_finished`` (a writer closing, a later session resuming the run).
AFTER_FINISH_OK = frozenset({"log_closed", "run_resumed"})


class NotPerProcess(Exception):
    """Raised (only when ``per_process`` is set) when a file turns out not to be one process's
    stream: a second source in it, a ``seq`` that goes back, or a source already read from another
    file. The caller replays again from a ``DemuxStream``."""


class Replay(EventHandlers):
    """One pass over a run's events: ``attach``, ``run`` over the (event, stream, line) items, then
    ``finish``; findings are in ``findings``. ``timed``: each rule's seconds in its own hooks are
    added up in ``rule_seconds`` (``ftkit.analysis.rule_clock``; empty when not timed)."""

    def __init__(self, rule_classes: Iterable[Callable[[Replay], RuleHooks]], timed: bool = False) -> None:
        super().__init__()
        self.rules = [cls(self) for cls in rule_classes]
        self.rule_seconds: dict[str, float] = {}
        if timed:
            clock_rules(self.rules, self.rule_seconds)
        self.by_code = {r.code: r for r in self.rules}
        core = self.core_handlers()
        self.handlers: dict[str, list[Handler]] = {t: [core[t]] if t in core else [] for t in EVENT_TYPES}
        for rule in self.rules:
            for t in rule.events:
                self.handlers[t].append(rule.on_event)
        # Compact records (ftkit.analysis.parallel) carry no dict: they can be replayed only when the
        # rules of their types read fields, i.e. only step_outcome, through an ``outcome`` method.
        hot = [r for r in self.rules if set(r.events) & set(HOT_TYPES)]
        self.outcome_hooks = [getattr(r, "outcome") for r in hot if hasattr(r, "outcome")]  # noqa: B009
        fields_only = [set(r.events) & set(HOT_TYPES) == {"step_outcome"} and hasattr(r, "outcome") for r in hot]
        self.takes_compact = all(fields_only)

    # ----------------------------------------------------------------- the loop
    def run(self, items: Iterable[tuple[Any, int, int]], tick: Callable[[], None] | None) -> None:
        """Replay ``(event, stream, line)`` items -- ``None`` as the event when a stream ended after
        line ``line`` -- calling ``tick()`` every ``TICK`` events (progress).

        Per event (the hot path, one function for all of it): the structural check, then the
        envelope -- source, ``seq`` chain, time order, run name, an incarnation reopened after its
        ``log_closed``, lines after ``run_finished`` -- then the handlers of its type (the core one
        first, then the rules).
        Anything unusual leaves the loop for a method that reports it.

        An event may also be a compact record (a tuple: ``ftkit.analysis.parallel``), a hot line a
        worker process already checked and whose envelope it found usual: only what depends on
        other streams is done here, then its type's compact handler."""
        # one lookup per line gives the check and the handlers of its type
        dispatch = {t: (check, self.handlers[t]) for t, check in CHECKS.items()}
        by_type = dict.fromkeys(dispatch, 0)  # a plain dict counts faster than a Counter (merged below)
        file_source, seq_next, last_time, runs = self.file_source, self.seq_next, self.last_time, self.runs
        closed, unordered = self.closed, self.unordered
        compact, hot = self.compact_handlers(), HOT_TYPES
        n = 0
        try:
            for event, fi, line in items:
                if event is None:
                    self._file_ended(fi, line)
                    continue
                n += 1
                if tick is not None and not n % TICK:
                    tick()
                if type(event) is tuple:  # a compact record: checked, its envelope the stream's usual one
                    code = event[0]
                    by_type[hot[code]] += 1
                    seq = event[3]
                    if seq != seq_next[fi]:
                        self._seq(fi, line, seq)
                    seq_next[fi] = seq + 1
                    time = event[1]
                    if time < last_time[fi] - 1.0 and fi not in unordered:
                        self._unordered(fi, line)
                    last_time[fi] = time
                    if closed[fi]:
                        closed[fi] = False
                    if self.run_finished is not None:
                        self.after_finish[0] += 1
                        self.after_finish[1] = self.after_finish[1] or self.where(fi, line)
                    compact[code](event, fi, line)
                    continue
                t: Any = event.get("type")  # any JSON value until its check passes
                try:
                    check, handlers = dispatch[t]
                except (KeyError, TypeError):  # no type, an unknown one, or not a string (unhashable)
                    self._invalid(event, t, fi, line)
                    continue
                if not check(event):
                    self._invalid(event, t, fi, line)
                    continue
                by_type[t] += 1
                if event["source"] != file_source[fi] and not self._source_changed(fi, event, line):
                    continue
                seq = event["seq"]
                if seq != seq_next[fi]:
                    self._seq(fi, line, seq)
                seq_next[fi] = seq + 1
                time = event["time"]
                if time < last_time[fi] - 1.0 and fi not in unordered:
                    self._unordered(fi, line)
                last_time[fi] = time
                if event["run"] not in runs:
                    self._new_run(event["run"], fi, line)
                if closed[fi]:  # the incarnation was reopened (EventWriter appends): its last line counts
                    closed[fi] = False
                if self.run_finished is not None and t not in AFTER_FINISH_OK:
                    self.after_finish[0] += 1
                    self.after_finish[1] = self.after_finish[1] or self.where(fi, line)
                for handler in handlers:
                    handler(event, fi, line)
        finally:
            self.events += n
            self.by_type.update({t: c for t, c in by_type.items() if c})

    def _invalid(self, event: dict[str, Any], t: Any, fi: int, line: int) -> None:
        """An event whose type is missing, unknown (counted, skipped) or whose fields are invalid."""
        if type(t) is not str:
            what = "no" if t is None else f"a JSON {type(t).__name__} as"
            self.report("FT111", f"invalid event: {what} type", where=self.where(fi, line))
        elif not known(t):
            self.unknown_types[t[:64]] += 1
        else:
            self.report("FT111", f"invalid {t} event: {explain(event)}", where=self.where(fi, line))

    def _unordered(self, fi: int, line: int) -> None:
        self.unordered.add(fi)
        self.report(
            "FT111",
            "events are not in time order in this file (a concatenation?); pass the per-process files",
            Severity.warning,
            where=self.where(fi, line),
        )

    def _new_run(self, run: str, fi: int, line: int) -> None:
        self.runs[run] = self.where(fi, line)
        if len(self.runs) > 1:
            self.report("FT111", f"events of several runs in one log: {sorted(self.runs)}", where=self.where(fi, line))

    def _seq(self, fi: int, line: int, seq: int) -> None:
        expected = self.seq_next[fi]
        if seq < expected and self.per_process:
            raise NotPerProcess(f"seq goes back in {self.where(fi, line)[0]}")
        what = (
            f"seq gap: {expected}..{seq - 1} missing"
            if seq > expected
            else f"seq went back from {expected - 1} to {seq}"
        )
        self.report("FT111", f"{what} (lost or duplicated lines)", where=self.where(fi, line))

    def _source_changed(self, fi: int, ev: dict[str, Any], line: int) -> bool:
        """The line's source differs from the stream's: its first line (True), or a line that cannot
        be used (reported; False)."""
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
            return True
        if self.per_process:
            raise NotPerProcess(f"{self.where(fi, line)[0]} holds events of several sources")
        # a demultiplexed stream holds one source: only a line with duplicate keys gets here
        self.report(
            "FT111", "a line's source could not be read consistently (duplicate keys?)", where=self.where(fi, line)
        )
        return False

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
        step = self.file_step.get(fi)
        self.closure.ended(fi, self.file_source[fi], self.first_time[fi], self.where(fi, line), step)
        self._stream_left(fi)

    def finish(self) -> None:
        """The log ended: close what is open, report cut streams and lost steps, finish the rules."""
        self._advance(final=True)
        for src, step, where in self.closure.cut_streams():
            after = "before its first step" if step is None else f"after step {step}"
            self.report(
                "FT111",
                f"{stream_label(src, self.profile is not None)} stopped logging {after} without log_closed, "
                "and no fault or death was logged for it: it died or was killed, or the end of its log "
                "was cut (check disk space)",
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
