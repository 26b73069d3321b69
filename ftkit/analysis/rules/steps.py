"""Step commit and membership (invariants I1-I3): FT106 commit, FT108 membership, FT112 evidence."""

from __future__ import annotations

from typing import Any

from ftkit.analysis.profile import MAX_OWED, TRACKED_EVENTS, Promises, cadence, expects, unknown_kinds
from ftkit.analysis.records import StepRecord
from ftkit.analysis.registry import Rule, register


@register
class CommitInconsistent(Rule):
    code = "FT106"
    name = "commit-inconsistent"
    description = (
        "a step committed by some live cells and discarded, failed or missing on others "
        "(or on some ranks of a cell), a step committed twice, or a step attempt committed although "
        "a rank found a non-finite gradient in it (grad_nonfinite), whatever the evidence profile"
    )
    fix = (
        "the commit protocol broke: every live cell must commit an attempt, or none may; an attempt "
        "with a non-finite gradient must be discarded (no optimizer step) and retried"
    )
    events = ("step_outcome", "run_resumed", "grad_nonfinite")

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.last: dict[tuple[int, int | None], tuple[int, int]] = {}
        # A grad_nonfinite belongs to the next step_outcome of its step in the same log (the guard
        # runs before the optimizer step): log -> step -> (tensor names, where of the first).
        self.nonfinite: dict[int, dict[int, tuple[list[str], tuple[str, int]]]] = {}
        # (step, attempt) -> cell -> (tensor names, where): committed although non-finite
        self.committed_nonfinite: dict[tuple[int, int], dict[int, tuple[list[str], tuple[str, int]]]] = {}

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["type"] == "run_resumed":  # commits after the checkpoint are superseded: trained again
            ckpt = ev["checkpoint_step"]
            self.last = {k: (min(step, ckpt), attempt) for k, (step, attempt) in self.last.items()}
            return
        if ev["type"] == "grad_nonfinite":
            names, _ = self.nonfinite.setdefault(fi, {}).setdefault(ev["step"], ([], self.replay.where(fi, line)))
            names.append(str(ev["where"]))
            return
        rank = ev["rank"] if "rank" in ev else ev["source"].get("rank")
        self.outcome(ev["cell"], rank, ev["step"], ev["attempt"], ev["outcome"], fi, line)

    def outcome(self, cell: int, rank: int | None, step: int, attempt: int, outcome: str, fi: int, line: int) -> None:
        """A ``step_outcome`` by its fields (also what the replay calls for a compact record)."""
        pending = self.nonfinite.get(fi)
        if pending:
            bad = pending.pop(step, None)
            for old in [s for s in pending if s < step]:  # logged after its step's outcome: not this rule's
                del pending[old]
            if bad is not None and outcome == "committed":
                self.committed_nonfinite.setdefault((step, attempt), {}).setdefault(cell, bad)
        if outcome != "committed":
            return
        key = (cell, rank)
        prev = self.last.get(key)
        if prev is not None and step <= prev[0]:
            self.report(
                f"cell {cell} rank {rank} committed step {step} (attempt {attempt}) "
                f"after already committing step {prev[0]} (attempt {prev[1]})",
                cell=cell,
                rank=rank,
                step=step,
                attempt=attempt,
                where=self.replay.where(fi, line),
            )
            step = prev[0]
        self.last[key] = (step, attempt)  # the highest step committed so far

    def on_step(self, rec: StepRecord) -> None:
        nonfinite = self.committed_nonfinite.pop((rec.step, rec.attempt), None)
        if not rec.committed:
            self._uncommitted(rec)
            return
        self.check()
        if nonfinite:
            self._committed_nonfinite(rec, nonfinite)
        n_ranks = self.replay.ranks_per_cell
        problems = []
        for cell in sorted(rec.live | rec.committed_cells):
            lost = cell in rec.lost  # died during the step: missing reports are excused, explicit ones not
            ranks = rec.outcomes.get(cell)
            if not ranks:
                if not lost:
                    problems.append(f"missing on cell {cell}")
                continue
            bad = sorted((r, o) for r, (o, _) in ranks.items() if o != "committed" and r is not None)
            if not lost:
                bad += [(r, "missing") for r in range(n_ranks) if r not in ranks and None not in ranks]
            for r, o in bad:
                problems.append(f"{o} on cell {cell} rank {r}")
        if problems:
            self.report(
                f"step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) committed by cells "
                f"{sorted(rec.committed_cells)} but {'; '.join(problems[:8])}",
                cells=sorted(rec.committed_cells),
                problems=problems,
                **rec.evidence(),
            )

    def _committed_nonfinite(self, rec: StepRecord, by_cell: dict[int, tuple[list[str], tuple[str, int]]]) -> None:
        """Committed although ranks logged ``grad_nonfinite`` for the attempt: the optimizer stepped
        on NaN / Inf gradients, so the state is no longer trustworthy (whatever metrics say)."""
        cells = sorted(by_cell)
        names = sorted({n for ns, _ in by_cell.values() for n in ns})
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.report(
            f"step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) was committed although "
            f"cell(s) {cells} found non-finite gradients in it ({shown}): the optimizer stepped on NaN / Inf",
            cells=cells,
            tensors=names[:20],
            where=by_cell[cells[0]][1],
            **rec.evidence(),
        )

    def _uncommitted(self, rec: StepRecord) -> None:
        """An attempt no cell committed still needs an outcome from every live rank that did not die
        during it: a failed or discarded attempt whose reports are missing hides how it ended."""
        self.check()
        n_ranks = self.replay.ranks_per_cell
        missing = []
        for cell in sorted(rec.live - rec.lost):
            ranks = rec.outcomes.get(cell, {})
            if None in ranks:
                continue
            missing += [f"cell {cell} rank {r}" for r in range(n_ranks) if r not in ranks]
        if missing:
            self.report(
                f"step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) was not committed and has "
                f"no outcome from {', '.join(missing[:8])}",
                problems=missing,
                **rec.evidence(),
            )


@register
class MembershipInconsistent(Rule):
    code = "FT108"
    name = "membership-inconsistent"
    description = (
        "a cell commits steps while not a member of the epoch's alive set, the alive set contradicts "
        "reconfigure / cell_state, or a cell_state transition starts from a state the cell was not in"
    )
    fix = "the driver's cell state machine and the cross-cell groups disagree: check reconfigure and heal ordering"
    events = ("cell_state", "reconfigure", "run_resumed")

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.state: dict[int, str] = {}
        self.epoch: int | None = None
        self.alive: frozenset[int] | None = None

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["type"] == "run_resumed":  # a new session: its cells start from pending, no members yet
            self.state, self.alive = {}, frozenset()
            return
        where = self.replay.where(fi, line)
        self.check()
        if ev["type"] == "cell_state":
            prev = self.state.get(ev["cell"])
            if prev is not None and prev != ev["old"]:
                self.report(
                    f"cell {ev['cell']}: cell_state {ev['old']} -> {ev['new']}, but it was {prev}",
                    cell=ev["cell"],
                    where=where,
                )
            self.state[ev["cell"]] = ev["new"]
            return
        epoch, before = ev["epoch"], frozenset(ev["alive_before"])
        if self.epoch is not None and epoch <= self.epoch:
            self.report(f"reconfigure to epoch {epoch} after epoch {self.epoch}", epoch=epoch, where=where)
        prev_alive = self.alive if self.alive is not None else self.replay.epochs.get(epoch - 1)
        if prev_alive is not None and before != prev_alive:
            self.report(
                f"reconfigure to epoch {epoch}: alive_before {sorted(before)} but the previous alive set "
                f"was {sorted(prev_alive)}",
                epoch=epoch,
                where=where,
            )
        self.epoch, self.alive = epoch, frozenset(ev["alive_after"])

    def on_step(self, rec: StepRecord) -> None:
        if not rec.committed:
            return
        self.check()
        alive = self.replay.alive(rec.epoch, rec)
        if alive is None:
            self.report(f"step {rec.step} ran in epoch {rec.epoch}, which no reconfigure announced", **rec.evidence())
            return
        outsiders = sorted(rec.committed_cells - alive)
        if outsiders:
            self.report(
                f"cell(s) {outsiders} committed step {rec.step} but are not in epoch {rec.epoch}'s alive "
                f"set {sorted(alive)}",
                cells=outsiders,
                **rec.evidence(),
            )
        if rec.alive_snapshot is not None and rec.alive_snapshot != alive:
            self.report(
                f"epoch {rec.epoch}'s alive set {sorted(alive)} contradicts cell_state, which has cells "
                f"{sorted(rec.alive_snapshot)} alive at step {rec.step}",
                cells=sorted(alive ^ rec.alive_snapshot),
                **rec.evidence(),
            )


@register
class MissingEvidence(Rule):
    code = "FT112"
    name = "missing-evidence"
    description = (
        "a committed step without a state_fingerprint from every live rank or without witness counts, "
        "a trained rollout without witness_allocated, or a log with no committed step at all; with an "
        "evidence_profile: anything it promised and the log lacks (ftkit.analysis.profile)"
    )
    fix = "forensics fail closed: make every rank log its fingerprint and witness counts at each committed step"
    events = ("evidence_profile", *TRACKED_EVENTS)

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.promises = Promises()

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["type"] != "evidence_profile":
            self.promises.saw(ev)
        elif unknown_kinds(ev):
            self.report(f"evidence_profile promises kind(s) {unknown_kinds(ev)} this analyzer cannot check")

    def on_step(self, rec: StepRecord) -> None:
        if not rec.committed:
            return
        self.check()
        profile = self.replay.profile
        self.promises.due(profile, rec.step)
        n_ranks = self.replay.ranks_per_cell
        missing = []
        for cell in sorted((rec.live - rec.lost) | rec.committed_cells):
            have = {r for r, by_cell in rec.fingerprints.items() if cell in by_cell}
            if None in have or not expects(profile, "state_fingerprint", rec.step):
                continue
            missing += [f"cell {cell} rank {r}" for r in range(n_ranks) if r not in have]
        if missing:
            self.report(
                f"committed step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) has no "
                f"state_fingerprint from {', '.join(missing[:8])}",
                missing=missing,
                **rec.evidence(),
            )
        if not expects(profile, "witness_counts", rec.step):
            pass
        elif rec.witness is None:
            self.report(
                f"committed step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) has no witness_counts",
                **rec.evidence(),
            )
        else:
            silent = sorted(((rec.live - rec.lost) | rec.committed_cells) - rec.witness_cells)
            if silent:
                self.report(
                    f"committed step {rec.step} (rollout {rec.rollout}, attempt {rec.attempt}) has no "
                    f"witness_counts from cell(s) {silent} (every cell reads them from its reduced gradient)",
                    cells=silent,
                    **rec.evidence(),
                )

    def on_rollout(self, ro: Any) -> None:
        if ro.committed_steps and cadence(self.replay.profile, "witness_counts") is not None:
            self.check()
            if ro.ids is None:
                self.report(
                    f"rollout {ro.rollout} was trained ({ro.committed_steps} committed steps) but has no "
                    f"witness_allocated",
                    rollout=ro.rollout,
                )

    def finish(self) -> None:
        self.check()
        if self.replay.steps_committed == 0:
            self.report("the log holds no committed step: nothing proves the run trained correctly")
        for kind, steps in self.promises.missing().items():
            self.report(
                f"the evidence_profile promises {kind} but committed step(s) {steps[:MAX_OWED]} have none",
                kind=kind,
                steps=steps[:MAX_OWED],
            )
