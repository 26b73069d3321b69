"""Retention: which published checkpoints are kept, and ``retention.json`` that records it.

A pure policy over records: the ``keep_last`` newest checkpoints, plus the ``keep_best`` with
the highest metric among the *eligible* ones (finite metric, untainted guard interval: NaN,
+/-inf and tainted intervals are never best). The newest checkpoint is always kept (``latest``
points to it). Ties in the metric go to the newer step. The records file is only ever changed
through the journal (``ftkit.checkpoint.journal``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftkit.checkpoint.layout import RETENTION, RETENTION_SCHEMA
from ftkit.tensors.untrusted import load_json, read_regular


@dataclass(frozen=True)
class RetentionPolicy:
    """``--keep-last`` (>= 1), ``--keep-best`` (>= 0) and the name of the ranking metric."""

    keep_last: int = 2
    keep_best: int = 1
    best_metric: str | None = "reward"

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (latest is always kept), not {self.keep_last}")
        if self.keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, not {self.keep_best}")

    def to_json(self) -> dict[str, Any]:
        return {"keep_last": self.keep_last, "keep_best": self.keep_best, "best_metric": self.best_metric}


@dataclass(frozen=True)
class Record:
    """One published checkpoint as retention sees it."""

    name: str
    step: int
    metric: float | None
    tainted: bool
    manifest_sha256: str

    @property
    def eligible(self) -> bool:
        return self.metric is not None and math.isfinite(self.metric) and not self.tainted

    def to_json(self, roles: list[str]) -> dict[str, Any]:
        return {
            "name": self.name,
            "step": self.step,
            "metric": self.metric,
            "tainted": self.tainted,
            "manifest_sha256": self.manifest_sha256,
            "roles": roles,
        }


@dataclass(frozen=True)
class Retained:
    """The outcome of the policy: kept records (oldest first), their roles, dropped names, latest."""

    kept: list[Record]
    roles: dict[str, list[str]]
    dropped: list[str]
    latest: str | None

    def to_json(self, policy: RetentionPolicy) -> dict[str, Any]:
        """The ``retention.json`` document."""
        return {
            "schema": RETENTION_SCHEMA,
            "policy": policy.to_json(),
            "latest": self.latest,
            "records": [r.to_json(self.roles[r.name]) for r in self.kept],
        }


def select(records: Iterable[Record], policy: RetentionPolicy) -> Retained:
    """Apply ``policy`` to ``records`` (the kept ones plus the new one)."""
    items = sorted({r.name: r for r in records}.values(), key=lambda r: r.step)
    last = {r.name for r in items[-policy.keep_last :]} if items else set()
    ranked = sorted((r for r in items if r.eligible), key=lambda r: (r.metric, r.step), reverse=True)
    best = {r.name for r in ranked[: policy.keep_best]}
    roles = {r.name: [role for role, names in (("last", last), ("best", best)) if r.name in names] for r in items}
    kept = [r for r in items if roles[r.name]]
    return Retained(
        kept=kept,
        roles={r.name: roles[r.name] for r in kept},
        dropped=[r.name for r in items if not roles[r.name]],
        latest=items[-1].name if items else None,
    )


def records_from_json(doc: Any) -> tuple[list[Record], str | None]:
    """``(records, latest)`` of a ``retention.json`` document; ``ValueError`` when malformed."""
    if not isinstance(doc, dict) or doc.get("schema") != RETENTION_SCHEMA:
        raise ValueError(f"not a {RETENTION_SCHEMA} document")
    try:
        records = [
            Record(
                name=str(r["name"]),
                step=int(r["step"]),
                metric=None if r["metric"] is None else float(r["metric"]),
                tainted=bool(r["tainted"]),
                manifest_sha256=str(r["manifest_sha256"]),
            )
            for r in doc["records"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed record: {exc}") from exc
    latest = doc.get("latest")
    if latest is not None and not isinstance(latest, str):
        raise ValueError("latest is not a string")
    return records, latest


def load_records(checkpoints: Path) -> tuple[list[Record], str | None]:
    """The records and latest of ``checkpoints/retention.json``; none when the file is absent;
    ``ValueError`` when it is malformed or not a regular file (``read_regular``)."""
    path = checkpoints / RETENTION
    if not os.path.lexists(path):
        return [], None
    return records_from_json(load_json(read_regular(path)))
