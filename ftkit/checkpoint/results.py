"""What the verifier produces: one ``CheckpointResult`` per checkpoint as it is loaded (read by the
cross-checkpoint checks of ``ftkit.checkpoint.bookkeeping``), a ``FileRow`` per listed file and
the ``VerifyResult`` of a whole ``verify_path`` (rendered by ``ftkit.report.verify_report``).

Kept apart from ``ftkit.checkpoint.verify`` so that the verifier and the bookkeeping checks both
import these types from below, without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.checkpoint import manifest as mf


@dataclass
class FileRow:
    """One line of the per-file table."""

    checkpoint: str
    file: str
    size: int
    tensors: int
    status: str  # "ok" or the finding codes


@dataclass
class CheckpointResult:
    name: str
    path: Path
    manifest: mf.Manifest | None
    manifest_sha256: str | None
    shards_ok: bool = True  # the payload files form complete shard sets (FT218)


@dataclass
class VerifyResult:
    findings: list[Any]
    rules: list[Any]
    rows: list[FileRow] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    rule_seconds: dict[str, float] = field(default_factory=dict)  # by code: the seconds of its checks (Collector.timed)
