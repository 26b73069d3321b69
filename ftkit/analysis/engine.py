"""``analyze_paths``: the library entry point of ``ftkit analyze-events`` (and of ``ftkit train``).

    result = analyze_paths([run_dir / "events"], select=None, skip=None)
    result.findings   # list[Finding], most severe first
    result.rules      # list[RuleSummary]: every selected rule with checked / finding counts
    result.stats      # dict: events, files, lines, bytes, run, cells, steps, ...
    result.recovery   # list[dict]: one row per injected fault (see ftkit.analysis.recovery)
    result.notes      # list[str]: warnings for stderr (unknown event types, findings not stored)
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
from typing import Any

from ftkit.analysis.registry import select_rules
from ftkit.analysis.replay import MAX_STORED, Replay
from ftkit.events.reader import EventStream, discover
from ftkit.findings import FailOn, Finding, RuleSummary, sort_findings, verdict

PROGRESS_EVERY = 1 << 16
Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class AnalysisResult:
    findings: list[Finding]
    rules: list[RuleSummary]
    stats: dict[str, Any]
    recovery: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def verdict(self, fail_on: FailOn = FailOn.error) -> str:
        return verdict(self.findings, fail_on)


def analyze_paths(
    paths: Iterable[str | os.PathLike[str]],
    select: list[str] | None = None,
    skip: list[str] | None = None,
    progress: Progress | None = None,
) -> AnalysisResult:
    """Replay the event logs under ``paths`` and apply the selected rules (default: all)."""
    rule_classes = select_rules(select, skip)
    files = discover(paths)
    names = [str(p) for p in files]
    replay = Replay(rule_classes, names)
    stream = EventStream(files, replay.issue)
    total = sum(p.stat().st_size for p in files)
    feed = replay.feed
    for n, (event, fi, line) in enumerate(stream.events(), start=1):
        feed(event, fi, line)
        if progress is not None and n % PROGRESS_EVERY == 0:
            progress(stream.position(), total)
    replay.finish()
    if progress is not None:
        progress(total, total)
    return _result(replay, stream, len(files))


def _result(replay: Replay, stream: EventStream, n_files: int) -> AnalysisResult:
    rules = [
        RuleSummary(
            code=r.code,
            rule=r.name,
            severity=r.severity,
            description=r.description,
            fix=r.fix,
            checked=r.checked,
            findings=r.found,
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
        "lines": stream.lines,
        "bytes": stream.bytes,
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
        "heals": replay.by_type.get("heal", 0),
        "duration_s": replay.duration,
    }
    return AnalysisResult(
        findings=sort_findings(replay.findings), rules=rules, stats=stats, recovery=replay.recovery.table(), notes=notes
    )
