"""The shared state of the replay and how it reports: the base of ``ftkit.analysis.replay.Replay``.

The replay is one class assembled in layers, each in its own module and each using only the
layers below it (a linear chain, so every attribute and method has one home):

- ``ReplayState`` (here): every piece of state the layers and the rules share, the per-stream
  arrays sized by ``attach`` and the reporting (``where``, ``report``, ``issue``, ``add_finding``);
- ``ftkit.analysis.membership.Membership``: who is alive in an epoch, who was lost in a step;
- ``ftkit.analysis.watermark.Watermark``: open step and rollout records, closed by the watermark;
- ``ftkit.analysis.handlers.EventHandlers``: the replay's own handler of each event type;
- ``ftkit.analysis.replay.Replay``: the per-line loop (envelope checks, dispatch) and ``finish``.

Rules read the state documented on ``Replay`` (``run_started``, ``epochs``, ``healed``,
``recovery`` ...); everything else is internal.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from ftkit.analysis.closure import Closure
from ftkit.analysis.records import RolloutRecord, RuleHooks, StepRecord, Where
from ftkit.analysis.recovery import RecoveryTracker
from ftkit.analysis.step_phases import StepPhases
from ftkit.findings import Finding, Severity

MAX_STORED = 500  # findings kept per rule (all are counted)


class ReplayState:
    """State shared by the replay's layers and read by the rules; see the module docstring."""

    def __init__(self) -> None:
        self.locate: Callable[[int, int], Where] = lambda fi, line: (str(fi), line)
        self.per_process = False
        self.rules: list[RuleHooks] = []
        self.by_code: dict[str, RuleHooks] = {}
        self.findings: list[Finding] = []
        self.stored: Counter[str] = Counter()
        self.unknown_types: Counter[str] = Counter()
        self.by_type: Counter[str] = Counter()
        self.events = 0
        # run and membership
        self.run_started: dict[str, Any] | None = None
        self.run_finished: tuple[dict[str, Any], Where] | None = None
        self.profile: dict[str, Any] | None = None  # the evidence_profile (ftkit.analysis.profile); None: ftkit train's
        self.runs: dict[str, Where] = {}
        self.after_finish: list[Any] = [0, None]
        self.epochs: dict[int, frozenset[int]] = {}
        self.cell_status: dict[int, str] = {}
        self.max_rank = -1
        self.healed: set[int] = set()  # cells that received their state from a donor at some point
        self.cell_last: dict[int, int] = {}
        self.deaths: dict[int, list[list[Any]]] = {}
        self.max_step = -1
        self.declared_step = -1  # the last step the driver declared trained (its metric) in this session
        self.step_phases = StepPhases()  # where the steps' time went (their metrics' phases)
        self.placement: dict[tuple[str, int, int], dict[str, Any]] = {}  # (role, cell|engine, rank) -> latest
        self.peak_rss: dict[str, int] = {}  # role -> the largest peak RSS a closed log of that role reported
        # open steps and rollouts
        self.pending: dict[tuple[int, int, int], StepRecord] = {}
        self.rollouts: dict[int, RolloutRecord] = {}
        self.closed_below = 0
        self.late: list[Any] = [0, None]
        self.steps_closed = self.steps_committed = 0
        self.last_committed = -1  # the highest step committed in the current session's view
        self.restarts: list[dict[str, int]] = []  # per run_resumed: checkpoint_step, steps retrained
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
        self.closed: list[bool] = self.closure.closed

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
        """(file, line) of line ``line`` of stream ``fi``."""
        return self.locate(fi, line)

    def add_finding(self, rule: RuleHooks, message: str, severity: Severity, evidence: dict[str, Any]) -> None:
        """Store a finding of ``rule`` (at most ``MAX_STORED`` per rule; the rule counts all)."""
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
                fix=rule.hint(),
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
