"""The intent journal: retention records, ``latest`` and deletions change as one transaction.

``checkpoints/journal.json`` holds the last transaction. A transaction is

1. ``begin``: the journal is written (atomically, fsynced) with state ``pending``, the
   retention document before and after, the new ``latest`` and the names to delete. This is
   the commit point: from here on a restart rolls the transaction *forward*.
2. ``apply``: ``retention.json`` := after; ``latest`` := after's latest (a relative symlink
   replaced by rename); each dropped checkpoint is renamed to ``.deleting-<name>-<rand>`` and
   then removed, so a half-deleted directory is never visible under its own name; each
   failure is recorded (returned, reported through ``on_failure``, and kept in the journal),
   never raised; then the journal is rewritten with state ``done``.

``reconcile`` (on restart, before anything else touches ``checkpoints/``) removes staging
and temp files of dead writers and ``.deleting-*`` leftovers, rolls a ``pending`` journal
forward (or back, if the checkpoint it publishes is not intact), removes ``step_*``
directories the records do not hold (renamed but never committed), re-points ``latest``, and
retries the deletions that failed before. Every step is idempotent.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.checkpoint.layout import DELETING, JOURNAL, JOURNAL_SCHEMA, LATEST, MANIFEST, RETENTION, parse_step
from ftkit.checkpoint.retention import load_records
from ftkit.fsutil import fsync_dir, temp_path
from ftkit.tensors.st import remove_stale_temps, write_bytes_atomic
from ftkit.tensors.untrusted import NotRegular, load_json, read_regular

OnFailure = Callable[[str, str], None]  # (checkpoint name, error)


@dataclass
class CleanupFailure:
    name: str
    error: str


@dataclass
class ReconcileReport:
    """What ``reconcile`` did (each list names directories / files under ``checkpoints/``)."""

    rolled: str | None = None  # "forward" | "back" | None
    removed_temps: list[str] = field(default_factory=list)
    removed_unrecorded: list[str] = field(default_factory=list)
    failures: list[CleanupFailure] = field(default_factory=list)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    write_bytes_atomic(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def read_journal(checkpoints: Path) -> dict[str, Any] | None:
    """The journal document, or None when there is none; ``ValueError`` when malformed or not a
    regular file (a symlink, a FIFO: ``read_regular``)."""
    path = checkpoints / JOURNAL
    if not os.path.lexists(path):
        return None
    doc = load_json(read_regular(path))
    if not isinstance(doc, dict) or doc.get("schema") != JOURNAL_SCHEMA or doc.get("state") not in ("pending", "done"):
        raise ValueError(f"not a {JOURNAL_SCHEMA} document in state pending or done")
    _check_fields(doc)
    return doc


_DONE_KEYS = frozenset({"schema", "state", "publish", "outcome", "latest", "cleanup_failures"})
_PENDING_KEYS = frozenset({"schema", "state", "publish", "before", "after", "delete", "cleanup_failures"})


def _check_fields(doc: dict[str, Any]) -> None:
    """``ValueError`` unless ``doc`` holds exactly the fields ``begin`` (pending) or ``finish``
    (done) write, each of its type: names are checkpoint names (``step_N``) or null, ``outcome``
    is ``committed`` or ``rolled_back``, ``cleanup_failures`` a list of ``{name, error}``."""
    want = _DONE_KEYS if doc["state"] == "done" else _PENDING_KEYS
    if set(doc) != want:
        raise ValueError(f"a {doc['state']} journal holds {sorted(set(doc))}, not the fields {sorted(want)}")
    names = [doc["publish"], doc["latest"]] if doc["state"] == "done" else [doc["publish"]]
    for name in names:
        if name is not None and (not isinstance(name, str) or parse_step(name) is None):
            raise ValueError(f"{name!r} is not a checkpoint name")
    if doc["state"] == "done" and doc["outcome"] not in ("committed", "rolled_back"):
        raise ValueError(f"outcome {doc['outcome']!r} is not committed or rolled_back")
    if doc["state"] == "pending" and not (
        isinstance(doc["after"], dict) and isinstance(doc["before"], (dict, type(None))) and _names(doc["delete"])
    ):
        raise ValueError("before, after or delete is not a retention document / a list of checkpoint names")
    failures = doc["cleanup_failures"]
    if not isinstance(failures, list) or not all(
        isinstance(f, dict) and set(f) == {"name", "error"} and isinstance(f["error"], str) and _names([f["name"]])
        for f in failures
    ):
        raise ValueError("cleanup_failures is not a list of {name, error}")


def _names(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(n, str) and parse_step(n) is not None for n in values)


def failed_cleanups(checkpoints: Path) -> list[str]:
    """Names whose deletion failed in the last transaction and that are still there (the next
    transaction retries them, so a failure is never forgotten)."""
    doc = read_journal(checkpoints)
    if doc is None or doc["state"] != "done":
        return []
    names = [f.get("name") for f in doc.get("cleanup_failures", []) if isinstance(f, dict)]
    return [n for n in names if isinstance(n, str) and parse_step(n) is not None and (checkpoints / n).exists()]


def begin(checkpoints: Path, publish: str | None, before: dict[str, Any] | None, after: dict[str, Any],
          delete: list[str]) -> dict[str, Any]:  # fmt: skip
    """Write the ``pending`` journal (the commit point); returns it for ``apply``."""
    doc = {
        "schema": JOURNAL_SCHEMA,
        "state": "pending",
        "publish": publish,
        "before": before,
        "after": after,
        "delete": list(delete),
        "cleanup_failures": [],
    }
    _write_json(checkpoints / JOURNAL, doc)
    return doc


def apply(
    checkpoints: Path,
    doc: dict[str, Any],
    on_failure: OnFailure | None = None,
    before_cleanup: Callable[[], None] | None = None,
) -> list[CleanupFailure]:
    """Carry out a ``pending`` journal (idempotent); returns the cleanup failures.

    ``before_cleanup`` runs before the deletions (the publisher's ``publish_cleanup`` fault
    point); an ``OSError`` from it counts as the failure of every deletion of this call.
    """
    after = doc["after"]
    _write_json(checkpoints / RETENTION, after)
    set_latest(checkpoints, after.get("latest"))
    failures: list[CleanupFailure] = []
    try:
        if before_cleanup is not None:
            before_cleanup()
    except OSError as exc:
        failures = [CleanupFailure(n, _err(exc)) for n in doc["delete"] if (checkpoints / n).exists()]
    else:
        for name in doc["delete"]:
            try:
                condemn(checkpoints, name)
            except OSError as exc:
                failures.append(CleanupFailure(name, _err(exc)))
    for f in failures:
        if on_failure is not None:
            on_failure(f.name, f.error)
    finish(checkpoints, doc, "committed", failures)
    return failures


def finish(checkpoints: Path, doc: dict[str, Any], outcome: str, failures: list[CleanupFailure]) -> None:
    """Rewrite the journal with state ``done``, the outcome and the recorded failures."""
    _write_json(
        checkpoints / JOURNAL,
        {
            "schema": JOURNAL_SCHEMA,
            "state": "done",
            "publish": doc.get("publish"),
            "outcome": outcome,
            "latest": (doc["after"] if outcome == "committed" else doc.get("before") or {}).get("latest"),
            "cleanup_failures": [{"name": f.name, "error": f.error} for f in failures],
        },
    )


def set_latest(checkpoints: Path, name: str | None) -> None:
    """Point ``checkpoints/latest`` at ``name`` atomically (symlink + rename); None removes it."""
    link = checkpoints / LATEST
    if name is None:
        if link.is_symlink() or link.exists():
            link.unlink()
            fsync_dir(checkpoints)
        return
    if link.is_symlink() and os.readlink(link) == name:
        return
    tmp = temp_path(link)
    os.symlink(name, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(checkpoints)


def read_latest(checkpoints: Path) -> str | None:
    """The name ``latest`` points to; None when absent; ``ValueError`` when it is not a symlink."""
    link = checkpoints / LATEST
    if link.is_symlink():
        return os.readlink(link)
    if link.exists():
        raise ValueError("latest is not a symlink")
    return None


def condemn(checkpoints: Path, name: str) -> None:
    """Delete a checkpoint directory: rename it to ``.deleting-*`` first, then remove it."""
    src = checkpoints / name
    if not src.exists():
        return
    doomed = checkpoints / f"{DELETING}{name}-{secrets.token_hex(4)}"
    os.rename(src, doomed)
    fsync_dir(checkpoints)
    shutil.rmtree(doomed)


def _err(exc: OSError) -> str:
    return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror or exc}"


def _intact(checkpoints: Path, name: str | None, after: dict[str, Any]) -> bool:
    """Whether the checkpoint a pending journal publishes is in place with the recorded manifest."""
    if name is None:
        return True
    import hashlib

    try:
        digest = hashlib.sha256(read_regular(checkpoints / name / MANIFEST)).hexdigest()
    except (OSError, NotRegular):
        return False
    return any(r.get("name") == name and r.get("manifest_sha256") == digest for r in after.get("records", []))


def reconcile(checkpoints: Path, on_failure: OnFailure | None = None) -> ReconcileReport:
    """Bring ``checkpoints/`` to a committed state after a crash (see the module docstring).

    ``ValueError`` when the journal or the records are unreadable (a human must look).
    """
    report = ReconcileReport()
    if not checkpoints.is_dir():
        return report
    targets = {p.name[1 : p.name.index(".tmp-")] for p in checkpoints.iterdir() if ".tmp-" in p.name[1:]}
    for target in sorted(targets):
        report.removed_temps += [p.name for p in remove_stale_temps(checkpoints / target)]
    for p in sorted(checkpoints.glob(f"{DELETING}*")):
        try:
            shutil.rmtree(p)
            report.removed_temps.append(p.name)
        except OSError as exc:
            report.failures.append(CleanupFailure(p.name, _err(exc)))
    doc = read_journal(checkpoints)
    if doc is not None and doc["state"] == "pending":
        if _intact(checkpoints, doc.get("publish"), doc["after"]):
            report.rolled = "forward"
            report.failures += apply(checkpoints, doc, on_failure)
        else:
            report.rolled = "back"
            before = doc.get("before")
            if before is None:
                (checkpoints / RETENTION).unlink(missing_ok=True)
            else:
                _write_json(checkpoints / RETENTION, before)
            finish(checkpoints, doc, "rolled_back", [])
    records, latest = load_records(checkpoints)
    kept = {r.name for r in records}
    for p in sorted(checkpoints.iterdir()):
        if parse_step(p.name) is not None and p.name not in kept and not p.is_symlink():
            try:
                condemn(checkpoints, p.name)
                report.removed_unrecorded.append(p.name)
            except OSError as exc:
                report.failures.append(CleanupFailure(p.name, _err(exc)))
    set_latest(checkpoints, latest)
    doc = read_journal(checkpoints)
    if doc is not None and doc.get("cleanup_failures"):
        still = [
            CleanupFailure(f["name"], f["error"]) for f in doc["cleanup_failures"] if (checkpoints / f["name"]).exists()
        ]
        if len(still) != len(doc["cleanup_failures"]):
            _write_json(checkpoints / JOURNAL, {**doc, "cleanup_failures": [vars(f) for f in still]})
    return report
