"""The run directory of ``ftkit train``: checking, creating and describing it (``run.json``).

``check_run_dir`` has no side effects and runs before anything is started;
``make_run_dir`` then creates the directory fresh, replacing an old run only with
``overwrite`` and only if it holds a ``run.json`` (ftkit never deletes a directory it did
not write); ``write_run_json`` records what reproduces the run. The rest of the layout
(``events/``, ``rollouts/``, ``dumps/``, ``final/``) is written by the parts that own it; see
docs/train.md.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ftkit import __version__
from ftkit.errors import UsageError

RUN_SCHEMA = "ftkit.run/1"


def check_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse ``out`` if it exists and is not empty, unless ``overwrite`` and it holds a
    ``run.json`` (ftkit never deletes a directory it did not write). No side effects."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise UsageError(
                f"run directory {out} already exists", hint="pass --overwrite to replace it, or choose another --out"
            )
        if not (out / "run.json").is_file():
            raise UsageError(
                f"{out} exists and is not an ftkit run directory (no run.json); not replacing it",
                hint="choose another --out",
            )


def make_run_dir(out: Path, overwrite: bool) -> Path:
    """Create ``out`` fresh (after ``check_run_dir``), replacing an old run when allowed."""
    out = Path(out)
    check_run_dir(out, overwrite)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_run_json(run_dir: Path, cfg: Any, device: str, task: Any) -> None:
    """``run.json``: what reproduces the run (config, version, layout, seed)."""
    from ftkit.tensors.st import write_bytes_atomic

    doc = {
        "schema": RUN_SCHEMA,
        "run": run_dir.name,
        "ftkit_version": __version__,
        "created": time.time(),
        "seed": cfg.seed,
        "config": cfg.model_dump(mode="json"),
        "layout": {
            "cells": cfg.cells,
            "tp": cfg.tp,
            "pp": cfg.pp,
            "engines": cfg.engines,
            "device": device,
            "micro_shards": cfg.micro_shards,
            "samples_per_step": cfg.step_samples,
            "samples_per_micro_shard": cfg.shard_samples,
        },
        "task": {
            "name": task.name,
            "vocab_size": task.vocab_size,
            "prompt_len": task.prompt_len,
            "response_len": task.response_len,
            "reward": cfg.reward,
        },
    }
    write_bytes_atomic(run_dir / "run.json", (json.dumps(doc, indent=2) + "\n").encode())
