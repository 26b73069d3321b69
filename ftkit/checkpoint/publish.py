"""The publication flow, as a library over a state the caller provides.

The caller (one process, after every rank's ``preflight`` verdict was gathered and
``agree``d) hands ``Publisher.publish`` a ``Payload``: files of ``{name: tensor}`` in the
TP=1/PP=1 layout plus ``meta``; or a ``StageWriter``, a function that writes the payload into
the staging directory somewhere else and returns what it wrote (``Staged``: ``ftkit train``'s
driver has a rank write the state it holds, ``write_payload``, so the tensors never reach the
driver). Phases, in order, each with its fault point:

``publish_write``    stage ``checkpoints/.step_N.tmp-*`` (same file system) and write the
                     safetensors files (each payload group cut into shard files of at most
                     ``shard_bytes`` of tensor data, ``ftkit.checkpoint.shards``) and
                     ``meta.json`` straight from the tensors' memory, one job per file that
                     feeds each piece it writes to the file's sha256 and the tensor's
                     fingerprint and NaN/Inf count, and fsyncs the file at its end; the files
                     in parallel on every core (``stfile.write_files``)
``publish_scan``     reject on any NaN/Inf (optimizer state included); fsync ``meta.json``
``publish_manifest`` write ``MANIFEST.json`` last, fsync it and the staging directory
``publish_rename``   rename to ``checkpoints/step_N`` and fsync ``checkpoints/``
``publish_journal``  retention decides what is kept; the intent journal is written (commit point)
``publish_cleanup``  (inside ``journal.apply``) retention records, ``latest``, deletions

A failure (``OSError``, e.g. ENOSPC, or a failed scan) before the commit point removes
everything staged or renamed and returns a rejected ``Outcome`` with the reason (any other
exception before the rename, e.g. a signal's, removes the staging directory and is raised); after it the
checkpoint is published and any leftover is finished by the next ``publish`` or by
``journal.reconcile``. Deletion failures are recorded, reported, never fatal. Events go
through ``on_event(type, fields)``: ``checkpoint_published`` (at the commit point, before the
cleanup), ``checkpoint_rejected``,
``checkpoint_cleanup_failed``.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.checkpoint import journal
from ftkit.checkpoint import manifest as mf
from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.layout import MANIFEST, META, PROTOCOL, step_name
from ftkit.checkpoint.preflight import Hook, PreflightVerdict, fire
from ftkit.checkpoint.retention import Record, RetentionPolicy, load_records, select
from ftkit.checkpoint.shards import DEFAULT_SHARD_BYTES, is_shard_name, split
from ftkit.checkpoint.stfile import (
    FileRecord,
    fsync_file,
    layout_st,
    payload_nbytes,
    tensor_nbytes,
    write_files,
    write_json,
)
from ftkit.fsutil import fsync_dir, temp_path

OnEvent = Callable[[str, dict[str, Any]], None]
TENSOR_OVERHEAD = 512  # bytes per tensor: its safetensors header entry and its manifest entry


@dataclass(frozen=True)
class Payload:
    """What to publish: ``files`` (payload groups, ``"model.safetensors" -> {name: tensor}``;
    each stored as one file or as shards, ``ftkit.checkpoint.shards``), ``meta`` (step,
    rollout, config hash, cells and layout; JSON-able), the groups whose tensors make up the
    state fingerprint and their name prefixes, and the totals the ranks logged at this step."""

    files: Mapping[str, Mapping[str, Any]]
    meta: Mapping[str, Any] = field(default_factory=dict)
    fingerprint_prefixes: Mapping[str, str] = field(default_factory=dict)
    rank_totals: Mapping[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes the checkpoint will take: tensor data plus an allowance per tensor for its
        safetensors header and manifest entries (what preflight asks free space for)."""
        return sum(payload_nbytes(t) + TENSOR_OVERHEAD * len(t) for t in self.files.values())


@dataclass(frozen=True)
class Staged:
    """What ``write_payload`` left in a staging directory: every payload file's record (by file
    name: sha256, size, each tensor's fingerprint and NaN/Inf count), each shard's fingerprint
    prefix, the payload's ``meta`` (``meta.json`` is written by the publisher) and rank totals."""

    records: dict[str, FileRecord]
    prefixes: dict[str, str]
    meta: dict[str, Any]
    rank_totals: dict[str, str]


@dataclass(frozen=True)
class WriteFailure:
    """An ``OSError`` of a ``write_payload`` run in another process, sent back as a value (so the
    process's caller can tell a failed write from a failed process) and raised again there."""

    errno: int | None
    strerror: str
    filename: str | None

    @classmethod
    def of(cls, exc: OSError) -> WriteFailure:
        return cls(exc.errno, exc.strerror or str(exc), None if exc.filename is None else str(exc.filename))

    def error(self) -> OSError:
        """The ``OSError`` again (``Publisher`` rejects the publication with its reason)."""
        if self.filename is None:
            return OSError(self.errno, self.strerror)
        return OSError(self.errno, self.strerror, self.filename)


StageWriter = Callable[[Path], Staged]  # writes the payload files into the staging directory


def write_payload(stage: Path, step: int, payload: Payload, shard_bytes: int = DEFAULT_SHARD_BYTES) -> Staged:
    """Write ``payload``'s safetensors files (each group cut into shards of at most
    ``shard_bytes`` of tensor data) into the existing directory ``stage``; every file's sha256
    and every tensor's fingerprint and NaN/Inf count are computed in the same pass
    (``stfile.write_files``), each file fsynced. ``ValueError`` for a file name that is not a
    plain ``*.safetensors`` name; ``OSError`` as the writes raise it. Runs wherever the tensors
    are (``ftkit train``: in a rank)."""
    _check_names(payload)
    files, prefixes = _shard(payload, shard_bytes)
    meta_st = {"protocol": PROTOCOL, "step": str(step)}
    layouts = {stage / f: layout_st(tensors, meta_st) for f, tensors in files.items()}
    records = {p.name: r for p, r in write_files(layouts).items()}
    return Staged(records, prefixes, dict(payload.meta), dict(payload.rank_totals))


def _shard(payload: Payload, shard_bytes: int) -> tuple[dict[str, Mapping[str, Any]], dict[str, str]]:
    """The payload's files after sharding, and the fingerprint prefix of each shard (its group's)."""
    files: dict[str, Mapping[str, Any]] = {}
    prefixes: dict[str, str] = {}
    for group, tensors in payload.files.items():
        sizes = {n: tensor_nbytes(t) for n, t in tensors.items()}
        for fname, part in split(group, tensors, sizes, shard_bytes).items():
            files[fname] = part
            if group in payload.fingerprint_prefixes:
                prefixes[fname] = payload.fingerprint_prefixes[group]
    return files, prefixes


@dataclass
class Outcome:
    """The result of one ``publish`` call."""

    published: bool
    step: int
    path: Path | None = None
    reason: str | None = None
    manifest_sha256: str | None = None
    bytes: int = 0
    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    cleanup_failures: list[journal.CleanupFailure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class _Rejected(Exception):
    """A phase decided not to publish (the message is the reason)."""


class Publisher:
    """Publishes checkpoints into ``checkpoints`` under ``policy``.

    ``at`` is the fault hook (``preflight.fire`` semantics); ``on_event`` receives events;
    ``shard_bytes`` bounds the tensor data of one payload file (a larger group is sharded).
    """

    def __init__(
        self,
        checkpoints: Path,
        policy: RetentionPolicy,
        on_event: OnEvent | None = None,
        at: Hook | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        self.dir = Path(checkpoints)
        self.policy = policy
        self.on_event = on_event
        self.at = at
        self.shard_bytes = shard_bytes

    def _emit(self, type_: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(type_, fields)

    def publish(
        self,
        step: int,
        payload: Payload | StageWriter,
        guard: GuardVerdict,
        agreed: PreflightVerdict,
        metric: float | None = None,
        rollout: int | None = None,
    ) -> Outcome:
        """Run the phases for ``step`` (see the module docstring); never raises an ``OSError``.
        ``payload``: the state, or a ``StageWriter`` that writes it into the staging directory
        (called once, in the ``publish_write`` phase; an ``OSError`` it raises rejects)."""
        clock: dict[str, float] = {}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._finish_pending()
        except (OSError, ValueError) as exc:  # nothing new is published over an unfinished transaction
            return self._reject(step, f"the previous retention transaction cannot be finished: {_reason(exc)}", clock)
        if not agreed.ok:
            return self._reject(step, f"preflight: {agreed.reason}", clock)
        if guard.tainted:
            return self._reject(step, f"guard: steps [{guard.from_step}, {guard.to_step}] tainted", clock)
        if isinstance(payload, Payload):  # (write_payload checks its names: nothing stays staged)
            payload = functools.partial(write_payload, step=step, payload=payload, shard_bytes=self.shard_bytes)
        target = self.dir / step_name(step)
        stage = temp_path(target)
        try:
            t0 = time.perf_counter()
            fire(self.at, "publish_write")
            stage.mkdir()
            staged = payload(stage)
            records = dict(staged.records)
            records[META] = write_json(
                stage / META, {**staged.meta, "protocol": PROTOCOL, "step": step, "rollout": rollout}
            )
            clock["write"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            fire(self.at, "publish_scan")
            self._scan(records)
            fsync_file(stage / META)  # the safetensors files were fsynced by their writers
            clock["scan"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            fire(self.at, "publish_manifest")
            man = mf.build(
                step=step,
                rollout=rollout,
                created=time.time(),
                records=records,
                guard=guard.to_json(),
                metric_name=self.policy.best_metric,
                metric=metric,
                prefixes=staged.prefixes,
                rank_totals=staged.rank_totals,
            )
            raw = mf.dumps(man)
            with open(stage / MANIFEST, "wb") as fh:
                fh.write(raw)
            fsync_file(stage / MANIFEST)
            fsync_dir(stage)
            clock["manifest"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            fire(self.at, "publish_rename")
            stage.rename(target)
            fsync_dir(self.dir)
            clock["rename"] = time.perf_counter() - t0
        except (OSError, _Rejected) as exc:
            shutil.rmtree(stage, ignore_errors=True)
            return self._reject(step, _reason(exc), clock)
        except BaseException:  # a signal (``ftkit train``'s RunInterrupted, Ctrl-C): nothing half-written stays
            shutil.rmtree(stage, ignore_errors=True)
            raise
        digest = hashlib.sha256(raw).hexdigest()
        record = Record(target.name, step, metric, guard.tainted, digest)
        t0 = time.perf_counter()
        try:
            fire(self.at, "publish_journal")
            old, old_latest = load_records(self.dir)
            before = select(old, self.policy).to_json(self.policy) if old else None
            retained = select([*old, record], self.policy)
            delete = retained.dropped + [n for n in journal.failed_cleanups(self.dir) if n not in retained.dropped]
            doc = journal.begin(self.dir, target.name, before, retained.to_json(self.policy), delete)
        except (OSError, ValueError) as exc:
            reason = _reason(exc)
            try:
                journal.condemn(self.dir, target.name)
            except OSError as exc2:  # reconcile removes the unrecorded directory later
                reason += f"; removing {target.name} failed too ({exc2}), reconcile will"
            return self._reject(step, reason, clock)
        out = Outcome(True, step, target, manifest_sha256=digest, bytes=sum(r.size for r in records.values()))
        out.kept, out.dropped = [r.name for r in retained.kept], retained.dropped
        # logged at the commit point, before the cleanup: a process killed in the cleanup leaves a
        # published checkpoint that its log records too (reconcile finishes the cleanup)
        self._emit(
            "checkpoint_published",
            step=step,
            path=str(target),
            kind="latest",
            metric=metric,
            manifest_sha256=digest,
            guard_from_step=guard.from_step,
            guard_to_step=guard.to_step,
            bytes=out.bytes,
            kept=out.kept,
            dropped=out.dropped,
        )
        try:
            out.cleanup_failures = journal.apply(
                self.dir, doc, self._cleanup_failed(step), lambda: _cleanup_hook(self.at)
            )
        except OSError as exc:  # committed: the pending journal is finished next time
            out.reason = f"published; bookkeeping left pending ({_reason(exc)})"
        clock["journal"] = time.perf_counter() - t0
        out.seconds = clock
        return out

    @staticmethod
    def _scan(records: dict[str, FileRecord]) -> None:
        bad = [(f, n, t.nonfinite) for f, r in records.items() for n, t in (r.tensors or {}).items() if t.nonfinite]
        if bad:
            f, n, k = bad[0]
            total = sum(b[2] for b in bad)
            raise _Rejected(f"scan: {total} non-finite value(s) in {len(bad)} tensor(s), first {f}:{n} ({k})")

    def _finish_pending(self) -> None:
        doc = journal.read_journal(self.dir)
        if doc is not None and doc["state"] == "pending":
            journal.apply(self.dir, doc, self._cleanup_failed(None))

    def _cleanup_failed(self, step: int | None) -> journal.OnFailure:
        def report(name: str, error: str) -> None:
            self._emit("checkpoint_cleanup_failed", step=step, path=str(self.dir / name), error=error)

        return report

    def _reject(self, step: int, reason: str, clock: dict[str, float]) -> Outcome:
        self._emit("checkpoint_rejected", step=step, kind="latest", reason=reason)
        return Outcome(False, step, reason=reason, seconds=clock)


def _check_names(payload: Payload) -> None:
    for fname in payload.files:
        if "/" in fname or fname.startswith(".") or not fname.endswith(".safetensors") or is_shard_name(fname):
            raise ValueError(f"payload file name {fname!r} is not a plain *.safetensors name (nor a shard's)")


def _cleanup_hook(at: Hook | None) -> None:
    fire(at, "publish_cleanup")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _Rejected):
        return str(exc)
    if isinstance(exc, OSError):
        return f"I/O error: [Errno {exc.errno}] {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"
