"""Resuming a run after a restart: ``EvidenceRun(..., resume=True)`` and ``EvidenceRun.restore``.

A restarted job (``torchrun --max-restarts``, a requeued job) runs the same script into the same
run directory. With ``resume=True`` the processes of the new session find what the earlier ones
left and go on the way ``ftkit train --resume`` does, so the analyzer reads one run
(``ftkit.analysis.resumed``):

1. rank 0 sees an earlier session (a driver log with ``run_started`` in ``events/``; none: the
   run starts as new, so the first session may pass ``resume=True`` too) and picks the newest
   checkpoint of ``checkpoints/`` that ``verify-checkpoint RUN`` accepts, cross-checked with the
   log (``ftkit.checkpoint.selection.newest_trusted``, which first reconciles the journal: an
   interrupted publication is rolled back). When the profile promises witnesses, the
   checkpoint must also *end its rollout* (every sample allocated to the rollout was counted as
   often as expected by the checkpoint's step: ``rollout_complete`` in its ``meta.json``,
   recorded at publication): the analyzer supersedes what the earlier session logged after the
   checkpoint only rollout by rollout, so training on from the middle of a rollout would count
   the samples of its steps trained before the kill twice. Newer checkpoints skipped, and why,
   are listed in ``run_resumed``'s ``skipped``. No checkpoint: the run goes on from step 0.
2. rank 0 opens a new driver incarnation and logs ``run_resumed`` (in place of ``run_started``;
   the ``evidence_profile`` is not logged again: the run keeps the recorded one, and a different
   profile is an error), the cells ``pending`` -> ``alive`` and a ``reconfigure`` to a membership
   epoch after every earlier one; every rank opens the next free incarnation of its trainer log.
   The earlier session's logs stay as they are: a log the kill left without ``log_closed`` ended
   with its session, and its evidence of the steps after the checkpoint (the partial step of
   the killed rank included) is superseded and logged again by this session.
3. every rank calls ``run.restore(model, optimizer)``: the checkpoint's parameters and optimizer
   state are loaded into them (every rank reads it from the run directory, which every rank
   sees already: it writes its event log there), and it returns the ``ResumePoint`` to train
   from: ``step`` and ``rollout`` (the step after the checkpoint's, the rollout after the one it
   ends; ``0, 0`` without one).

What is restored is what the checkpoint stores: the tensors of ``model.named_parameters()`` and
the tensor entries of ``optimizer.state`` (``named_state``). Hyper-parameters, learning-rate
schedules, RNG and data order are the script's: it derives them from the step and rollout.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.evidence.profile import EvidenceProfile

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ResumePoint:
    """Where this session trains from: ``step`` and ``rollout`` are the first ones to train;
    ``checkpoint`` the checkpoint directory's name (None: from the start) holding the state after
    ``checkpoint_step`` and the end of ``checkpoint_rollout`` (-1 without one); ``skipped``:
    newer checkpoints not taken, each with why; ``resumed``: an earlier session existed."""

    step: int = 0
    rollout: int = 0
    checkpoint: str | None = None
    checkpoint_step: int = -1
    checkpoint_rollout: int = -1
    skipped: tuple[str, ...] = field(default_factory=tuple)
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "skipped": list(self.skipped)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ResumePoint:
        return cls(**{**doc, "skipped": tuple(doc["skipped"])})


def earlier_session(run_dir: Path) -> bool:
    """Whether ``run_dir/events`` holds a driver log that started the run (``run_started``)."""
    from ftkit.events.driver_log import driver_events

    return next(driver_events(run_dir / "events", "run_started"), None) is not None


def check_profile(run_dir: Path, profile: EvidenceProfile) -> None:
    """``ValueError`` unless ``profile`` promises what ``run_dir/run.json`` records: a resumed
    session keeps the run's profile (the analyzer reads only the first one)."""
    from ftkit.evidence.record import RunRecord

    try:
        recorded = RunRecord.read(run_dir).evidence_profile
    except (OSError, ValueError, RecursionError):
        recorded = None
    if recorded is not None and recorded != profile.kinds():
        raise ValueError(
            f"{run_dir}/run.json records the evidence profile {recorded}, this session promises "
            f"{profile.kinds()}: resume with the run's profile"
        )


def scheme_mismatch(run_dir: Path) -> str | None:
    """Why a session of this ftkit cannot go on with ``run_dir``: its ``run.json`` records another
    fingerprint scheme (a run begun before ``ftkit-fp2``), so the sessions' fingerprints could
    not be checked against each other; ``None`` when they agree or nothing is recorded."""
    from ftkit.evidence.record import RunRecord
    from ftkit.tensors.fingerprint import SCHEME

    try:
        recorded = RunRecord.read(run_dir).fingerprint_scheme
    except (OSError, ValueError, RecursionError):
        return None
    if recorded == SCHEME:
        return None
    return (
        f"{run_dir} fingerprints its state as {recorded}, this ftkit as {SCHEME}: the resumed sessions "
        "could not be checked against the earlier ones"
    )


def plan(run_dir: Path, profile: EvidenceProfile) -> ResumePoint:
    """Rank 0's choice of the checkpoint to resume from (steps 1 of the module docstring).
    ``ValueError`` when the checkpoints cannot be reconciled or verified."""
    from ftkit.checkpoint.layout import META
    from ftkit.checkpoint.selection import newest_trusted

    skipped: list[str] = []
    witness = profile.witness

    def ends_rollout(path: Path) -> str | None:
        meta = json.loads((path / META).read_bytes())
        if witness and meta.get("rollout_complete") is not True:
            return f"it does not end rollout {meta.get('rollout')}: the rollout would be trained twice in part"
        return None

    checkpoints = run_dir / "checkpoints"
    newest = None
    if checkpoints.is_dir():
        newest = newest_trusted(checkpoints, on_warning=skipped.append, accept=ends_rollout)
    if newest is None:
        return ResumePoint(skipped=tuple(skipped), resumed=True)
    meta = json.loads((newest / META).read_bytes())
    step, rollout = int(meta["step"]), int(meta["rollout"])
    ended = rollout if meta.get("rollout_complete") is True else rollout - 1
    return ResumePoint(step + 1, ended + 1, newest.name, step, ended, tuple(skipped), True)


def load_state(checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load ``checkpoint``'s parameters into ``model`` (wrappers removed) and its optimizer
    tensors into ``optimizer`` (``load_state_dict``, so they take each parameter's device and
    dtype). Every parameter must be in the checkpoint (``ValueError`` else); an optimizer state
    key holds no ``.``. The checkpoint was verified by rank 0 (``plan``): only read here."""
    import torch

    from ftkit.checkpoint.layout import MODEL, OPTIMIZER
    from ftkit.checkpoint.restore import read_groups
    from ftkit.evidence.fingerprint import unwrap

    groups = read_groups(checkpoint)
    stored, optim = groups.get(MODEL, {}), groups.get(OPTIMIZER, {})
    named = list(unwrap(model).named_parameters())
    missing = [n for n, _ in named if n not in stored]
    if missing:
        raise ValueError(f"{checkpoint} holds no parameter {missing[0]!r} (of {len(missing)} missing)")
    with torch.no_grad():
        for name, p in named:
            p.copy_(stored[name])
    if optimizer is None:
        return
    names = {id(p): n for n, p in named}
    sd = optimizer.state_dict()
    index = 0
    state: dict[int, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            owner = names.get(id(p))
            if owner is not None:
                n = len(owner) + 1
                entries = {k[n:]: v for k, v in optim.items() if k.startswith(f"{owner}.") and "." not in k[n:]}
                if entries:
                    state[index] = entries
            index += 1
    sd["state"] = state
    optimizer.load_state_dict(sd)
