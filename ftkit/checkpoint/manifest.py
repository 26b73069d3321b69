"""``MANIFEST.json``: the commit marker of a checkpoint, written last.

It lists every other file of the checkpoint with its size and sha256, and for safetensors
files every tensor's dtype, shape, fingerprint and non-finite count; the scan result; the
guard interval; the ranking metric and its value; the state fingerprint (``combine`` of the
per-tensor fingerprints of the files named in ``fingerprint_prefixes``, each name prefixed,
so it equals the ``total`` a rank logs in ``state_fingerprint`` for a TP=1/PP=1 layout);
the per-rank totals the ranks logged at that step; the fingerprint scheme of all of these
(``fingerprint_scheme``; a manifest without it is ``ftkit-fp1``, what versions before it
wrote); and the protocol version. Anything not
in it is not part of the checkpoint. Schema in docs/checkpoints.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftkit.checkpoint.layout import PROTOCOL
from ftkit.checkpoint.stfile import FileRecord
from ftkit.tensors.fingerprint import SCHEME
from ftkit.tensors.untrusted import NotRegular, load_json, read_regular

_HEX64 = r"^[0-9a-f]{64}$"
_HEX32 = r"^[0-9a-f]{32}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorEntry(_Strict):
    dtype: str
    shape: list[int]
    fingerprint: str = Field(pattern=_HEX32)
    nonfinite: int = Field(ge=0)


class FileEntry(_Strict):
    size: int = Field(ge=0)
    sha256: str = Field(pattern=_HEX64)
    tensors: dict[str, TensorEntry] | None = None


class ScanEntry(_Strict):
    tensors: int = Field(ge=0)
    nonfinite: int = Field(ge=0)
    clean: bool


class GuardEntry(_Strict):
    from_step: int
    to_step: int
    tainted: bool
    count: int = Field(ge=0)
    reasons: list[str]


class MetricEntry(_Strict):
    name: str | None
    value: float | None


class Manifest(_Strict):
    protocol: Literal["ftkit.checkpoint/1"]
    step: int = Field(ge=0)
    rollout: int | None
    created: float
    files: dict[str, FileEntry]
    scan: ScanEntry
    guard: GuardEntry
    metric: MetricEntry
    state_fingerprint: str | None
    fingerprint_prefixes: dict[str, str]
    fingerprint_scheme: Literal["ftkit-fp1", "ftkit-fp2"] = "ftkit-fp1"
    rank_totals: dict[str, str]

    @property
    def eligible_best(self) -> bool:
        """Whether this checkpoint may rank as best: a finite metric and an untainted interval."""
        v = self.metric.value
        return v is not None and math.isfinite(v) and not self.guard.tainted


class ManifestError(ValueError):
    """``MANIFEST.json`` is missing, not JSON, or not a protocol-1 manifest."""


def state_fingerprint(files: dict[str, FileEntry], prefixes: dict[str, str]) -> str | None:
    """``combine`` of ``prefix + tensor name -> fingerprint`` over the files in ``prefixes``."""
    from ftkit.tensors.fingerprint import combine

    if not prefixes:
        return None
    named: dict[str, str] = {}
    for fname, prefix in prefixes.items():
        entry = files.get(fname)
        for name, t in ((entry.tensors or {}) if entry else {}).items():
            named[prefix + name] = t.fingerprint
    return combine(named)


def build(
    *,
    step: int,
    rollout: int | None,
    created: float,
    records: dict[str, FileRecord],
    guard: dict[str, Any],
    metric_name: str | None,
    metric: float | None,
    prefixes: dict[str, str],
    rank_totals: dict[str, str],
) -> Manifest:
    """The manifest of a staged checkpoint from its file records."""
    files = {
        name: FileEntry(
            size=r.size,
            sha256=r.sha256,
            tensors=None
            if r.tensors is None
            else {
                n: TensorEntry(dtype=t.dtype, shape=list(t.shape), fingerprint=t.fingerprint, nonfinite=t.nonfinite)
                for n, t in r.tensors.items()
            },
        )
        for name, r in sorted(records.items())
    }
    tensors = [t for f in files.values() for t in (f.tensors or {}).values()]
    bad = sum(t.nonfinite for t in tensors)
    return Manifest(
        protocol=PROTOCOL,
        step=step,
        rollout=rollout,
        created=created,
        files=files,
        scan=ScanEntry(tensors=len(tensors), nonfinite=bad, clean=bad == 0),
        guard=GuardEntry(**guard),
        metric=MetricEntry(name=metric_name, value=metric),
        state_fingerprint=state_fingerprint(files, prefixes),
        fingerprint_prefixes=dict(prefixes),
        fingerprint_scheme=SCHEME,
        rank_totals=dict(rank_totals),
    )


def dumps(manifest: Manifest) -> bytes:
    """The bytes of ``MANIFEST.json`` (NaN / Infinity literals for a non-finite metric)."""
    return (json.dumps(manifest.model_dump(mode="python"), indent=1, sort_keys=True) + "\n").encode()


def load(path: Path) -> tuple[Manifest, bytes]:
    """Parse ``MANIFEST.json``; ``(manifest, raw bytes)``; ``ManifestError`` with one line."""
    try:
        raw = read_regular(path)
    except NotRegular as exc:
        raise ManifestError(str(exc)) from exc
    except FileNotFoundError as exc:
        raise ManifestError("no MANIFEST.json") from exc
    except OSError as exc:
        raise ManifestError(f"MANIFEST.json unreadable: {exc.strerror or exc}") from exc
    try:
        doc = load_json(raw)
    except ValueError as exc:  # invalid UTF-8 or JSON, or nested too deeply
        raise ManifestError(f"MANIFEST.json is not JSON ({exc})") from exc
    try:
        return Manifest.model_validate(doc), raw
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ManifestError(f"MANIFEST.json is not a {PROTOCOL} manifest: {where}: {first['msg']}") from exc
