"""The run directory of an ``EvidenceRun``: its ``run.json`` (the same ``ftkit.run/1`` schema as
``ftkit train``'s, with the ``producer`` and its ``evidence_profile``), and the values of its events."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ftkit import __version__
from ftkit.evidence.profile import EvidenceProfile

RUN_SCHEMA = "ftkit.run/1"


def scalar(value: Any) -> float | None:
    """A metric value as a float (tensors and numpy scalars too); ``None`` stays ``None``."""
    return None if value is None else float(value.item() if hasattr(value, "item") else value)


def write_run_json(
    run_dir: Path, name: str, config: dict[str, Any], layout: dict[str, int], profile: EvidenceProfile, producer: str
) -> str:
    """Write ``run.json`` unless the run directory has one; returns the run's name (the recorded one)."""
    from ftkit.tensors.st import write_bytes_atomic

    path = run_dir / "run.json"
    try:
        recorded = json.loads(path.read_bytes()).get("run")
        if isinstance(recorded, str) and recorded:
            return recorded
    except (OSError, ValueError, AttributeError):
        pass
    doc = {
        "schema": RUN_SCHEMA,
        "run": name,
        "ftkit_version": __version__,
        "created": time.time(),
        "producer": producer,
        "config": config,
        "layout": layout,
        "evidence_profile": profile.kinds(),
    }
    write_bytes_atomic(path, (json.dumps(doc, indent=2) + "\n").encode())
    return name
