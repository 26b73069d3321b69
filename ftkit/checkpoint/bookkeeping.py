"""Verifier checks across checkpoints: retention records, ``latest``, the journal, leftovers,
and (``--events``) the event log's committed fingerprints and non-finite observations."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftkit.checkpoint.codes import Collector
from ftkit.checkpoint.journal import read_journal, read_latest
from ftkit.checkpoint.layout import DELETING, RETENTION, parse_step
from ftkit.checkpoint.logview import LogView, check_entries, check_published, read_log, recomputed_total
from ftkit.checkpoint.results import CheckpointResult
from ftkit.checkpoint.retention import Record, RetentionPolicy, records_from_json, select
from ftkit.errors import InputError
from ftkit.tensors.untrusted import load_json, read_regular


def events_dir(path: Path, kind: str) -> Path:
    """The run's ``events/`` for a run, checkpoints or checkpoint path; ``InputError`` if absent."""
    run = {"run": path, "checkpoints": path.parent, "checkpoint": path.parent.parent}[kind]
    log = run / "events"
    if not log.is_dir():
        raise InputError(
            f"--events: no event log at {log}",
            "verify the run directory (PATH/checkpoints and PATH/events), or pass --no-events",
        )
    return log


def check_bookkeeping(
    root: Path, results: Sequence[CheckpointResult], col: Collector, dropped: Sequence[str]
) -> tuple[list[Record] | None, RetentionPolicy | None]:
    """Leftovers (FT217), the journal (FT213), retention records (FT211), latest (FT212), and the
    ``dropped`` directories whose deletion failed (FT216; not verified as checkpoints). Returns
    ``retention.json``'s records and policy (None when absent or unreadable)."""
    for name in dropped:
        col.add("FT216", f"{name}: dropped by retention but its deletion failed (journal)", checkpoint=name)
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") and (".tmp-" in p.name or p.name.startswith(DELETING)):
            col.add("FT217", f"{p.name}: left by an interrupted writer", file=str(p))
    col.check("FT216", len(dropped))
    col.check("FT217")
    col.check("FT213")
    try:
        doc = read_journal(root)
    except ValueError as exc:
        col.add("FT213", f"journal.json is malformed: {exc}", file=str(root / "journal.json"))
        doc = None
    if doc is not None and doc["state"] == "pending":
        col.add(
            "FT213",
            f"journal.json is pending: the transaction publishing {doc.get('publish')} was not rolled forward",
            file=str(root / "journal.json"),
        )
    records, policy = _check_records(root, results, col)
    col.check("FT212")
    newest = max(records, key=lambda r: r.step).name if records else None
    if doc is not None and doc["state"] == "done" and doc["latest"] != newest:
        col.add(
            "FT213",
            f"journal.json's finished transaction left latest {doc['latest']}, but the newest recorded "
            f"checkpoint is {newest}",
            file=str(root / "journal.json"),
        )
    try:
        target = read_latest(root)
    except ValueError as exc:
        col.add("FT212", f"{exc}", file=str(root / "latest"))
        return (records if policy is not None else None), policy
    if target != newest:
        col.add(
            "FT212", f"latest -> {target}, but the newest recorded checkpoint is {newest}", file=str(root / "latest")
        )
    return (records if policy is not None else None), policy


def _check_records(
    root: Path, results: Sequence[CheckpointResult], col: Collector
) -> tuple[list[Record], RetentionPolicy | None]:
    col.check("FT211", max(1, len(results)))
    path = root / RETENTION
    where = {"file": str(path)}
    records: list[Record] = []
    if not os.path.lexists(path):
        if results:
            col.add("FT211", f"{RETENTION} is missing but {len(results)} checkpoint(s) exist", **where)
        return records, None
    try:
        doc: Any = load_json(read_regular(path))
        records, latest = records_from_json(doc)
        policy = RetentionPolicy(**doc["policy"])
    except (ValueError, KeyError, TypeError) as exc:
        col.add("FT211", f"{RETENTION} is malformed: {exc}", **where)
        return [], None
    by_name = {r.name: r for r in results}
    recorded = {r.name for r in records}
    links = {p.name for p in root.iterdir() if p.is_symlink() and parse_step(p.name) is not None}
    for name in sorted(links - recorded):
        col.add("FT211", f"{name}: a symbolic link, not a checkpoint directory (never published)", checkpoint=name)
    for rec in records:
        res = by_name.get(rec.name)
        if res is None:
            what = "a symbolic link, not a checkpoint directory" if rec.name in links else "absent"
            col.add("FT211", f"{RETENTION} records {rec.name}, which is {what}", checkpoint=rec.name, **where)
        elif res.manifest_sha256 is not None and res.manifest_sha256 != rec.manifest_sha256:
            col.add("FT211", f"{rec.name}: MANIFEST.json differs from the one recorded", checkpoint=rec.name, **where)
        elif res.manifest is not None and (
            res.manifest.guard.tainted != rec.tainted or not _same(res.manifest.metric.value, rec.metric)
        ):
            col.add("FT211", f"{rec.name}: recorded metric or taint differs from its manifest", checkpoint=rec.name)
    for res in results:
        if res.name not in recorded:
            col.add("FT211", f"{res.name}: present but not recorded (never published)", checkpoint=res.name, **where)
    want = select(records, policy)
    roles = {r["name"]: r.get("roles") for r in doc["records"]}
    if {r.name for r in want.kept} != recorded or roles != want.roles:
        col.add("FT211", f"{RETENTION} does not follow its policy {policy.to_json()} (roles {roles})", **where)
    if latest != want.latest:
        col.add("FT211", f"{RETENTION} names {latest} latest, the newest record is {want.latest}", **where)
    return records, policy


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def check_events(log: Path, results: Sequence[CheckpointResult], col: Collector, view: LogView | None = None) -> None:
    """FT214 against committed ``state_fingerprint`` events (each line's total recomputed from
    its per-tensor entries; for a TP=1/PP=1 checkpoint the entries compared with the manifest's)
    and against the latest ``checkpoint_published`` of each checkpoint (a checkpoint the log never
    published is not trusted; ``ftkit.checkpoint.logview``), FT215 against non-finite evidence.

    In a resumed run (``run_resumed``), the evidence an earlier session logged for a step that
    a later session trained again (a step after the later session's checkpoint) is superseded:
    only the latest session's is checked (it may be of another layout, with other rank totals).
    """
    view = view if view is not None else read_log(log)
    fps: dict[int, list[tuple[Any, Any, Any, Any, Any]]] = {}
    bad: dict[int, str] = {}
    for kind, step, when, evidence in view.seen:
        if any(when < at and ckpt < step for at, ckpt in view.resumed):
            continue  # trained again by a later session
        if kind == "fp":
            fps.setdefault(step, []).append(evidence)
        else:
            bad.setdefault(step, evidence)
    for r in results:
        man = r.manifest
        if man is None:
            continue
        col.check("FT214")
        check_published(view, r, col)
        compared = 0
        for cell, rank, total, params, optimizer in fps.get(man.step, []):
            want = man.rank_totals.get(str(rank)) if man.rank_totals else (man.state_fingerprint if rank == 0 else None)
            if want is None and not man.rank_totals:
                continue
            compared += 1
            parts = recomputed_total(params, optimizer)
            if parts is not None and parts != total:
                col.add(
                    "FT214",
                    f"{r.name}: cell {cell} rank {rank}'s state_fingerprint at step {man.step} has total "
                    f"{str(total)[:12]}, but its own per-tensor entries give {parts[:12]}: a damaged or forged line",
                    checkpoint=r.name,
                    step=man.step,
                )
            if total != want:
                col.add(
                    "FT214",
                    f"{r.name}: cell {cell} rank {rank} logged state {str(total)[:12]} at step {man.step}, "
                    f"the checkpoint holds {str(want)[:12]}",
                    checkpoint=r.name,
                    step=man.step,
                )
            check_entries(r, cell, rank, params, optimizer, col)
        if not compared:
            col.add("FT214", f"{r.name}: the event log holds no committed state_fingerprint for step {man.step}",
                    checkpoint=r.name, step=man.step)  # fmt: skip
        elif len(man.rank_totals) > 1:  # a cell of several ranks: every rank's total must be in the log
            logged = {str(rank) for _, rank, *_ in fps.get(man.step, [])}
            for rank in sorted(set(man.rank_totals) - logged):
                col.add("FT214", f"{r.name}: the event log holds no state_fingerprint of rank {rank} for step "
                        f"{man.step}", checkpoint=r.name, step=man.step)  # fmt: skip
        col.check("FT215")
        inside = sorted(s for s in bad if man.guard.from_step <= s <= man.guard.to_step)
        if inside:
            col.add(
                "FT215",
                f"{r.name}: its guard interval [{man.guard.from_step}, {man.guard.to_step}] holds non-finite "
                f"step(s) {inside[:5]} in the log: {bad[inside[0]]}",
                checkpoint=r.name,
                step=man.step,
            )
