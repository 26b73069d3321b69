"""Resuming training from a published checkpoint: the in-process primitive and its checks.

``restore_cells(roster, checkpoint) -> (rollout, step)`` is what ``ftkit train --resume`` does
after its cells started, and what a run that lost every cell reuses: it reads a checkpoint
that verifies (``ftkit.checkpoint.restore.load``, fail-closed), puts its tensors in Ray's
object store once and has every rank of every live cell load them
(``RankWorker.restore_checkpoint``: parameters, optimizer moments and steps, counters,
witness table). Each rank then fingerprints what it holds; a total other than the manifest's
``state_fingerprint`` raises in the rank and ``RestoreFailed`` here. A cell that dies while
restoring is failed through the roster (``roster.fail``: restarted and healed from a live
peer at the next step boundary, like any failure); no live cell left is ``RunFailed``.
The returned ``(rollout, step)`` is the checkpoint's: training continues with step
``step + 1`` of rollout ``rollout + 1`` (a checkpoint is published at the end of a rollout).

A checkpoint holds the TP=1/PP=1 state whatever layout trained it, so any ``--tp`` / ``--pp``
resumes from it: each rank slices its own shard out (``ftkit.train.rank.canonical_state.local_state``).
What a resumed session starts from (config, checkpoint, epochs, incarnations) is
``ftkit.train.recovery.resume_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.train.control.run_end import RunFailed

if TYPE_CHECKING:
    from ftkit.train.control.roster import CellRoster


class RestoreFailed(RunFailed):
    """A checkpoint could not be loaded into the cells (exit 1): a rank's state after the
    restore does not match the checkpoint's fingerprint, or the checkpoint does not fit."""


@dataclass(frozen=True)
class CheckpointState:
    """A checkpoint read into memory: its tensors per file and what the ranks check them by."""

    path: Path
    step: int
    rollout: int
    state_fingerprint: str
    files: dict[str, dict[str, Any]]
    rank_totals: dict[str, str]  # {rank: total} the ranks logged, in the layout it was taken in
    layout: dict[str, Any]  # meta.json's {"tp", "pp"} of that layout

    @property
    def meta(self) -> dict[str, Any]:
        """What ``RankWorker.restore_checkpoint`` checks the loaded state against."""
        return {
            "step": self.step,
            "rollout": self.rollout,
            "state_fingerprint": self.state_fingerprint,
            "rank_totals": dict(self.rank_totals),
            "layout": dict(self.layout),
        }


def read_checkpoint(checkpoint: Path, verified: bool = False) -> CheckpointState:
    """Verify and read ``checkpoint`` (``InputError`` when it does not verify); ``verified``:
    the caller verified it just before (``newest_trusted``), so it is hashed once."""
    from ftkit.checkpoint.layout import MANIFEST
    from ftkit.checkpoint.manifest import load as load_manifest
    from ftkit.checkpoint.restore import load
    from ftkit.tensors.fingerprint import SCHEME

    files, meta = load(checkpoint, verified=verified)
    man, _ = load_manifest(checkpoint / MANIFEST)
    if man.rollout is None or man.state_fingerprint is None:
        raise RestoreFailed(
            f"checkpoint {checkpoint} has no rollout or no state fingerprint: it is not a training checkpoint",
            hint="resume from a checkpoint that `ftkit train` published",
        )
    if man.fingerprint_scheme != SCHEME:  # the ranks check what they load in this version's scheme
        raise RestoreFailed(
            f"checkpoint {checkpoint} records {man.fingerprint_scheme} fingerprints, this ftkit computes {SCHEME}",
            hint="load it with the ftkit version that wrote it",
        )
    layout: dict[str, Any] = meta["layout"] if isinstance(meta.get("layout"), dict) else {}
    return CheckpointState(
        Path(checkpoint), man.step, man.rollout, man.state_fingerprint, files, dict(man.rank_totals), layout
    )


def restore_cells(roster: CellRoster, checkpoint: Path | CheckpointState) -> tuple[int, int]:
    """Load ``checkpoint`` into every live cell of ``roster`` (see the module docstring);
    returns the checkpoint's ``(rollout, step)``."""
    import ray

    state = checkpoint if isinstance(checkpoint, CheckpointState) else read_checkpoint(checkpoint)
    ref = ray.put(state.files)
    while True:
        roster.require_cells()
        alive = roster.book.alive()
        answers = roster.wait(
            {c: roster.cells[c].restore_checkpoint(ref, state.meta) for c in alive}, roster.step_timeout
        )
        wrong = {c: cause for c, cause in answers.failed.items() if cause.startswith("exception")}
        if wrong:
            c, cause = min(wrong.items())
            raise RestoreFailed(
                f"cell {c} could not restore checkpoint {state.path.name}: {cause}",
                hint=f"run 'ftkit verify-checkpoint {state.path}'; a checkpoint of another model or "
                "bookkeeping setting cannot be resumed here",
            )
        for c, cause in sorted(answers.failed.items()):
            roster.fail(c, f"while restoring {state.path.name}: {cause}")
        if all(c in answers.values for c in roster.book.alive()):
            return state.rollout, state.step
