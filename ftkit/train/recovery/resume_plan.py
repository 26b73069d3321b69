"""A resumed session of ``ftkit train --resume RUN_DIR``: its config, and where it starts.

``resume_config(run_dir, given)`` is the config: ``run.json``'s, with the options given now
on top (plain data: the command plans it once, ``ftkit.train.plan.run_plan.build_plan``, which checks
the recorded model digest); an option outside ``FREE_FIELDS`` that differs from the recorded value, or fewer
rollouts, is exit 2 (docs/checkpoints.md, "Resume"). ``plan_resume(run_dir, cfg, warn)`` runs
before any cell starts: ``check_resume_dir``, ``reconcile`` and the
newest checkpoint that ``verify-checkpoint RUN`` accepts and that was written with this run's
result-determining config (``ftkit.checkpoint.selection.newest_trusted``), the records
newer than it retired (``retire_newer``), and what the new session must not collide with in
the event log: the last membership epoch (``last_epoch``) and the first free trainer
incarnation (``next_incarnation``). The checkpoint is then loaded into the started cells by
``ftkit.train.recovery.resume.restore_cells``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.errors import ConfigError
from ftkit.evidence.record import last_epoch
from ftkit.train.config.places import FREE_FIELDS, LAYOUT_FIELDS, PRECISION_FIELDS
from ftkit.train.recovery.resume import CheckpointState, read_checkpoint

if TYPE_CHECKING:
    from ftkit.train.config import TrainConfig


@dataclass
class ResumePlan:
    """What a resumed session starts from: the checkpoint (None: the seed's initial state),
    the newer checkpoints skipped and why, the last membership epoch and the first free
    trainer incarnation of the earlier sessions."""

    checkpoint: CheckpointState | None
    skipped: list[str]
    last_epoch: int
    incarnation: int
    layout_change: dict[str, list[int]] = field(default_factory=dict)  # {"tp": [before, now]}
    precision_change: list[str] = field(default_factory=list)  # [before, now]

    def fields(self) -> dict[str, Any]:
        """The ``run_resumed`` fields beyond ``run_started``'s (``layout_change`` only when
        the session changed the layout, ``--allow-layout-change``; ``precision_change`` only
        when it changed the precision, ``--allow-precision-change``)."""
        ck = self.checkpoint
        out: dict[str, Any] = {
            "checkpoint": None if ck is None else ck.path.name,
            "checkpoint_step": -1 if ck is None else ck.step,
            "checkpoint_rollout": -1 if ck is None else ck.rollout,
            "skipped": list(self.skipped),
        }
        if self.layout_change:
            out["layout_change"] = dict(self.layout_change)
        if self.precision_change:
            out["precision_change"] = list(self.precision_change)
        return out


def check_resume_dir(run_dir: Path) -> None:
    """Refuse (``UsageError``, exit 2) a ``--resume`` path that is not an ftkit run directory."""
    from ftkit.errors import UsageError
    from ftkit.train.control.rundir import not_a_run

    run_dir = Path(run_dir)
    if run_dir.is_symlink():  # a run's files, lock and checkpoints are reached by one path only
        raise UsageError(
            f"--resume {run_dir} is a symbolic link (to {os.readlink(run_dir)}): ftkit resumes a run "
            "only through its own directory, never through a link",
            hint=f"pass the directory itself: --resume {run_dir.resolve()}",
        )
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run directory", hint="pass the --out of an earlier ftkit train")
    reason = not_a_run(run_dir)
    if reason:
        raise UsageError(
            f"--resume {run_dir} is not an ftkit run directory ({reason})",
            hint="pass the --out of an earlier ftkit train",
        )


def plan_resume(run_dir: Path, cfg: TrainConfig, warn: Callable[[str], None]) -> ResumePlan:
    """Reconcile ``run_dir/checkpoints`` through its journal and read the newest checkpoint
    that verifies (each newer one skipped is passed to ``warn`` and kept in the plan); the
    records newer than it are retired (``retire_newer``).
    ``ConfigError`` (exit 2) for a journal or retention record that cannot be read, or a run
    without its event log (a checkpoint of another run's configuration is skipped)."""
    from ftkit.checkpoint.selection import newest_trusted

    skipped: list[str] = []

    def note(message: str) -> None:
        skipped.append(message)
        warn(message)

    state = None
    checkpoints = Path(run_dir) / "checkpoints"
    change = layout_change(run_dir, cfg)  # asked for with --allow-layout-change (resume_config)
    precision = precision_change(run_dir, cfg)  # asked for with --allow-precision-change
    free = FREE_FIELDS | (LAYOUT_FIELDS if change else frozenset()) | (PRECISION_FIELDS if precision else frozenset())
    if checkpoints.is_dir():
        try:
            newest = newest_trusted(checkpoints, on_warning=note, accept=lambda path: _other_run(path, cfg, free))
            if newest is None and any(checkpoints.glob("step_*")):
                note("no checkpoint verifies: training again from the seed's initial state")
            if newest is not None:
                state = read_checkpoint(newest, verified=True)  # newest_trusted hashed it
            for name in retire_newer(checkpoints, -1 if state is None else state.step, cfg):
                note(f"retired {name}: newer than the checkpoint resumed from, its steps are trained again")
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot reconcile {checkpoints}: {exc}",
                hint=f"run 'ftkit verify-checkpoint {run_dir}' to see what is wrong",
            ) from None
    events = Path(run_dir) / "events"
    if state is None and not any(checkpoints.glob("step_*")):
        from ftkit.checkpoint.selection import published_in_log

        gone = published_in_log(events)
        if gone:
            note(f"{checkpoints} holds none of the {len(gone)} checkpoint(s) the log records as published "
                 f"(newest {gone[-1]}): training again from the seed's initial state")  # fmt: skip
    if change:
        shown = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in change.items())
        warn(
            f"layout change on resume ({shown}, --allow-layout-change): from here on the run is not bitwise "
            "the uninterrupted run; compare-dumps against it will find differences"
        )
    if precision:
        warn(
            f"precision change on resume ({precision[0]} -> {precision[1]}, --allow-precision-change): from here "
            "on the run is not bitwise the uninterrupted run; compare-dumps against it will find differences"
        )
    return ResumePlan(state, skipped, last_epoch(events), next_incarnation(events), change, precision)


def layout_change(run_dir: Path, cfg: TrainConfig) -> dict[str, list[int]]:
    """``{field: [recorded, now]}`` for the ``LAYOUT_FIELDS`` where ``cfg`` differs from
    ``run_dir/run.json`` (read before this session rewrites it)."""
    from ftkit.train.config import load_config

    before = load_config(recorded_config(run_dir)).model_dump(mode="json")
    now = cfg.model_dump(mode="json")
    return {k: [before[k], now[k]] for k in sorted(LAYOUT_FIELDS) if before[k] != now[k]}


def precision_change(run_dir: Path, cfg: TrainConfig) -> list[str]:
    """``[recorded, now]`` when ``cfg``'s precision differs from ``run_dir/run.json``'s, else
    ``[]`` (``recorded_config``: a run before the field was recorded trained in fp32)."""
    before, now = str(recorded_config(run_dir)["precision"]), cfg.precision.precision
    return [before, now] if before != now else []


def retire_newer(checkpoints: Path, step: int, cfg: TrainConfig) -> list[str]:
    """Drop every recorded checkpoint newer than ``step`` (none of them verified: the resumed
    session publishes those steps again) in one journal transaction (``journal.begin`` /
    ``apply``: a crash in between is rolled forward by the next ``reconcile``); returns their
    names. Retention is re-applied with ``cfg``'s policy over the records that stay."""
    import json

    from ftkit.checkpoint import journal
    from ftkit.checkpoint.layout import RETENTION
    from ftkit.checkpoint.retention import RetentionPolicy, load_records, select

    records, _ = load_records(checkpoints)
    newer = [r.name for r in records if r.step > step]
    if not newer:
        return []
    policy = RetentionPolicy(cfg.checkpoints.keep_last, cfg.checkpoints.keep_best, cfg.eval.best_metric)
    retained = select([r for r in records if r.step <= step], policy)
    before = json.loads((checkpoints / RETENTION).read_bytes())
    doc = journal.begin(checkpoints, None, before, retained.to_json(policy), newer + retained.dropped)
    journal.apply(checkpoints, doc)
    return newer


def check_scheme(run_dir: Path) -> None:
    """``ConfigError`` unless ``run_dir`` computes its fingerprints as this version does: the
    sessions of one run must log comparable fingerprints (a run from before ``ftkit-fp2``)."""
    from ftkit.evidence.resume import scheme_mismatch

    mismatch = scheme_mismatch(run_dir)
    if mismatch is not None:
        raise ConfigError(
            f"--resume: {mismatch}",
            hint="finish the run with the ftkit version that started it, or start a new run with --out",
        )


def recorded_config(run_dir: Path) -> dict[str, Any]:
    """The ``config`` of ``run_dir/run.json`` as written (the flat record; older runs wrote
    the same form). A run whose record has no ``precision`` (before ftkit recorded it) trained
    in fp32: it reads as ``fp32``, never as ``auto`` (which a GPU would resolve to bf16)."""
    import json

    config = dict(json.loads((Path(run_dir) / "run.json").read_text())["config"])
    config.setdefault("precision", "fp32")
    return config


def resume_config(
    run_dir: Path, given: dict[str, Any], allow_layout_change: bool = False, allow_precision_change: bool = False
) -> TrainConfig:
    """The ``TrainConfig`` of resuming ``run_dir``: its ``run.json`` config with the values
    ``given`` (options and ``--config`` values the user set) on top. A given value of a field
    outside ``FREE_FIELDS`` that differs from the recorded one, or fewer ``rollouts`` than
    recorded, is a ``ConfigError`` (exit 2): the resumed run would not be the same run. The
    TP x PP layout (``LAYOUT_FIELDS``) changes bits too: it may differ only with
    ``allow_layout_change`` (``plan_resume`` then logs the change), the precision
    (``PRECISION_FIELDS``) only with ``allow_precision_change``. Injections and chaos of
    the earlier session are not carried over."""
    from ftkit.model.spec import is_preset
    from ftkit.train.config import load_config

    check_resume_dir(run_dir)
    check_scheme(run_dir)
    recorded = recorded_config(run_dir)
    if "model" in given and not is_preset(str(given["model"])):  # a path, recorded absolute
        given = {**given, "model": str(Path(given["model"]).absolute())}
    base = load_config(recorded).model_dump(mode="json")
    asked = load_config({**recorded, **given}).model_dump(mode="json")
    changed = sorted(k for k in given if k not in FREE_FIELDS and asked[k] != base[k])
    layout = [k for k in changed if k in LAYOUT_FIELDS]
    if layout and not allow_layout_change:
        k = layout[0]
        raise ConfigError(
            f"--resume: {k} is {base[k]!r} in {run_dir}/run.json, not {asked[k]!r}: a layout change makes the "
            "rest of the run differ in its bits from the uninterrupted run",
            hint="drop the option to resume in the recorded layout, or add --allow-layout-change to change it",
        )
    moved = [k for k in changed if k in PRECISION_FIELDS]
    if moved and not allow_precision_change:
        k = moved[0]
        raise ConfigError(
            f"--resume: {k} is {base[k]!r} in {run_dir}/run.json, not {asked[k]!r}: a precision change makes the "
            "rest of the run differ in its bits from the uninterrupted run",
            hint="drop the option to resume in the recorded precision, or add --allow-precision-change to change it",
        )
    changed = [k for k in changed if k not in LAYOUT_FIELDS | PRECISION_FIELDS]
    if changed:
        k = changed[0]
        raise ConfigError(
            f"--resume: {k} is {base[k]!r} in {run_dir}/run.json, not {asked[k]!r}: that would be another run",
            hint="drop the option to resume the run as recorded, or start a new run with --out",
        )
    if asked["rollouts"] < base["rollouts"]:
        raise ConfigError(
            f"--resume: rollouts {asked['rollouts']} is fewer than the {base['rollouts']} recorded",
            hint="--rollouts may only be raised when resuming",
        )
    values = {**recorded, "inject": [], "chaos": None, **given, "out": str(run_dir), "overwrite": False}
    return load_config(values)


def _other_run(checkpoint: Path, cfg: TrainConfig, free: frozenset[str]) -> str | None:
    """Why ``checkpoint`` (verified) is not this run's: a result-determining field (outside
    ``free``: ``FREE_FIELDS``, plus ``LAYOUT_FIELDS`` when this resume changes the layout) of
    the config in its ``meta.json`` differs from ``cfg``'s; None when it is. The checkpoint
    format is layout-free, so a checkpoint of the old layout loads into the new one."""
    import json

    from ftkit.checkpoint.layout import META

    meta = json.loads((checkpoint / META).read_text())
    config = meta.get("config", {}) if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        return f"its {META} holds no config object"
    recorded = {"seed": meta.get("seed"), "model": meta.get("model"), **config}
    ours = cfg.model_dump(mode="json")
    for key in sorted(set(recorded) & set(ours) - free):
        if recorded[key] is not None and recorded[key] != ours[key]:
            return f"written with {key} {recorded[key]!r}, this run has {ours[key]!r}"
    return None


_TRAINER = re.compile(r"trainer-c\d+-r\d+-i(\d+)\.jsonl(\.gz)?$")


def next_incarnation(events_dir: Path) -> int:
    """One more than the highest trainer incarnation with an event file in ``events_dir``."""
    found = [int(m.group(1)) for p in Path(events_dir).glob("trainer-*") if (m := _TRAINER.match(p.name))]
    return max(found, default=-1) + 1
