"""The run directory of ``ftkit train``: checking, creating and describing it (``run.json``).

``check_run_dir`` has no lasting side effects and runs before anything is started (Ray
included). It refuses, with a ``UsageError`` (exit 2):

- an ``--out`` that is a symbolic link, or exists and is not a directory;
- an ``--out`` that cannot be created or written: a name longer than the file system allows,
  a place below ``/proc`` or on a read-only file system, a parent that is not writable
  (proved by creating and removing a probe directory where the run will be written);
- an existing, non-empty ``--out`` without ``overwrite``;
- with ``overwrite``, any directory that is not recognisably an ftkit run: its ``run.json``
  must be a JSON object written by ftkit (``schema`` ``ftkit.run/...``, ``ftkit_version``,
  ``config``), and it must hold nothing but what ftkit writes (``RUN_AREAS``, each with the
  file kinds ftkit puts there, and ftkit's hidden temporary names). Anything else -- a
  stray file, a symlink, an unknown kind of file -- means it is not replaced, and nothing
  is deleted.

``make_run_dir`` then creates the directory fresh, replacing an old run only when allowed;
``write_run_json`` records what reproduces the run. The rest of the layout (``events/``,
``rollouts/``, ``dumps/``, ``final/``, ``checkpoints/``, ``logs/``) is written by the parts that own it;
see docs/train.md.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ftkit.errors import UsageError
from ftkit.evidence.record import RUN_JSON, NotARunRecord, RunRecord, recorded_name

if TYPE_CHECKING:
    from ftkit.tasks.protocols import RlTask
    from ftkit.train.config import TrainConfig

STATUS_JSON = "status.json"  # ftkit.train.control.run_end.STATUS_FILE (written at the end of every run)
# What ftkit writes below a run directory: area -> file name endings found there.
RUN_AREAS: dict[str, tuple[str, ...]] = {
    "events": (".jsonl", ".jsonl.gz"),
    "rollouts": (".safetensors",),
    "final": (".safetensors",),
    "dumps": (".safetensors", ".json"),
    "checkpoints": (".safetensors", ".json"),
    "logs": (".log",),  # what vLLM engines print (--engine vllm: vllm-engine-<e>.log)
}
# What the trackers of --report-to write (ftkit.integrations.trackers): their own formats, not policed.
TRACKER_AREAS = frozenset({"tensorboard", "wandb", "mlruns"})
TRACKER_IDS = "tracking.json"  # the wandb / mlflow run ids a resumed run continues
_LINKS = {("checkpoints", "latest")}  # the only symlinks ftkit makes (checkpoints/latest)
_TEMP_MARKS = (".tmp-", ".tmp", ".deleting-")  # hidden names of ftkit's temporaries
_HINT = "choose another --out"


def check_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that cannot hold a new run (see the module doc). No lasting effects."""
    out = Path(out)
    _check_name(out)
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link; ftkit does not write through links", hint=_HINT)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out} exists and is not a directory", hint=_HINT)
        if any(out.iterdir()):
            if not overwrite:
                raise UsageError(
                    f"run directory {out} already exists",
                    hint="pass --overwrite to replace it, or choose another --out",
                )
            reason = not_a_run(out)
            if reason:
                raise UsageError(f"{out} is not an ftkit run directory ({reason}); not replacing it", hint=_HINT)
            _probe(out.parent if str(out.parent) else Path("."), out)
        _probe(out, out)
    else:
        _probe(_existing_ancestor(out), out)


def not_a_run(path: Path) -> str | None:
    """Why ``path`` is not recognisably a run directory written by ftkit, or None if it is."""
    try:
        RunRecord.read(path)
    except FileNotFoundError:
        return f"no {RUN_JSON}"
    except NotARunRecord as exc:
        return str(exc)
    except (OSError, ValueError, RecursionError) as exc:
        return f"{RUN_JSON} is unreadable: {type(exc).__name__}"
    for entry in path.iterdir():
        if entry.name in (RUN_JSON, STATUS_JSON, TRACKER_IDS) or _is_temp(entry.name):
            continue
        if entry.name in TRACKER_AREAS and entry.is_dir() and not entry.is_symlink():
            continue
        if entry.name not in RUN_AREAS or entry.is_symlink() or not entry.is_dir():
            return f"it holds {entry.name!r}, which ftkit does not write there"
        stray = _stray(entry, entry.name)
        if stray is not None:
            return f"it holds {stray.relative_to(path)}, which ftkit does not write"
    return None


def _stray(area_dir: Path, area: str) -> Path | None:
    """The first entry below ``area_dir`` that ftkit would not have written, if any."""
    endings = RUN_AREAS[area]
    for root, dirs, files in os.walk(area_dir):
        here = Path(root)
        for name in dirs + files:
            entry = here / name
            if _is_temp(name):
                continue
            if entry.is_symlink():
                if here == area_dir and (area, name) in _LINKS:
                    continue
                return entry
            if name in files and not name.endswith(endings):
                return entry
    return None


def _is_temp(name: str) -> bool:
    return name.startswith(".") and any(mark in name for mark in _TEMP_MARKS)


def _check_name(out: Path) -> None:
    absolute = Path(os.path.abspath(out))
    base = _existing_ancestor(absolute)
    try:
        name_max = os.pathconf(base, "PC_NAME_MAX")
        path_max = os.pathconf(base, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in absolute.parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(f"--out {out}: a path component is longer than {name_max} bytes", hint=_HINT)
    if len(os.fsencode(str(absolute))) >= path_max:
        raise UsageError(f"--out {out}: the path is longer than {path_max} bytes", hint=_HINT)


def _existing_ancestor(path: Path) -> Path:
    current = Path(os.path.abspath(path))
    while not _exists(current) and current != current.parent:
        current = current.parent
    return current


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG and the like: as good as absent
        return False


def _probe(where: Path, out: Path) -> None:
    """Create and remove a hidden directory in ``where``: proves the run can be written there."""
    if not where.is_dir():
        raise UsageError(f"cannot create --out {out}: {where} is not a directory", hint=_HINT)
    try:
        probe = tempfile.mkdtemp(prefix=".ftkit-probe.tmp-", dir=where)
        os.rmdir(probe)
    except OSError as exc:
        why = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}.get(
            exc.errno or 0, exc.strerror or str(exc)
        )
        raise UsageError(f"cannot create --out {out}: {where} is not writable ({why})", hint=_HINT) from None


def make_run_dir(out: Path, overwrite: bool) -> Path:
    """Create ``out`` fresh (after ``check_run_dir``), replacing an old run when allowed."""
    out = Path(out)
    check_run_dir(out, overwrite)
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {out}: {exc.strerror or exc}", hint=_HINT) from None
    return out


def run_name(run_dir: Path | str) -> str:
    """The name a run's events and checkpoints carry: the one its ``run.json`` records, else the
    directory's own name (a new run). A run directory that was copied or renamed keeps its name
    across ``--resume``, so its old and new events stay one run's log."""
    return recorded_name(run_dir) or Path(run_dir).resolve().name


def write_run_json(run_dir: Path, cfg: TrainConfig, device: str, task: RlTask) -> None:
    """``run.json``: what reproduces the run (config, version, layout, seed). A resumed run
    keeps the name its ``run.json`` already records (``run_name``)."""
    RunRecord(
        run=run_name(run_dir),
        seed=cfg.rng.seed,
        config=cfg.model_dump(mode="json"),
        layout={
            "cells": cfg.cluster.cells,
            "tp": cfg.layout.tp,
            "pp": cfg.layout.pp,
            "engines": cfg.engine.count,
            "device": device,
            "micro_shards": cfg.batch.micro_shards,
            "samples_per_step": cfg.batch.step_samples,
            "samples_per_micro_shard": cfg.batch.shard_samples,
        },
        task={
            "name": task.name,
            "vocab_size": task.vocab_size,
            "prompt_len": task.prompt_len,
            "response_len": task.response_len,
            "reward": cfg.task.reward,
        },
    ).write(run_dir)
