"""Replica and engine identity (invariant I1): FT101 divergence, FT102 engine weights, FT107 heal."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftkit.analysis.records import StepRecord
from ftkit.analysis.registry import Rule, register
from ftkit.findings import Severity

if TYPE_CHECKING:
    from ftkit.analysis.replay import Replay

MAX_NAMES = 5
KEEP_VERSIONS = 8
_WITNESS_WHAT = {
    "counts": "counts (ids or counts)",
    "contributions": "contributions (each sample's share of the reduced gradient)",
}


def differing_tensors(
    ref: tuple[dict[str, str], dict[str, str]], other: tuple[dict[str, str], dict[str, str]]
) -> list[str]:
    """Tensor names (in the reference's order) whose fingerprints differ; optimizer state is
    prefixed ``optimizer/``."""
    names: list[str] = []
    for prefix, a, b in (("", ref[0], other[0]), ("optimizer/", ref[1], other[1])):
        names += [prefix + n for n, h in a.items() if b.get(n) != h]
        names += [prefix + n for n in b if n not in a]
        if len(names) >= MAX_NAMES:
            break
    return names[:MAX_NAMES]


def majority(by_cell: dict[int, str]) -> str | None:
    """The value held by strictly more cells than any other, or None on a tie."""
    ranked = Counter(by_cell.values()).most_common()
    if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
        return ranked[0][0]
    return None


@register
class ReplicaDivergence(Rule):
    code = "FT101"
    name = "replica-divergence"
    description = (
        "state_fingerprint.total differs between cells for the same (rollout, step, attempt, rank), "
        "or cells (any incarnation) report different witness ids, counts or contributions for the same "
        "reduced gradient"
    )
    fix = (
        "the replicas are no longer identical: look at the first differing tensors of the outlier cell; "
        "check for non-deterministic kernels, thread counts or a float (non-exact) reduction"
    )

    def __init__(self, replay: Replay) -> None:
        super().__init__(replay)
        self.open: dict[int | None, _Divergence] = {}  # rank -> the divergence still going on

    def on_step(self, rec: StepRecord) -> None:
        for rank, by_cell in rec.fingerprints.items():
            if len(by_cell) < 2:
                continue
            self.check()
            going = self.open.get(rank)
            if len(set(by_cell.values())) == 1:
                if going is not None:
                    self._close(rank)
                continue
            top = majority(by_cell)
            if top is not None:
                ref_cell = min(c for c, t in by_cell.items() if t == top)
                who = "differ from the majority"
            else:  # a tie (two cells): the reference is the lowest cell never healed, the likelier intact
                ref_cell = min(by_cell, key=lambda c: (c in self.replay.healed, c))
                who = f"differ from cell {ref_cell} (no majority; cell {ref_cell} is the reference: never healed)"
            ref_total = by_cell[ref_cell]
            outliers = sorted(c for c, t in by_cell.items() if t != ref_total)
            if going is not None and going.cells == outliers:
                going.last, going.count = rec.step, going.count + 1
                continue
            if going is not None:
                self._close(rank)
            ref, other = rec.fp_detail[(rank, ref_total)], rec.fp_detail[(rank, by_cell[outliers[0]])]
            names = differing_tensors(ref[:2], other[:2])
            if names:
                detail = f"first differing tensors: {', '.join(names)}"
            elif ref[0] or other[0]:
                detail = "every per-tensor fingerprint agrees: only the total differs (corrupt total or line)"
            else:
                detail = "the log holds no per-tensor fingerprints to name the tensors"
            self.open[rank] = _Divergence(
                outliers,
                rec.step,
                f"replica divergence at step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) "
                f"rank {rank}: cell(s) {outliers} {who}; {detail}",
                {
                    "cells": outliers,
                    "rank": rank,
                    "tensors": names,
                    "reference_cell": ref_cell,
                    "majority_cells": sorted(c for c, t in by_cell.items() if t == top) if top else None,
                    "where": other[3],
                    **rec.evidence(),
                },
            )
        if rec.witness is not None and rec.committed:
            self.check()
            for what in ("counts", "contributions"):
                conflicts = [(c, where) for c, where, w in rec.witness_conflicts if w == what]
                if not conflicts:
                    continue
                cells = sorted({c for c, _ in conflicts})
                self.report(
                    f"cells disagree on the witness {_WITNESS_WHAT[what]} of step {rec.step} (rollout "
                    f"{rec.rollout}, attempt {rec.attempt}): cell {rec.witness[2]} vs cell(s) {cells}",
                    cells=[rec.witness[2], *cells],
                    differs=what,
                    where=conflicts[0][1],
                    **rec.evidence(),
                )

    def finish(self) -> None:
        for rank in list(self.open):
            self._close(rank)

    def _close(self, rank: int | None) -> None:
        """Report rank ``rank``'s divergence: one finding from its first step to its last."""
        d = self.open.pop(rank)
        more = f"; still diverged at every later step checked, through step {d.last} ({d.count} steps)"
        self.report(d.message + (more if d.count > 1 else ""), **d.evidence, last_step=d.last, steps=d.count)


@dataclass
class _Divergence:
    """Cells ``cells`` of one rank diverged at a step (``message``, ``evidence``) and at each of
    the ``count`` steps checked from it to ``last``, with no step in between where they agreed."""

    cells: list[int]
    last: int
    message: str
    evidence: dict[str, Any]
    count: int = 1


@register
class EngineWeights(Rule):
    code = "FT102"
    name = "engine-weights"
    description = (
        "an engine loaded weights other than those sent for that version, engines disagree, "
        "an engine did not report a version that was sent (except the version in flight when "
        "a session that was later resumed stopped), or the weights sent for rollout r are not the "
        "trainers' committed state after the last step of the rollouts before r (the tensors whose "
        "names both fingerprint, one rank per cell)"
    )
    fix = "check the weight transfer to the engines (dtype casts, TP gather order, a stale version)"
    events = ("weights_sent", "engine_weights", "run_finished", "run_resumed")

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.sent: OrderedDict[int, tuple[str, dict[str, str], tuple[str, int]]] = OrderedDict()
        self.loaded: OrderedDict[int, dict[int, str]] = OrderedDict()
        self.completed = False  # the current session logged run_finished "completed"
        # rollout -> (its last committed step, that step's parameter entries or None: not fingerprinted)
        self.state: OrderedDict[int, tuple[int, dict[str, str] | None]] = OrderedDict()
        # syncs waiting for the state they must be: (rollout, version, params, where)
        self.syncs: list[tuple[int, int, dict[str, str], tuple[str, int]]] = []

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["type"] == "run_finished":
            self.completed = ev["status"] == "completed"
            return
        if ev["type"] == "run_resumed":
            # A version in flight when a session was killed (no run_finished: its driver and
            # engines died together, between the push and the loads) or stopped (failed,
            # interrupted) could not be reported by every engine; the resumed session sends
            # its weights again. Only a completed session still owes every report.
            for old in list(self.sent):
                if self.completed:
                    self._close(old)
                else:
                    self.sent.pop(old)
                    self.loaded.pop(old, None)
            self.completed = False
            for r in [r for r in self.state if r > ev["checkpoint_rollout"]]:  # superseded: trained again
                del self.state[r]
            return
        where = self.replay.where(fi, line)
        version = ev["version"]
        if ev["type"] == "weights_sent":
            for old in list(self.sent):
                self._close(old)
            self.sent[version] = (ev["total"], ev["params"], where)
            self.loaded.setdefault(version, {})
            self.syncs.append((ev["rollout"], version, ev["params"], where))
            return
        self.check()
        engines = self.loaded.setdefault(version, {})
        engines[ev["engine"]] = ev["total"]
        sent = self.sent.get(version)
        if sent is not None:
            if ev["total"] != sent[0]:
                names = differing_tensors((sent[1], {}), (ev["params"], {}))
                self.report(
                    f"engine {ev['engine']} loaded weights {ev['total'][:12]} for version {version}, "
                    f"sent {sent[0][:12]}; first differing tensors: {', '.join(names) or '?'}",
                    engine=ev["engine"],
                    version=version,
                    rollout=ev["rollout"],
                    tensors=names,
                    where=where,
                )
        elif len(set(engines.values())) > 1:
            self.report(
                f"engines disagree on version {version}: {engines}",
                engines=sorted(engines),
                version=version,
                rollout=ev["rollout"],
                where=where,
            )
        elif len(engines) == 1:
            self.report(
                f"engine {ev['engine']} loaded version {version}, which was never sent (no weights_sent): "
                f"nothing proves it holds the trained weights",
                engine=ev["engine"],
                version=version,
                where=where,
            )

    def _close(self, version: int) -> None:
        sent = self.sent.pop(version, None)
        engines = self.loaded.pop(version, {})
        started = self.replay.run_started
        n = started["num_engines"] if started is not None else 0
        missing = [e for e in range(n) if e not in engines]
        if sent is not None and missing:
            self.report(
                f"engine(s) {missing} did not report loading weights version {version}",
                engines=missing,
                version=version,
                where=sent[2],
            )
        while len(self.loaded) > KEEP_VERSIONS:
            self.loaded.popitem(last=False)

    def on_step(self, rec: StepRecord) -> None:
        """A committed step: the syncs for later rollouts can now be held against the state of the
        rollouts before them; then this step is the newest state of its rollout."""
        if not rec.committed:
            return
        self._syncs_before(rec.rollout)
        last = self.state.get(rec.rollout)
        if last is None or rec.step >= last[0]:
            self.state[rec.rollout] = (rec.step, self._params(rec))
            self.state.move_to_end(rec.rollout)
        while len(self.state) > KEEP_VERSIONS:
            self.state.popitem(last=False)

    def _params(self, rec: StepRecord) -> dict[str, str] | None:
        """The parameter entries of the step's committed state (the majority of the cells), when
        a cell has one rank (the engines get full tensors) and the step was fingerprinted; in a
        bf16 run its ``weights`` entries (the masters cast to bf16: what the engines are sent)."""
        if self.replay.ranks_per_cell != 1 or len(rec.fingerprints) != 1:
            return None
        rank, by_cell = next(iter(rec.fingerprints.items()))
        top = majority(by_cell) or by_cell[min(by_cell)]
        weights = rec.fp_weights.get((rank, top))  # a bf16 run: what the engines are sent is the cast
        if weights is not None:
            return dict(weights)
        detail = rec.fp_detail.get((rank, top))
        return None if detail is None or detail[0] is None else dict(detail[0])

    def _syncs_before(self, rollout: int | None) -> None:
        """Check the syncs for rollouts up to ``rollout`` (None: all, at the end of the log)."""
        keep = []
        for sync in self.syncs:
            if rollout is None or sync[0] <= rollout:
                self._against_state(*sync)
            else:
                keep.append(sync)
        self.syncs = keep

    def _against_state(self, rollout: int, version: int, params: dict[str, str], where: tuple[str, int]) -> None:
        earlier = [r for r in self.state if r < rollout]
        if not earlier:
            return  # the initial weights (no committed step before): nothing logged to hold them to
        step, state = self.state[max(earlier)]
        if state is None:
            return  # that step was not fingerprinted (a cadence), or the layout shards the tensors
        common = [n for n in params if n in state]
        if not common:
            return  # the engines' own names (vLLM: Hugging Face names, its dtype): not comparable
        self.check()
        differ = [n for n in common if params[n] != state[n]]
        if differ:
            self.report(
                f"weights version {version} sent for rollout {rollout} are not the trainers' committed state "
                f"after step {step}: {len(differ)} of {len(common)} tensors differ "
                f"({', '.join(differ[:MAX_NAMES])})",
                version=version,
                rollout=rollout,
                step=step,
                tensors=differ[:MAX_NAMES],
                where=where,
            )

    def finish(self) -> None:
        for version in list(self.sent):
            self._close(version)
        self._syncs_before(None)


@register
class HealUnverified(Rule):
    code = "FT107"
    name = "heal-unverified"
    description = (
        "a heal's total differs from donor_total, or the healed cell's first committed fingerprint "
        "differs from its peers'"
    )
    fix = "the state transfer to the restarted cell is incomplete or corrupted: check what the donor sends"
    events = ("heal",)

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.pending: dict[int, tuple[float, tuple[str, int]]] = {}

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        where = self.replay.where(fi, line)
        self.check()
        if ev["total"] != ev["donor_total"]:
            self.report(
                f"heal of cell {ev['cell']} from donor {ev['donor']}: received state {ev['total'][:12]} "
                f"!= donor's {ev['donor_total'][:12]}",
                cell=ev["cell"],
                donor=ev["donor"],
                epoch=ev["epoch"],
                where=where,
            )
        self.pending[ev["cell"]] = (ev["time"], where)

    def on_step(self, rec: StepRecord) -> None:
        if not self.pending or not rec.committed:
            return
        for cell, (t, where) in list(self.pending.items()):
            if rec.t0 < t:
                continue
            checked = False
            for rank, by_cell in rec.fingerprints.items():
                peers = {c: h for c, h in by_cell.items() if c != cell}
                if cell not in by_cell or not peers:
                    continue
                checked = True
                ref = majority(peers)
                if by_cell[cell] != ref:
                    self.report(
                        f"healed cell {cell}: first committed fingerprint at step {rec.step} rank {rank} "
                        f"differs from its peers {sorted(peers)}",
                        cell=cell,
                        rank=rank,
                        where=where,
                        **rec.evidence(),
                    )
            if checked:
                del self.pending[cell]

    def finish(self) -> None:
        for cell, (_, where) in self.pending.items():
            self.report(
                f"heal of cell {cell} never verified: it committed no step alongside a peer afterwards",
                Severity.warning,
                cell=cell,
                where=where,
            )
