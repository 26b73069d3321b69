"""``analyze_paths``: the library entry point of ``ftkit analyze-events`` (and of ``ftkit train``).

    result = analyze_paths([run_dir / "events"], select=None, skip=None)
    result.findings   # list[Finding], most severe first
    result.rules      # list[RuleSummary]: every selected rule with checked / finding counts, not_covered
    result.stats      # dict: events, files, lines, bytes, run, cells, steps, ...
    result.recovery   # list[dict]: one row per injected fault (see ftkit.analysis.recovery)
    result.notes      # list[str]: warnings for stderr (unknown event types, findings not stored)
    result.seconds    # float: the analysis' wall seconds (reading, replay, rules)
    result.rule_seconds  # dict[str, float]: seconds in each rule's own hooks (timed=True only)
    result.verdict(FailOn.error)  # "pass" | "fail"

Missing or unreadable paths and unknown rule codes raise ``InputError`` / ``UsageError``
(exit 2). Everything inside the files -- bad bytes, malformed or truncated lines, invalid events
-- becomes a finding; the analysis never raises on log content. One pass, streaming, memory
bounded by open steps (see ``ftkit.analysis.replay``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from ftkit.analysis.demux_worker import DemuxWorkerStream
from ftkit.analysis.parallel import ParallelStream, WorkerLost, default_workers, demux_workers
from ftkit.analysis.profile import uncovered
from ftkit.analysis.registry import select_rules
from ftkit.analysis.replay import NotPerProcess, Replay
from ftkit.analysis.replay_state import MAX_STORED
from ftkit.events.demux import DemuxStream
from ftkit.events.reader import STDIN, EventStream, discover, size_of
from ftkit.events.spill import SPILL_BYTES
from ftkit.findings import FailOn, Finding, RuleSummary, sort_findings, verdict

Stream = EventStream | DemuxStream  # ParallelStream is an EventStream
Progress = Callable[[int, int], None]  # (done, total): bytes of all reading passes (see ReadCounts.progress)


@dataclass
class AnalysisResult:
    findings: list[Finding]
    rules: list[RuleSummary]
    stats: dict[str, Any]
    recovery: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall seconds of the whole analysis
    rule_seconds: dict[str, float] = field(default_factory=dict)  # by code; empty unless timed

    def verdict(self, fail_on: FailOn | str = FailOn.error) -> str:
        """``"pass"`` or ``"fail"`` for a threshold (a ``FailOn`` or its value, ``"error"``)."""
        return verdict(self.findings, FailOn(fail_on))


def analyze_paths(
    paths: Iterable[str | os.PathLike[str]],
    select: list[str] | None = None,
    skip: list[str] | None = None,
    progress: Progress | None = None,
    spill_bytes: int = SPILL_BYTES,
    timed: bool = False,
) -> AnalysisResult:
    """Replay the event logs under ``paths`` and apply the selected rules (default: all).

    Per-process files (each one source, ``seq`` rising) are merged by time as they are read. Any
    other input -- one merged file, lines split over files, in any order, ``-`` for standard
    input -- is demultiplexed by source first (``ftkit.events.demux``), with the same result.
    ``spill_bytes`` bounds the memory of sorting such input (see ``ftkit.events.spill``).
    ``timed``: clock each rule's hooks into ``result.rule_seconds`` (for the JUnit report; a
    small cost per hook call, so only when asked).
    """
    t0 = perf_counter()
    rule_classes = select_rules(select, skip)
    files = discover(paths)
    workers = default_workers(len(files), sum(size_of(p) for p in files)) if STDIN not in files else 0
    for n in dict.fromkeys([workers, 0]) if STDIN not in files else []:  # a lost worker: again in one process
        replay = Replay(rule_classes, timed)
        n = n if replay.takes_compact else 0
        try:
            stream: Stream = ParallelStream(files, replay.issue, n) if n else EventStream(files, replay.issue)
        except WorkerLost:  # the system refused a process
            continue
        try:
            _replay(replay, stream, per_process=True, progress=progress)
            return _result(replay, stream, len(files), "per-process", t0)
        except NotPerProcess:
            break  # not one process per file: read it again, demultiplexed
        except WorkerLost:
            continue
        finally:
            stream.close()
    workers = demux_workers(sum(size_of(p) for p in files if p is not STDIN))
    while True:
        replay = Replay(rule_classes, timed)
        demux = DemuxWorkerStream if workers and replay.takes_compact else DemuxStream
        stream = demux(files, replay.issue, spill_bytes, progress=progress)
        try:
            _replay(replay, stream, per_process=False, progress=progress)
            return _result(replay, stream, len(files), stream.mode, t0)
        except WorkerLost:
            workers = 0  # a lost worker: read it all again in one process
        finally:
            stream.close()


def _replay(replay: Replay, stream: Stream, per_process: bool, progress: Progress | None) -> None:
    replay.attach(len(stream.names), stream.locate, per_process)
    tick = None if progress is None else lambda: progress(*stream.progress())
    replay.run(stream.events(), tick)
    replay.finish()
    if progress is not None:
        progress(stream.work(), stream.work())


def _result(replay: Replay, stream: Stream, n_files: int, mode: str, t0: float) -> AnalysisResult:
    not_covered = uncovered(replay.profile)
    rules = [
        RuleSummary(
            code=r.code,
            rule=r.name,
            severity=r.severity,
            description=r.description,
            fix=r.fix,
            checked=r.checked,
            findings=r.found,
            not_covered=not_covered.get(r.code),
        )
        for r in replay.rules
    ]
    notes = [
        f"skipped {n} event(s) of unknown type {t!r} (written by a newer ftkit?)"
        for t, n in sorted(replay.unknown_types.items())
    ]
    notes += [
        f"{r.code}: {r.found - MAX_STORED} more finding(s) counted but not listed"
        for r in replay.rules
        if r.found > MAX_STORED
    ]
    started = replay.run_started or {}
    finished = replay.run_finished[0] if replay.run_finished else {}
    stats = {
        "files": n_files,
        "read_as": mode,
        "lines": stream.lines,
        "bytes": stream.bytes_read,
        "events": replay.events,
        "events_by_type": dict(sorted(replay.by_type.items())),
        "unknown_types": dict(sorted(replay.unknown_types.items())),
        "runs": sorted(replay.runs),
        "status": finished.get("status"),
        "cells": started.get("num_cells"),
        "tp": started.get("tp"),
        "pp": started.get("pp"),
        "engines": started.get("num_engines"),
        "steps_closed": replay.steps_closed,
        "steps_committed": replay.steps_committed,
        "faults": len(replay.recovery.rows),
        "restarts": replay.restarts,
        "heals": replay.by_type.get("heal", 0),
        "engine_restarts": replay.by_type.get("engine_restart", 0),
        "duration_s": replay.duration,
        "placement": replay.placement_summary(),
        "evidence_profile": None if replay.profile is None else replay.profile["kinds"],
        "not_covered": sorted(r.code for r in rules if r.not_covered),
        "step_phases": replay.step_phases.summary(),
        "peak_rss_bytes": dict(sorted(replay.peak_rss.items())),
    }
    return AnalysisResult(
        findings=sort_findings(replay.findings),
        rules=rules,
        stats=stats,
        recovery=replay.recovery.table(),
        notes=notes,
        seconds=perf_counter() - t0,
        rule_seconds=dict(replay.rule_seconds),
    )
