"""``Side``: one run's log read step by step, through the same reader, demultiplexer, replay and
integrity rules as ``ftkit analyze-events``.

The input is what ``analyze-events`` takes: a run directory, an events/ directory, log files or
one merged log (``-``: standard input). Per-process files are read as they are; anything else
(a merged file, lines in any order) is demultiplexed by source first (``ftkit.events.demux``),
exactly as ``ftkit.analysis.engine.analyze_paths`` does. The replay runs only the log-integrity
rules (FT106, FT111, FT112) and a ``Ledger``; ``advance`` replays the next ``n`` events, so two
sides can be read in step with each other (``ftkit.runs.compare``) and the memory of the
comparison follows how far apart they are, not the length of the logs.

``damage()`` is the fail-closed verdict on the input: the integrity findings that are errors
(lines lost, cut or forged, a log without ``log_closed``, owed evidence missing, commits that
contradict each other). A damaged log is never compared as if whole: the comparison is
unusable input (exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ftkit.analysis.registry import INTEGRITY, all_rules
from ftkit.analysis.replay import NotPerProcess, Replay
from ftkit.events.demux import DemuxStream
from ftkit.events.reader import STDIN, EventStream, discover
from ftkit.findings import Finding, Severity, sort_findings
from ftkit.runs.ledger import Ledger
from ftkit.runs.matcher import Matcher

CAUSE_FIRST = ("FT111", "FT112", "FT106")  # lines lost or cut, evidence missing, commits contradicted


class Side:
    """Run ``index`` (0: A, 1: B) of a comparison, read from ``paths``."""

    def __init__(self, index: int, paths: Iterable[str | os.PathLike[str]], matcher: Matcher) -> None:
        self.index, self.matcher = index, matcher
        self.paths = [Path(p) for p in paths]
        self.files = discover(self.paths)
        self.done = False
        self._open(demux=STDIN in self.files)

    @property
    def label(self) -> str:
        return "AB"[self.index]

    def _open(self, demux: bool) -> None:
        rules = all_rules()
        ledger_cls = [lambda replay: Ledger(replay, self.matcher, self.index)]
        self.replay = Replay([*(rules[c] for c in INTEGRITY), *ledger_cls])
        self.ledger: Ledger = next(r for r in self.replay.rules if isinstance(r, Ledger))
        self.demuxed = demux
        self.stream: EventStream | DemuxStream = (
            DemuxStream(self.files, self.replay.issue) if demux else EventStream(self.files, self.replay.issue)
        )
        self.replay.attach(len(self.stream.names), self.stream.locate, not demux)
        self._items: Iterator[tuple[Any, int, int]] = iter(self.stream.events())

    def advance(self, n: int) -> None:
        """Replay the next ``n`` items; at the end of the log finish the replay (``done``)."""
        taken = [0]

        def chunk() -> Iterator[tuple[Any, int, int]]:  # streamed: n decoded events held at once would
            for item in islice(self._items, n):  # survive into the collector's older generations
                taken[0] += 1
                yield item

        try:
            self.replay.run(chunk(), None)
        except NotPerProcess:  # not one process per file: read it again, demultiplexed
            self.stream.close()
            self.matcher.reset(self.index)
            self._open(demux=True)
            return
        if taken[0] < n:
            self.replay.finish()
            self.stream.close()
            self.done = True
            self.matcher.finished(self.index)

    @property
    def closed_below(self) -> int:
        """Steps below this are closed (handed to the ledger)."""
        return self.replay.closed_below

    def progress(self) -> tuple[int, int]:
        return self.stream.progress()

    def close(self) -> None:
        self.stream.close()

    def damage(self) -> list[Finding]:
        """The integrity findings that make this log unusable (errors of FT111, FT112, FT106, in
        that order: a cut log's FT111 explains the FT106 / FT112 it causes)."""
        found = sort_findings(f for f in self.replay.findings if f.code in INTEGRITY and f.severity is Severity.error)
        return sorted(found, key=lambda f: CAUSE_FIRST.index(f.code))

    def warnings(self) -> list[Finding]:
        return [f for f in self.replay.findings if f.code in INTEGRITY and f.severity is not Severity.error]

    def stats(self) -> dict[str, Any]:
        r = self.replay
        return {
            "paths": [str(p) for p in self.paths],
            "files": len(self.files),
            "read_as": "sorted by source" if self.demuxed else "per-process",
            "events": r.events,
            "runs": sorted(r.runs),
            "status": r.run_finished[0]["status"] if r.run_finished else None,
            "sessions": self.ledger.sessions,
            "layout": self.ledger.layout,
            "layout_changes": self.ledger.layout_changes,
            "steps_committed": len(self.matcher.steps[self.index]),
            "heals": r.by_type.get("heal", 0),
            "faults": r.by_type.get("fault_injected", 0),
            "attempts_discarded": r.steps_closed - r.steps_committed,
        }
