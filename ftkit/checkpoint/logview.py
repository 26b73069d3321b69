"""What a run's event log says about its checkpoints, and the verifier checks that reconcile the
checkpoints directory with it (``verify-checkpoint`` with the log on).

``read_log(events)`` streams the log once into a ``LogView``: every ``checkpoint_published``
(name, step, manifest sha256, bytes, what retention kept), every ``state_fingerprint`` with its
per-tensor entries, non-finite evidence, the sessions (``run_started`` / ``run_resumed``: time,
config) and whether a producer other than ``ftkit train`` wrote it (``evidence_profile``).

Reconciled against it (``check_published``, ``check_log_bookkeeping``):

- a checkpoint on disk that the log never published is not trusted (FT214), nor one whose size
  on disk (the sum of the manifest's files) is not the ``bytes`` the log published;
- a logged ``state_fingerprint`` whose ``total`` is not the fingerprint of its own per-tensor
  entries is a forged line (FT214), and for a TP=1/PP=1 checkpoint the entries must be the
  manifest's tensor fingerprints, entry for entry (FT214 names the first that differ);
- ``retention.json``'s records must be what the last publication kept (less what a later
  resume retired) and its policy the one the publishing session was configured with (FT211);
- ``journal.json`` must be there once the log published anything, and its last transaction
  cannot be older than the log's last publication (FT213).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.checkpoint.codes import Collector
from ftkit.checkpoint.layout import parse_step
from ftkit.checkpoint.results import CheckpointResult


@dataclass
class Publication:
    name: str
    step: int
    time: float
    manifest_sha256: Any
    bytes: Any
    kept: list[str] | None


@dataclass
class LogView:
    published: list[Publication] = field(default_factory=list)
    # (kind, step, time, evidence): kind "fp" -> (cell, rank, total, params, optimizer); "bad" -> text
    seen: list[tuple[str, int, float, Any]] = field(default_factory=list)
    resumed: list[tuple[float, int]] = field(default_factory=list)  # (time, checkpoint_step) of later sessions
    sessions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (time, config) per session
    foreign_producer: bool = False  # an evidence_profile line: not ftkit train's own log

    def latest(self) -> dict[str, Publication]:
        """The latest publication of each checkpoint name."""
        return {p.name: p for p in self.published}


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.inf


def read_log(log: Path) -> LogView:
    from ftkit.events.reader import iter_events

    view = LogView()
    for ev in iter_events([log]):
        t, step, when = ev.get("type"), ev.get("step"), _num(ev.get("time"))
        if t in ("run_started", "run_resumed") and isinstance(ev.get("config"), dict):
            view.sessions.append((when, ev["config"]))
        if t == "run_resumed" and isinstance(ev.get("checkpoint_step"), int):
            view.resumed.append((when, ev["checkpoint_step"]))
        if t == "evidence_profile":
            view.foreign_producer = True
        if not isinstance(step, int):
            continue
        if t == "checkpoint_published" and isinstance(ev.get("path"), str):
            kept = ev.get("kept")
            view.published.append(
                Publication(
                    Path(ev["path"]).name,
                    step,
                    when,
                    ev.get("manifest_sha256"),
                    ev.get("bytes"),
                    [k for k in kept if isinstance(k, str)] if isinstance(kept, list) else None,
                )
            )
        elif t == "state_fingerprint":
            rank = ev.get("rank") if ev.get("rank") is not None else (ev.get("source") or {}).get("rank")
            evidence = (ev.get("cell"), rank, ev.get("total"), ev.get("params"), ev.get("optimizer"))
            view.seen.append(("fp", step, when, evidence))
        elif t == "grad_nonfinite":
            where = f"grad_nonfinite on cell {ev.get('cell')} rank {ev.get('rank')} ({ev.get('where')})"
            view.seen.append(("bad", step, when, where))
        elif t == "metric":
            values = ev.get("values")
            for name, v in values.items() if isinstance(values, dict) else ():
                if isinstance(v, float) and not math.isfinite(v):
                    view.seen.append(("bad", step, when, f"metric {name}={v}"))
    return view


def recomputed_total(params: Any, optimizer: Any) -> str | None:
    """The total a ``state_fingerprint`` line's per-tensor entries give, or None when they are
    not ``{name: fingerprint}`` maps (a line without them cannot be recomputed)."""
    from ftkit.tensors.fingerprint import state_total

    if not isinstance(params, dict) or not isinstance(optimizer, dict):
        return None
    if not all(isinstance(v, str) for v in (*params.values(), *optimizer.values())):
        return None
    return state_total(params, optimizer)


def manifest_entries(r: CheckpointResult) -> dict[str, str] | None:
    """``{prefix + tensor: fingerprint}`` of the manifest's fingerprinted groups (the names a
    TP=1/PP=1 rank's ``state_fingerprint`` entries take with ``param/`` / ``optimizer/``)."""
    man = r.manifest
    if man is None or not man.fingerprint_prefixes:
        return None
    named: dict[str, str] = {}
    for fname, entry in man.files.items():
        prefix = man.fingerprint_prefixes.get(fname)
        if prefix is not None:
            named.update({prefix + n: t.fingerprint for n, t in (entry.tensors or {}).items()})
    return named


def check_published(view: LogView, r: CheckpointResult, col: Collector) -> None:
    """FT214: ``r`` must be published in the log, with the manifest sha256 and bytes on disk."""
    man = r.manifest
    if man is None:
        return
    pub = view.latest().get(r.name)
    where = {"checkpoint": r.name, "step": man.step}
    if pub is None:
        col.add(
            "FT214",
            f"{r.name}: the event log never published it (no checkpoint_published for {r.name}): "
            "a checkpoint the log does not vouch for is not trusted",
            **where,
        )
        return
    if pub.manifest_sha256 != r.manifest_sha256:
        col.add(
            "FT214",
            f"{r.name}: the log's checkpoint_published says MANIFEST.json has sha256 "
            f"{str(pub.manifest_sha256)[:16]}..., the manifest on disk has {str(r.manifest_sha256)[:16]}...",
            **where,
        )
    size = sum(f.size for f in man.files.values())
    if isinstance(pub.bytes, int) and pub.bytes != size:
        col.add(
            "FT214",
            f"{r.name}: the log published {pub.bytes} bytes, its manifest lists {size}",
            **where,
        )


def check_entries(r: CheckpointResult, cell: Any, rank: Any, params: Any, optimizer: Any, col: Collector) -> None:
    """FT214 when a TP=1/PP=1 checkpoint's tensors are not the logged line's entries."""
    man = r.manifest
    mine = manifest_entries(r)
    if man is None or mine is None or len(man.rank_totals) > 1:
        return  # a cell of several ranks logs shards: rank_totals recomputes those
    if not isinstance(params, dict) or not isinstance(optimizer, dict):
        return
    logged = {f"param/{n}": h for n, h in params.items()} | {f"optimizer/{n}": h for n, h in optimizer.items()}
    differ = sorted(n for n in mine.keys() | logged.keys() if mine.get(n) != logged.get(n))
    if differ:
        col.add(
            "FT214",
            f"{r.name}: {len(differ)} tensor(s) differ from cell {cell} rank {rank}'s logged state at step "
            f"{man.step}, first {differ[0]!r} (manifest {str(mine.get(differ[0]))[:12]}, "
            f"log {str(logged.get(differ[0]))[:12]})",
            checkpoint=r.name,
            step=man.step,
            tensor=differ[0],
        )


def check_log_bookkeeping(root: Path, view: LogView, records: list[Any] | None, policy: Any, col: Collector) -> None:
    """FT211 (retention records and policy) and FT213 (journal) against the log's publications.
    ``records`` / ``policy``: what ``retention.json`` holds (None when it is unreadable: its own
    finding was made)."""
    from ftkit.checkpoint.journal import read_journal

    last = view.published[-1] if view.published else None
    col.check("FT213")
    try:
        doc = read_journal(root)
    except ValueError:
        doc = None  # reported by check_bookkeeping
    else:
        if doc is None and last is not None:
            col.add(
                "FT213",
                f"journal.json is missing, but the event log published {len(view.latest())} checkpoint(s), "
                f"the last {last.name}",
                file=str(root / "journal.json"),
            )
        elif doc is not None and last is not None and isinstance(doc.get("publish"), str):
            step = parse_step(doc["publish"])
            if step is not None and step < last.step:
                col.add(
                    "FT213",
                    f"journal.json's last transaction published {doc['publish']}, older than the log's last "
                    f"publication {last.name}",
                    file=str(root / "journal.json"),
                )
    if records is None or last is None:
        return
    col.check("FT211")
    published = view.latest()
    names = {r.name for r in records}
    for name in sorted(names - published.keys()):
        col.add("FT211", f"retention.json records {name}, which the event log never published", checkpoint=name)
    if last.kept is not None:
        resumed_after = any(at > last.time for at, _ in view.resumed)
        want = set(last.kept)
        if (names != want) if not resumed_after else not names <= want:
            col.add(
                "FT211",
                f"retention.json records {sorted(names)}, but the log's last publication ({last.name}) kept "
                f"{sorted(want)}" + (" (a later resume may only retire records)" if resumed_after else ""),
                file=str(root / "retention.json"),
            )
    config = next((c for at, c in reversed(view.sessions) if at <= last.time), None)
    if policy is not None and config is not None and not view.foreign_producer:
        want_policy = {k: config.get(k) for k in ("keep_last", "keep_best", "best_metric") if k in config}
        have = policy.to_json()
        differ = {k: (have.get(k), v) for k, v in want_policy.items() if have.get(k) != v}
        if differ:
            shown = "; ".join(f"{k} {a!r} in retention.json, {b!r} in the run's config" for k, (a, b) in differ.items())
            col.add("FT211", f"retention.json's policy is not the run's: {shown}", file=str(root / "retention.json"))
