"""Weight syncs to inference engines (invariant I7): what the trainer sent, what each engine holds.

The trainer's rank 0 logs ``weights_sent`` (``EvidenceRun.weights_sent``) for every version it
pushes; each engine process opens an ``EngineLog`` and, after loading a version, logs
``engine_weights`` with the fingerprint of what it holds, mapped back to the trainer's names and
dtypes. ``analyze-events`` (FT102) then requires every engine (``EvidenceRun(engines=N)``) to
report every version sent, bit for bit equal. Both sides fingerprint with ``weights_fingerprint``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def weights_fingerprint(weights: Any) -> tuple[str, dict[str, str]]:
    """``(total, {name: fingerprint})`` of a module's parameters (wrappers removed) or of a
    ``{name: tensor}`` mapping (an engine's weights under the trainer's names)."""
    from ftkit.evidence.fingerprint import unwrap
    from ftkit.tensors.fingerprint import combine, fingerprint

    named = weights.items() if isinstance(weights, Mapping) else unwrap(weights).named_parameters()
    params = {name: fingerprint(t) for name, t in named}
    return combine(params), params


class EngineLog:
    """The event log of one inference engine process (``events/engine-r<engine>-i<n>.jsonl``)."""

    def __init__(self, run_dir: str | os.PathLike[str], engine: int, run: str | None = None) -> None:
        from ftkit.events.writer import EventWriter

        self.engine = engine
        name = run or _recorded_name(Path(run_dir))
        self.log = EventWriter(Path(run_dir) / "events", name, "engine", rank=engine)

    def loaded(self, rollout: int, version: int, weights: Any) -> str:
        """Log ``engine_weights`` for the ``version`` this engine now holds; returns its total."""
        total, params = weights_fingerprint(weights)
        self.log.emit(
            "engine_weights", rollout=rollout, version=version, engine=self.engine, total=total, params=params
        )
        self.log.sync()
        return total

    def close(self) -> None:
        """Close the log (``log_closed``)."""
        self.log.close()


def _recorded_name(run_dir: Path) -> str:
    import json

    try:
        name = json.loads((run_dir / "run.json").read_bytes()).get("run")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else run_dir.resolve().name
