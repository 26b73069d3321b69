"""The fail-closed verifier behind ``ftkit verify-checkpoint``.

``verify_path(path)`` accepts a checkpoint directory (``step_N/``), a ``checkpoints/``
directory (every checkpoint in it plus the bookkeeping: retention records, ``latest``, the
journal, leftovers) or a run directory (its ``checkpoints/``, and by default the event log).
Every expectation that cannot be shown to hold is a finding (FT2xx, ``ftkit.checkpoint.codes``);
only input that is not a checkpoint at all raises ``InputError`` (exit 2).

Per checkpoint: the manifest parses and agrees with itself; every file on disk is listed and
every listed file is present, a regular file, of the listed size and sha256; safetensors files
pass the structural reader and hold exactly the listed tensors with the listed dtype, shape and
fingerprint, all finite; the payload files form complete shard sets, no tensor in two files of a
group (``ftkit.checkpoint.shards``); no pickle anywhere (by name or by content); the guard interval is clean;
for a checkpoint of a cell of several ranks, every rank's recorded total is the fingerprint of
its shard of the stored state (``ftkit.checkpoint.rank_totals``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftkit.checkpoint import manifest as mf
from ftkit.checkpoint.bookkeeping import check_bookkeeping, check_events, events_dir
from ftkit.checkpoint.codes import Collector
from ftkit.checkpoint.layout import MANIFEST, META, RETENTION, checkpoint_dirs, parse_step
from ftkit.checkpoint.logview import check_log_bookkeeping, read_log
from ftkit.checkpoint.results import CheckpointResult, FileRow, VerifyResult
from ftkit.checkpoint.stfile import FileRecord
from ftkit.errors import InputError
from ftkit.fsutil import TMP_MARK
from ftkit.tensors.untrusted import load_json

_PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib")
_ZIP_MAGIC = b"PK\x03\x04"


Progress = Callable[[int], None]


def resolve(path: Path) -> tuple[str, Path | None, list[Path]]:
    """``(kind, checkpoints dir or None, checkpoint dirs)``; kind is checkpoint|checkpoints|run."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory", "pass a checkpoint, a checkpoints/ or a run directory")
    if not path.is_dir():
        raise InputError(f"{path}: not a directory", "pass a checkpoint directory (step_NNNNNN/) or a run directory")
    if (path / MANIFEST).exists() or parse_step(path.name) is not None:
        return "checkpoint", None, [path]
    kind, root = ("run", path / "checkpoints") if (path / "checkpoints").is_dir() else ("checkpoints", path)
    dirs = checkpoint_dirs(root)
    if not dirs and not (root / RETENTION).exists():
        where = "its checkpoints/ directory holds" if kind == "run" else "it holds"
        left = sorted(p.name for p in root.iterdir() if p.name.startswith(".") and TMP_MARK in p.name)
        if left:  # a publication stopped half-way (killed): nothing was published
            raise InputError(
                f"{path}: no checkpoint to verify: none was published ({where} only {', '.join(left)}, "
                "left by a publication that was stopped before its rename)",
                "remove the leftover, or resume the run (ftkit train --resume) to publish a checkpoint",
            )
        raise InputError(
            f"{path}: no checkpoint to verify ({where} no step_* directory and no {RETENTION})",
            "pass a run directory whose training published checkpoints, or a step_NNNNNN/ directory",
        )
    return kind, root, dirs


def verify_path(
    path: Path,
    events: bool | None = None,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
) -> VerifyResult:
    """Verify ``path`` (see the module docstring); ``events`` None means: on for a run directory."""
    from ftkit.checkpoint.rank_totals import check_rank_totals

    t0 = time.perf_counter()
    kind, root, dirs = resolve(Path(path))
    use_events = kind == "run" if events is None else events
    log = events_dir(Path(path), kind) if use_events else None  # InputError before any work
    col = Collector()
    rows: list[FileRow] = []
    dropped = _dropped(root) if root is not None else set()
    with col.timed():
        results = [_load(d, col) for d in dirs if d.name not in dropped]
    if on_start is not None:
        on_start(sum(f.size for r in results if r.manifest for f in r.manifest.files.values()))
    for r in results:
        with col.timed():
            mine = check_files(r, col, progress)
        rows += mine
        if r.manifest is not None and r.shards_ok and all(row.status == "ok" for row in mine):
            with col.timed():
                check_rank_totals(r.name, r.path, r.manifest, col)  # per-rank shards of the stored state
    records, policy = None, None
    if root is not None:
        with col.timed():
            records, policy = check_bookkeeping(root, results, col, sorted(dropped & {d.name for d in dirs}))
    if log is not None:
        with col.timed():
            view = read_log(log)
            check_events(log, results, col, view)
            if root is not None:
                check_log_bookkeeping(root, view, records, policy, col)
    if kind == "run":
        col.check("FT211")
        if (Path(path) / "checkpoints").is_symlink():
            col.add(
                "FT211",
                f"{Path(path) / 'checkpoints'} is a symbolic link, not the run's own checkpoints directory",
                file=str(Path(path) / "checkpoints"),
            )
    return VerifyResult(
        findings=col.sorted(),
        rules=col.summaries(),
        rows=rows,
        checkpoints=[r.name for r in results],
        rule_seconds=col.seconds,
        stats={
            "path": str(path),
            "kind": kind,
            "checkpoints": len(results),
            "files": len(rows),
            "bytes": sum(row.size for row in rows),
            "events": log is not None,
            "seconds": time.perf_counter() - t0,
        },
    )


def _dropped(root: Path) -> set[str]:
    """Directories retention dropped whose deletion failed (journal): leftovers, not checkpoints."""
    from ftkit.checkpoint.journal import failed_cleanups

    try:
        return set(failed_cleanups(root))
    except ValueError:  # a malformed journal is reported by the bookkeeping checks
        return set()


def _load(d: Path, col: Collector) -> CheckpointResult:
    col.check("FT201")
    col.check("FT202")
    try:
        man, raw = mf.load(d / MANIFEST)
    except mf.ManifestError as exc:
        missing = not os.path.lexists(d / MANIFEST)
        col.add("FT201" if missing else "FT202", f"{d.name}: {exc}", checkpoint=d.name, file=str(d / MANIFEST))
        return CheckpointResult(d.name, d, None, None)
    import hashlib

    res = CheckpointResult(d.name, d, man, hashlib.sha256(raw).hexdigest())
    step = parse_step(d.name)
    problems = []
    if step is not None and step != man.step:
        problems.append(f"manifest step {man.step} but directory {d.name}")
    if man.state_fingerprint != mf.state_fingerprint(man.files, man.fingerprint_prefixes):
        problems.append("state_fingerprint is not the combination of the listed tensor fingerprints")
    if len(man.rank_totals) == 1 and man.state_fingerprint not in (None, *man.rank_totals.values()):
        problems.append("the only rank's logged total differs from the state fingerprint")
    if META not in man.files:
        problems.append(f"{META} is not listed")
    for p in problems:
        col.add("FT202", f"{d.name}: {p}", checkpoint=d.name, file=str(d / MANIFEST))
    res.shards_ok = _check_shards(d.name, d, man, col)
    col.check("FT210")
    if not man.scan.clean or man.scan.nonfinite:
        col.add("FT210", f"{d.name}: manifest scan reports {man.scan.nonfinite} non-finite value(s)", checkpoint=d.name)
    col.check("FT215")
    if man.guard.tainted:
        col.add(
            "FT215",
            f"{d.name}: published from tainted guard interval [{man.guard.from_step}, {man.guard.to_step}]"
            + (f": {man.guard.reasons[0]}" if man.guard.reasons else ""),
            checkpoint=d.name,
        )
    return res


def _check_shards(name: str, d: Path, man: mf.Manifest, col: Collector) -> bool:
    """FT218 for every way the listed payload files break the shard rule
    (``shards.group_problems``), or a group whose files disagree on their fingerprint prefix."""
    from ftkit.checkpoint.shards import group_problems, groups

    listed = {f: list(e.tensors) for f, e in man.files.items() if e.tensors is not None}
    problems = group_problems(listed)
    for group, files in groups(listed).items():
        prefixes = {man.fingerprint_prefixes.get(f) for f in files}
        if len(prefixes) > 1:
            problems.append((group, f"the files of {group} disagree on their fingerprint prefix"))
    col.check("FT218", len(groups(listed)))
    for group, problem in problems:
        col.add("FT218", f"{name}: {problem}", checkpoint=name, file=str(d / group))
    return not problems


def check_files(r: CheckpointResult, col: Collector, progress: Progress | None) -> list[FileRow]:
    """Pickle scan of the whole tree, then each listed file against the manifest."""
    d, rows = r.path, list[FileRow]()
    on_disk: dict[str, Path] = {}
    for base, subdirs, files in os.walk(d):
        for name in subdirs + files:
            p = Path(base) / name
            rel = p.relative_to(d).as_posix()
            if p.is_file() and not p.is_symlink():
                col.check("FT209")
                if _is_pickle(p):
                    col.add(
                        "FT209", f"{d.name}/{rel}: pickle data (ftkit never unpickles)", checkpoint=r.name, file=str(p)
                    )
            on_disk[rel] = p
    if r.manifest is None:
        return rows
    listed = r.manifest.files
    col.check("FT205", len(on_disk))
    for rel, p in sorted(on_disk.items()):
        if rel != MANIFEST and rel not in listed and not any(k.startswith(rel + "/") for k in listed):
            kind = "link" if p.is_symlink() else "directory" if p.is_dir() else "file"
            col.add("FT205", f"{d.name}/{rel}: {kind} not listed in the manifest", checkpoint=r.name, file=str(p))
    from ftkit.checkpoint.stfile import digest_files

    readable = {on_disk[f]: f for f in listed if f in on_disk and on_disk[f].is_file() and not on_disk[f].is_symlink()}
    digests: dict[str, FileRecord | InputError] = {}
    todo = [(path, listed[f].tensors is not None) for path, f in readable.items()]
    for path, rec in digest_files(todo, r.manifest.fingerprint_scheme):
        digests[readable[path]] = rec  # all files hashed at once, largest first
        if progress is not None:
            progress(listed[readable[path]].size)
    for fname, entry in listed.items():
        rows.append(_check_file(r, fname, entry, on_disk.get(fname), digests.get(fname), col))
        if progress is not None and fname not in digests:
            progress(entry.size)
    return rows


def _check_file(r: CheckpointResult, fname: str, entry: mf.FileEntry, p: Path | None,
                digest: FileRecord | InputError | None, col: Collector) -> FileRow:  # fmt: skip
    from ftkit.checkpoint.stfile import sha256_file

    before = len(col.findings)
    where = {"checkpoint": r.name, "file": str(r.path / fname)}
    col.check("FT206")
    ntensors = len(entry.tensors or {})
    if p is None or digest is None:
        what = "absent" if p is None else "not a regular file"
        col.add("FT206", f"{r.name}/{fname}: listed in the manifest but {what}", **where)
        return FileRow(r.name, fname, 0, ntensors, "FT206")
    size = p.stat().st_size
    col.check("FT203")
    if size != entry.size:
        col.add("FT203", f"{r.name}/{fname}: {size} bytes, manifest says {entry.size}", **where)
    if entry.tensors is not None:
        col.check("FT207")
    if isinstance(digest, InputError):
        col.add("FT207", f"{r.name}/{fname}: {digest.message}", **where)
        sha = sha256_file(p)
    else:
        sha = digest.sha256
        if entry.tensors is not None:
            _check_tensors(r, fname, entry.tensors, digest.tensors or {}, col)
    col.check("FT204")
    if size == entry.size and sha != entry.sha256:
        col.add("FT204", f"{r.name}/{fname}: sha256 {sha[:16]}... differs from the manifest's", **where)
    if fname == META and sha == entry.sha256:
        _check_meta(r, p, col)
    codes = sorted({f.code for f in col.findings[before:]})
    return FileRow(r.name, fname, size, ntensors, ",".join(codes) or "ok")


def _check_tensors(r: CheckpointResult, fname: str, listed: dict[str, mf.TensorEntry], found: dict[str, Any],
                   col: Collector) -> None:  # fmt: skip
    where = {"checkpoint": r.name, "file": str(r.path / fname)}
    col.check("FT208", len(listed))
    col.check("FT210", len(found))
    for name in sorted(set(listed) ^ set(found)):
        side = "listed but not in the file" if name in listed else "in the file but not listed"
        col.add("FT208", f"{r.name}/{fname}: tensor {name!r} {side}", tensor=name, **where)
    for name in sorted(set(listed) & set(found)):
        want, got = listed[name], found[name]
        if (want.dtype, tuple(want.shape), want.fingerprint) != (got.dtype, got.shape, got.fingerprint):
            col.add(
                "FT208",
                f"{r.name}/{fname}: tensor {name!r} is {got.dtype}{list(got.shape)} fp {got.fingerprint[:12]}, "
                f"manifest says {want.dtype}{want.shape} fp {want.fingerprint[:12]}",
                tensor=name,
                **where,
            )
    for name, got in sorted(found.items()):
        if got.nonfinite:
            col.add("FT210", f"{r.name}/{fname}: tensor {name!r} holds {got.nonfinite} NaN/Inf", tensor=name, **where)


def _check_meta(r: CheckpointResult, p: Path, col: Collector) -> None:
    try:
        meta = load_json(p.read_bytes())
    except ValueError as exc:
        col.add("FT202", f"{r.name}/{META}: not JSON ({exc})", checkpoint=r.name, file=str(p))
        return
    if r.manifest is not None and (not isinstance(meta, dict) or meta.get("step") != r.manifest.step):
        col.add("FT202", f"{r.name}/{META}: step does not match the manifest's", checkpoint=r.name, file=str(p))
        return
    if r.manifest is not None and isinstance(meta, dict) and "ranks" in meta:
        _check_state_groups(r, col)


def _check_state_groups(r: CheckpointResult, col: Collector) -> None:
    """FT218 unless a training state checkpoint (its ``meta.json`` holds the ranks' shard specs,
    as ``ftkit train`` writes it) lists every payload group a resume restores, with the state
    fingerprint's prefixes: a group dropped together with its manifest entry is missing state."""
    from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER, STATE_PREFIXES
    from ftkit.checkpoint.shards import group_of, groups

    man = r.manifest
    assert man is not None
    present = groups(f for f, e in man.files.items() if e.tensors is not None)
    col.check("FT218")
    for group in (MODEL, OPTIMIZER, EXTRA):
        if group not in present:
            col.add(
                "FT218",
                f"{r.name}: payload group {group} is not in the manifest (a training state checkpoint holds "
                f"{MODEL}, {OPTIMIZER} and {EXTRA})",
                checkpoint=r.name,
                file=str(r.path / group),
            )
    prefixes = {group_of(f): p for f, p in man.fingerprint_prefixes.items()}
    if prefixes != STATE_PREFIXES:
        col.add(
            "FT202",
            f"{r.name}: fingerprint prefixes {prefixes} are not a training state's {STATE_PREFIXES}",
            checkpoint=r.name,
            file=str(r.path / MANIFEST),
        )


def _is_pickle(p: Path) -> bool:
    """By name (``.pt``, ``.pkl``, ...) or content: a pickle protocol 2+ opcode or a zip archive.

    ``*.safetensors`` files are not sniffed (their first bytes are a header length, which may
    look like a pickle opcode); the structural reader rejects anything else under that name.
    """
    name = p.name.lower()
    if name.endswith(_PICKLE_SUFFIXES):
        return True
    if name.endswith(".safetensors"):
        return False
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == _ZIP_MAGIC
