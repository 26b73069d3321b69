"""The timeline of a run, built from its event log in one streaming pass (for ``--html``).

``build_timeline(paths)`` reads the same files as ``analyze_paths`` (``ftkit.events.reader``)
and returns a :class:`~ftkit.analysis.timeline_model.Timeline`: what happened when, ready to
draw.

- **lanes**: one per cell (``cell 0`` ...) holding state intervals from ``cell_state``
  (``alive``, ``failed`` for ``errored``, ``restarting`` for a ``starting`` that follows a
  failure, ``starting``, ``pending``, ``stopped``) plus ``healing`` intervals (a ``heal``
  event at time t covers ``[t - sum(seconds), t]``);
- **markers**: faults (``fault`` = injected, the ground truth; ``detected`` = a cell turned
  ``errored``, after an injected fault or not, or a rank logged ``grad_nonfinite``), heals (bytes, seconds, donor),
  reconfigures (epoch, alive set), step attempts that did not commit (``discarded``),
  weight pushes, engine loads and checkpoints (published or rejected), each with its file
  and line;
- **steps**: step attempts aggregated into at most ``MAX_BINS`` bins of equal step width
  (the width doubles when a run outgrows them), each with its time span (from the first to
  the last ``step_outcome`` of its attempts, extended back by the driver's ``step_seconds``
  metric where it logs one), attempts,
  committed and not-committed counts and per-metric count / sum / min / max;
- per-rollout metrics (``step`` null, e.g. the driver's ``reward``) are counted at the
  first step after they were logged.

Memory is bounded: the bins, ``MAX_MARKERS`` markers per kind and ``MAX_INTERVALS`` intervals
per lane (the rest are counted in ``dropped``; routine marks -- weight pushes, engine loads,
checkpoints -- are thinned evenly instead, one kept per ``strides[kind]``), and the step attempts still open (an attempt
is folded into its bin once the stream is ``LAG`` steps past it). Log content never raises:
a line without the fields a kind needs is counted in ``skipped`` and ignored.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ftkit.analysis.timeline_model import Interval, Marker, StepBin, Timeline, add_stat
from ftkit.events.demux import DemuxStream
from ftkit.events.envelope import DEAD_STATES
from ftkit.events.reader import STDIN, EventStream, discover

MAX_BINS = 512
MAX_MARKERS = 1000
MAX_INTERVALS = 2000
ROUTINE = frozenset({"weights", "engine", "checkpoint"})  # thinned, not cut, when there are too many
LAG = 4
_STATE = {"errored": "failed"}  # schema-1 logs said errored where the driver now says failed


class _Builder:
    """Folds events into a :class:`Timeline`; one instance per pass."""

    def __init__(self, locate: Callable[[int, int], tuple[str, int]]) -> None:
        self.locate = locate
        self.tl = Timeline()
        self.bins: dict[int, StepBin] = {}  # bin index -> bin
        self.open: dict[tuple[int, int], list[Any]] = {}  # (step, attempt) -> [t0, t1, committed?, marked?]
        self.max_step = -1
        self.state: dict[int, tuple[str, float, str | None]] = {}  # cell -> (state, since, reason)
        self.fault_cells: set[int] = set()
        self.metric_names: dict[str, None] = {}
        self.pending_rollout_metrics: list[tuple[str, float]] = []
        self.kinds: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()
        self.where = (0, 0)

    # ------------------------------------------------------------------ bins
    def bin_of(self, step: int) -> StepBin:
        tl = self.tl
        while step // tl.width >= MAX_BINS:
            merged: dict[int, StepBin] = {}
            for idx, b in sorted(self.bins.items()):
                into = merged.get(idx // 2)
                if into is None:
                    b.first = (idx // 2) * tl.width * 2
                    merged[idx // 2] = b
                else:
                    into.merge(b)
            self.bins, tl.width = merged, tl.width * 2
        idx = step // tl.width
        found = self.bins.get(idx)
        if found is None:
            found = self.bins[idx] = StepBin(idx * tl.width)
        return found

    def fold(self, below: int) -> None:
        """Move the open attempts of steps below ``below`` into their bins."""
        for key in [k for k in self.open if k[0] < below]:
            t0, t1, ok, _ = self.open.pop(key)
            b = self.bin_of(key[0])
            b.t0, b.t1 = min(b.t0, t0), max(b.t1, t1)
            b.attempts += 1
            b.steps += key[1] == 0
            if ok:
                b.committed += 1
            else:
                b.not_committed += 1

    # ------------------------------------------------------------------ lanes and markers
    def interval(self, cell: int, state: str, start: float, end: float, reason: str | None) -> None:
        lane = self.tl.lanes.setdefault(f"cell {cell}", [])
        if len(lane) >= MAX_INTERVALS:
            self.tl.dropped[f"interval:cell {cell}"] += 1
            return
        lane.append(Interval(state, start, end, reason))

    def cell_state(self, ev: dict[str, Any], t: float) -> None:
        cell, new = int(ev["cell"]), str(ev["new"])
        prev = self.state.get(cell)
        if prev is not None:
            self.interval(cell, prev[0], prev[1], t, prev[2])
        shown = _STATE.get(new, new)
        if new == "starting" and prev is not None and prev[0] in ("failed", "restarting"):
            shown = "restarting"
        self.state[cell] = (shown, t, ev.get("reason"))
        self.tl.lanes.setdefault(f"cell {cell}", [])
        if new in DEAD_STATES:  # a failure detected, whether a fault was injected or not
            cause = "after an injected fault" if cell in self.fault_cells else "no injected fault"
            self.fault_cells.discard(cell)
            self.mark("detected", t, f"cell {cell}", f"cell {cell} errored: {ev.get('reason') or '?'} ({cause})")

    # ------------------------------------------------------------------ the pass
    def feed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        t = ev.get("time")
        if not isinstance(t, (int, float)) or not math.isfinite(t):
            self.tl.skipped += 1
            return
        tl = self.tl
        tl.events += 1
        tl.start, tl.end = min(tl.start, t), max(tl.end, t)
        self.where = (fi, line)
        kind = ev.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return
        try:
            handler(self, ev, float(t))
        except (KeyError, TypeError, ValueError):
            tl.skipped += 1

    def mark(self, kind: str, t: float, lane: str, label: str, step: Any = None) -> None:
        tl = self.tl
        if kind in ROUTINE:
            key = f"{kind}@{lane}"
            seen = self.seen[key]
            self.seen[key] += 1
            stride = tl.strides.get(key, 1)
            if seen % stride:
                return
            if self.kinds[key] >= MAX_MARKERS:  # thin out: keep every other one, halve the rate
                kept = [m for m in tl.markers if m.kind == kind and m.lane == lane]
                drop = {id(m) for m in kept[1::2]}
                tl.markers = [m for m in tl.markers if id(m) not in drop]
                self.kinds[key] -= len(drop)
                tl.strides[key] = stride * 2
                if seen % (stride * 2):
                    return
            self.kinds[key] += 1
        elif self.kinds[kind] >= MAX_MARKERS:
            tl.dropped[f"marker:{kind}"] += 1
            return
        else:
            self.kinds[kind] += 1
        file, line = self.locate(*self.where)
        self.tl.markers.append(Marker(kind, t, lane, label, file, line, step if isinstance(step, int) else None))

    def finish(self) -> Timeline:
        tl = self.tl
        self.fold(self.max_step + 1)
        end = tl.end if tl.events else 0.0
        for cell, (state, since, reason) in sorted(self.state.items()):
            self.interval(cell, state, since, max(end, since), reason)
        for lane in tl.lanes.values():
            lane.sort(key=lambda iv: (iv.start, iv.state == "healing"))
        if self.bins:
            last = max(self.bins)
            tl.bins = [self.bins.get(i) or StepBin(i * tl.width) for i in range(min(self.bins), last + 1)]
        tl.metric_names = list(self.metric_names)
        tl.markers.sort(key=lambda m: m.time)
        return tl


def _run_started(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.tl.run = str(ev.get("run"))


def _run_finished(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.tl.status = str(ev["status"])


def _reconfigure(b: _Builder, ev: dict[str, Any], t: float) -> None:
    alive = ",".join(str(c) for c in ev["alive_after"])
    why = f": {ev['reason']}" if ev.get("reason") else ""
    b.mark("reconfigure", t, "driver", f"epoch {ev['epoch']}, alive [{alive}]{why}")


def _step_outcome(b: _Builder, ev: dict[str, Any], t: float) -> None:
    step, attempt, outcome = int(ev["step"]), int(ev["attempt"]), str(ev["outcome"])
    rec = b.open.get((step, attempt))
    if rec is None:
        rec = b.open[(step, attempt)] = [t, t, True, False]
    rec[0], rec[1] = min(rec[0], t), max(rec[1], t)
    if outcome != "committed":
        rec[2] = False
        if not rec[3]:
            rec[3] = True
            b.mark("discarded", t, "steps", f"step {step} attempt {attempt} {outcome} (cell {ev.get('cell')})", step)
    if step > b.max_step:
        b.max_step = step
        b.fold(step - LAG)
        for name, value in b.pending_rollout_metrics:
            _metric_value(b, step, name, value)
        b.pending_rollout_metrics.clear()


def _metric_value(b: _Builder, step: int, name: str, value: float) -> None:
    b.metric_names.setdefault(name, None)
    if math.isfinite(value):
        add_stat(b.bin_of(step).metrics, name, 1, value, value, value)


def _metric(b: _Builder, ev: dict[str, Any], t: float) -> None:
    step = ev.get("step")
    took = dict(ev["values"]).get("step_seconds")
    if isinstance(step, int) and isinstance(took, (int, float)) and math.isfinite(took):
        for (s, _), rec in b.open.items():  # the driver timed the step: its attempt began that long ago
            if s == step:
                rec[0] = min(rec[0], t - float(took))
    for name, value in dict(ev["values"]).items():
        if not isinstance(value, (int, float)):
            continue
        if isinstance(step, int):
            _metric_value(b, step, str(name), float(value))
        elif len(b.pending_rollout_metrics) < 64:
            b.pending_rollout_metrics.append((str(name), float(value)))


def _fault(b: _Builder, ev: dict[str, Any], t: float) -> None:
    cell = ev.get("cell")
    lane = f"cell {cell}" if isinstance(cell, int) else "driver"
    if isinstance(cell, int):
        b.fault_cells.add(cell)
    where = f"rank {ev.get('rank')}, step {ev.get('step')}" if ev.get("step") is not None else f"rank {ev.get('rank')}"
    b.mark("fault", t, lane, f"injected {ev['kind']} at {ev['point']} ({where})", ev.get("step"))


def _heal(b: _Builder, ev: dict[str, Any], t: float) -> None:
    cell = int(ev["cell"])
    seconds = {str(k): float(v) for k, v in dict(ev.get("seconds") or {}).items()}
    took = sum(seconds.values())
    state = b.state.get(cell)
    since = state[1] if state is not None and state[0] == "restarting" else -math.inf
    b.interval(cell, "healing", max(t - took, since), t, f"from cell {ev['donor']}")
    phases = ", ".join(f"{k} {v:.3g}s" for k, v in seconds.items())
    ok = "" if ev.get("total") == ev.get("donor_total") else "; FINGERPRINT MISMATCH"
    b.mark(
        "heal",
        t,
        f"cell {cell}",
        f"healed from cell {ev['donor']}: {_bytes(int(ev['bytes']))} in {took:.3g}s ({phases}), "
        f"epoch {ev['epoch']}{ok}",
    )


def _nonfinite(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.mark("detected", t, f"cell {ev['cell']}", f"non-finite gradient at step {ev['step']}: {ev['where']}", ev["step"])


def _weights(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.mark("weights", t, "driver", f"weights version {ev['version']} pushed ({str(ev['total'])[:12]})")


def _engine(b: _Builder, ev: dict[str, Any], t: float) -> None:
    engine = int(ev["engine"])
    b.mark("engine", t, f"engine {engine}", f"loaded version {ev['version']} ({str(ev['total'])[:12]})")


def _checkpoint(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.mark("checkpoint", t, "driver", f"checkpoint {ev['kind']} at step {ev['step']}: {ev['path']}", ev["step"])


def _rejected(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.mark("rejected", t, "driver", f"checkpoint rejected at step {ev['step']}: {ev['reason']}", ev["step"])


def _logprob_check(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.tl.logprobs.check(ev)


def _canary(b: _Builder, ev: dict[str, Any], t: float) -> None:
    b.tl.logprobs.canary(ev)


_HANDLERS = {
    "run_started": _run_started,
    "run_finished": _run_finished,
    "cell_state": lambda b, ev, t: b.cell_state(ev, t),
    "reconfigure": _reconfigure,
    "step_outcome": _step_outcome,
    "metric": _metric,
    "fault_injected": _fault,
    "heal": _heal,
    "grad_nonfinite": _nonfinite,
    "weights_sent": _weights,
    "engine_weights": _engine,
    "checkpoint_published": _checkpoint,
    "checkpoint_rejected": _rejected,
    "logprob_check": _logprob_check,
    "canary_logprobs": _canary,
}


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def build_timeline(paths: Iterable[str | os.PathLike[str]], per_process: bool = True) -> Timeline:
    """The timeline of the logs under ``paths`` (same inputs as ``analyze_paths``; unreadable
    paths raise ``InputError``). Lines that do not decode are skipped here: the analyzer
    reports them as findings.

    The events are folded in the order the analyzer replays them, so the timeline is a function
    of the set of lines, not of their arrangement: ``per_process`` (each file one process's
    incarnation, ``seq`` rising: what ``analyze_paths`` found, ``stats["read_as"] ==
    "per-process"``) merges the files by time; otherwise the lines are demultiplexed by source
    first (``ftkit.events.demux``), which yields the same events in the same order."""
    files = discover(paths)
    stream: EventStream | DemuxStream = (
        EventStream(files, _ignore) if per_process and STDIN not in files else DemuxStream(files, _ignore)
    )
    builder = _Builder(stream.locate)
    feed = builder.feed
    try:
        for event, index, loc in stream.events():
            if event is not None:
                feed(event, index, loc)
    finally:
        stream.close()
    return builder.finish()


def _ignore(file: str, line: int, kind: str, message: str) -> None:
    """Issues of the input are the analyzer's findings; the timeline skips those lines."""
