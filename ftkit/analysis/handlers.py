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

from ftkit.analysis.records import RolloutRecord
from ftkit.analysis.watermark import Watermark
from ftkit.events.schema import DEAD_STATES
from ftkit.findings import Severity
from ftkit.tensors.fingerprint import combine, state_total

Handler = Callable[[dict[str, Any], int, int], None]


class EventHandlers(Watermark):
    """The core event handlers (state in ``ReplayState``)."""

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
        if self.profile is None and not self.steps_closed:
            self.profile = ev
        else:  # the first one before any step counts: a later one could only promise less
            self.report("FT111", "evidence_profile logged twice or after steps", where=self.where(fi, line))

    def _run_finished(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.run_finished = (ev, self.where(fi, line))
        if ev["status"] == "completed" and ev["source"].get("role") == "driver":
            self.recovery.run_completed()

    def _placement(self, ev: dict[str, Any], fi: int, line: int) -> None:
        index = ev["cell"] if ev["role"] == "trainer" else ev["engine"]
        if type(index) is int:
            self.placement[(ev["role"], index, ev.get("rank") or 0)] = ev

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
    def _step_outcome(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        if rec.epoch is None:
            rec.epoch = ev["epoch"]
        ranks = rec.outcomes.get(ev["cell"])
        if ranks is None:
            ranks = rec.outcomes[ev["cell"]] = {}
        outcome = ev["outcome"]
        ranks[self._rank(ev)] = (outcome, self.locate(fi, line))
        if outcome != "committed":
            self.recovery.detected(ev["time"])
        else:
            self.recovery.committed(ev["time"])

    def _fingerprint(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rank, total = self._rank(ev), ev["total"]
        detail = rec.fp_detail.get((rank, total))  # its total was recomputed: equal parts need no new hash
        if detail is None or detail[0] != ev["params"] or detail[1] != ev["optimizer"]:
            total = self._recompute(ev, fi, line, state_total(ev["params"], ev["optimizer"]))
            detail = rec.fp_detail.get((rank, total))
        cells = rec.fingerprints.get(rank)
        if cells is None:
            cells = rec.fingerprints[rank] = {}
        cells[ev["cell"]] = total
        if detail is None:
            rec.fp_detail[(rank, total)] = (ev["params"], ev["optimizer"], ev["cell"], self.locate(fi, line))

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
            self.report(
                "FT111",
                f"{ev['type']} total {ev['total'][:12]} is not the fingerprint of its own per-tensor "
                f"entries ({parts[:12]}): a damaged or forged line",
                where=self.where(fi, line),
            )
            ev["total"] = parts
        return parts

    def _witness_counts(self, ev: dict[str, Any], fi: int, line: int) -> None:
        rec = self._record(ev, fi, line)
        if rec is None:
            return
        rec.witness_cells.add(ev["cell"])
        if rec.witness is None:
            rec.witness = (ev["ids"], ev["counts"], ev["cell"], self.locate(fi, line))
        elif ev["ids"] != rec.witness[0] or ev["counts"] != rec.witness[1]:
            rec.witness_conflicts.append((ev["cell"], self.locate(fi, line)))

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
        self.recovery.healed(ev["time"], ev["cell"], ev["bytes"], ev["epoch"])
        self.healed.add(ev["cell"])

    def _checkpoint_closed(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.recovery.checkpoint_closed(ev["time"], "rejected" if ev["type"] == "checkpoint_rejected" else "published")
