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


def check_bookkeeping(root: Path, results: Sequence[CheckpointResult], col: Collector, dropped: Sequence[str]) -> None:
    """Leftovers (FT217), the journal (FT213), retention records (FT211), latest (FT212), and the
    ``dropped`` directories whose deletion failed (FT216; not verified as checkpoints)."""
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
    records = _check_records(root, results, col)
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
        return
    if target != newest:
        col.add(
            "FT212", f"latest -> {target}, but the newest recorded checkpoint is {newest}", file=str(root / "latest")
        )


def _check_records(root: Path, results: Sequence[CheckpointResult], col: Collector) -> list[Record]:
    col.check("FT211", max(1, len(results)))
    path = root / RETENTION
    where = {"file": str(path)}
    records: list[Record] = []
    if not os.path.lexists(path):
        if results:
            col.add("FT211", f"{RETENTION} is missing but {len(results)} checkpoint(s) exist", **where)
        return records
    try:
        doc: Any = load_json(read_regular(path))
        records, latest = records_from_json(doc)
        policy = RetentionPolicy(**doc["policy"])
    except (ValueError, KeyError, TypeError) as exc:
        col.add("FT211", f"{RETENTION} is malformed: {exc}", **where)
        return []
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
    return records


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def check_events(log: Path, results: Sequence[CheckpointResult], col: Collector) -> None:
    """FT214 against committed ``state_fingerprint`` events and against the ``manifest_sha256``
    of the latest ``checkpoint_published`` of each checkpoint, FT215 against non-finite evidence.

    In a resumed run (``run_resumed``), the evidence an earlier session logged for a step that
    a later session trained again (a step after the later session's checkpoint) is superseded:
    only the latest session's is checked (it may be of another layout, with other rank totals).
    """
    from ftkit.events.reader import iter_events

    seen: list[tuple[str, int, float, Any]] = []  # (kind, step, time, evidence)
    published: dict[str, Any] = {}  # checkpoint name -> manifest_sha256 of its latest publication
    resumed: list[tuple[float, int]] = []  # (time, checkpoint_step) of each later session
    for ev in iter_events([log]):
        t, step, when = ev.get("type"), ev.get("step"), ev.get("time")
        if t == "run_resumed" and isinstance(ev.get("checkpoint_step"), int) and isinstance(when, (int, float)):
            resumed.append((float(when), ev["checkpoint_step"]))
        if not isinstance(step, int):
            continue
        if t == "checkpoint_published" and isinstance(ev.get("path"), str):
            published[Path(ev["path"]).name] = ev.get("manifest_sha256")
        when = float(when) if isinstance(when, (int, float)) else math.inf
        if t == "state_fingerprint":
            rank = ev.get("rank") if ev.get("rank") is not None else (ev.get("source") or {}).get("rank")
            seen.append(("fp", step, when, (ev.get("cell"), rank, ev.get("total"))))
        elif t == "grad_nonfinite":
            where = f"grad_nonfinite on cell {ev.get('cell')} rank {ev.get('rank')} ({ev.get('where')})"
            seen.append(("bad", step, when, where))
        elif t == "metric":
            for name, v in (ev.get("values") or {}).items():
                if isinstance(v, float) and not math.isfinite(v):
                    seen.append(("bad", step, when, f"metric {name}={v}"))
    fps: dict[int, list[tuple[Any, Any, Any]]] = {}
    bad: dict[int, str] = {}
    for kind, step, when, evidence in seen:
        if any(when < at and ckpt < step for at, ckpt in resumed):
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
        if r.name in published and published[r.name] != r.manifest_sha256:
            col.add(
                "FT214",
                f"{r.name}: the log's checkpoint_published says MANIFEST.json has sha256 "
                f"{str(published[r.name])[:16]}..., the manifest on disk has {str(r.manifest_sha256)[:16]}...",
                checkpoint=r.name,
                step=man.step,
            )
        compared = 0
        for cell, rank, total in fps.get(man.step, []):
            want = man.rank_totals.get(str(rank)) if man.rank_totals else (man.state_fingerprint if rank == 0 else None)
            if want is None and not man.rank_totals:
                continue
            compared += 1
            if total != want:
                col.add(
                    "FT214",
                    f"{r.name}: cell {cell} rank {rank} logged state {str(total)[:12]} at step {man.step}, "
                    f"the checkpoint holds {str(want)[:12]}",
                    checkpoint=r.name,
                    step=man.step,
                )
        if not compared:
            col.add("FT214", f"{r.name}: the event log holds no committed state_fingerprint for step {man.step}",
                    checkpoint=r.name, step=man.step)  # fmt: skip
        elif len(man.rank_totals) > 1:  # a cell of several ranks: every rank's total must be in the log
            logged = {str(rank) for _, rank, _ in fps.get(man.step, [])}
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
