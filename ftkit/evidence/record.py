"""``RunRecord``: a run directory's ``run.json`` (schema ``ftkit.run/1``), its one writer and reader.

Both producers write it: ``ftkit train`` (``ftkit.train.control.rundir``: ``seed`` and ``task``
besides the config and layout) and ``ftkit.evidence`` (``producer`` and ``evidence_profile``).
The keys are written in one order (``schema, run, ftkit_version, fingerprint_scheme, created,
producer, seed, config, layout, task, evidence_profile``); the optional ones only when set.
``fingerprint_scheme`` says how the run's fingerprints are computed (docs/fingerprints.md); a
record without it is ``ftkit-fp1``. Also here: the membership
epoch a resumed session goes on from, which both producers read from their drivers' logs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.tensors.fingerprint import SCHEME
from ftkit.version import __version__

RUN_SCHEMA = "ftkit.run/1"
RUN_JSON = "run.json"


class NotARunRecord(ValueError):
    """A ``run.json`` that parses as JSON but was not written by ftkit."""


@dataclass(frozen=True)
class RunRecord:
    """What reproduces a run: its name, configuration and layout, and who wrote it."""

    run: str
    config: dict[str, Any]
    layout: dict[str, Any]
    producer: str | None = None  # ftkit.evidence and the producers built on it
    seed: int | None = None  # ftkit train
    task: dict[str, Any] | None = None  # ftkit train
    evidence_profile: dict[str, int] | None = None  # ftkit.evidence
    ftkit_version: str = __version__
    fingerprint_scheme: str = SCHEME  # absent in a record: ftkit-fp1 (written before the field)
    created: float = field(default_factory=time.time)
    schema: str = RUN_SCHEMA

    def to_json(self) -> dict[str, Any]:
        """The document, keys in the order of the module docstring."""
        doc: dict[str, Any] = {
            "schema": self.schema,
            "run": self.run,
            "ftkit_version": self.ftkit_version,
            "fingerprint_scheme": self.fingerprint_scheme,
            "created": self.created,
        }
        optional: dict[str, Any] = {"producer": self.producer, "seed": self.seed}
        doc.update({k: v for k, v in optional.items() if v is not None})
        doc.update(config=self.config, layout=self.layout)
        optional = {"task": self.task, "evidence_profile": self.evidence_profile}
        doc.update({k: v for k, v in optional.items() if v is not None})
        return doc

    def write(self, run_dir: str | os.PathLike[str]) -> None:
        """Write ``run_dir/run.json`` atomically (replacing one that is there)."""
        from ftkit.tensors.st import write_bytes_atomic

        write_bytes_atomic(Path(run_dir) / RUN_JSON, (json.dumps(self.to_json(), indent=2) + "\n").encode())

    @classmethod
    def from_json(cls, doc: Any) -> RunRecord:
        """The record of a decoded ``run.json``; ``NotARunRecord`` unless it is an object written by
        ftkit (``schema`` ``ftkit.run/...``, a string ``ftkit_version``, a ``config`` object)."""
        if not (
            isinstance(doc, dict)
            and str(doc.get("schema", "")).startswith("ftkit.run/")
            and isinstance(doc.get("ftkit_version"), str)
            and isinstance(doc.get("config"), dict)
        ):
            raise NotARunRecord(f"{RUN_JSON} was not written by ftkit")
        run = doc.get("run")
        return cls(
            run=run if isinstance(run, str) else "",
            config=doc["config"],
            layout=doc.get("layout") or {},
            producer=doc.get("producer"),
            seed=doc.get("seed"),
            task=doc.get("task"),
            evidence_profile=doc.get("evidence_profile"),
            ftkit_version=doc["ftkit_version"],
            fingerprint_scheme=str(doc.get("fingerprint_scheme", "ftkit-fp1")),
            created=doc.get("created", 0.0),
            schema=doc["schema"],
        )

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str]) -> RunRecord:
        """``run_dir/run.json``. Raises ``FileNotFoundError`` when absent, ``NotARunRecord`` when not
        ftkit's, ``OSError`` / ``ValueError`` / ``RecursionError`` when unreadable."""
        return cls.from_json(json.loads((Path(run_dir) / RUN_JSON).read_bytes()))


def recorded_name(run_dir: str | os.PathLike[str]) -> str | None:
    """The run name ``run_dir/run.json`` records, or None (no readable record, or no name in it).
    A run directory that was copied or renamed keeps this name, so its logs stay one run's."""
    try:
        name = RunRecord.read(run_dir).run
    except (OSError, ValueError, RecursionError):
        return None
    return name or None


def last_epoch(events_dir: str | os.PathLike[str]) -> int:
    """The highest membership epoch of the drivers' ``reconfigure`` events in a run's ``events/``
    (-1: none): a resumed session's first epoch is one more."""
    from ftkit.events.driver_log import driver_events

    epochs = [ev["epoch"] for ev in driver_events(Path(events_dir), "reconfigure") if type(ev.get("epoch")) is int]
    return max(epochs, default=-1)
