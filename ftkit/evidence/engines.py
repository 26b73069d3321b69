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
from typing import TYPE_CHECKING, Union

import ftkit.evidence.emit as emit
from ftkit.evidence.record import recorded_name

if TYPE_CHECKING:
    import torch

#: What a weight sync carries: a module (its parameters) or ``{name: tensor}`` under the trainer's names.
Weights = Union["torch.nn.Module", Mapping[str, "torch.Tensor"]]


def weights_fingerprint(weights: Weights) -> tuple[str, dict[str, str]]:
    """``(total, {name: fingerprint})`` of a module's parameters (wrappers removed) or of a
    ``{name: tensor}`` mapping (an engine's weights under the trainer's names)."""
    from ftkit.evidence.fingerprint import unwrap
    from ftkit.tensors.fingerprint import combine, fingerprints

    named = weights.items() if isinstance(weights, Mapping) else unwrap(weights).named_parameters()
    params = fingerprints(dict(named))
    return combine(params), params


class EngineLog:
    """The event log of one inference engine process (``events/engine-r<engine>-i<n>.jsonl``)."""

    def __init__(self, run_dir: str | os.PathLike[str], engine: int, run: str | None = None) -> None:
        from ftkit.events.writer import EventWriter

        self.engine = engine
        name = run or recorded_name(run_dir) or Path(run_dir).resolve().name
        self.log = EventWriter(Path(run_dir) / "events", name, "engine", rank=engine)

    def loaded(self, rollout: int, version: int, weights: Weights) -> str:
        """Log ``engine_weights`` for the ``version`` this engine now holds; returns its total."""
        total, params = weights_fingerprint(weights)
        emit.engine_weights(self.log, rollout=rollout, version=version, engine=self.engine, total=total, params=params)
        self.log.sync()
        return total

    def close(self) -> None:
        """Close the log (``log_closed``)."""
        self.log.close()
