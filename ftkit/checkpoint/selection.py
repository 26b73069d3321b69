"""Which checkpoint a run resumes from: the newest one ``ftkit verify-checkpoint RUN`` accepts.

``newest_trusted(checkpoints, on_warning, accept, events)`` is what ``--resume`` (and a run that
lost every cell) does before anything loads a checkpoint:

1. ``reconcile`` the directory through its journal (``ftkit.checkpoint.journal``);
2. verify the run once, exactly as ``verify-checkpoint RUN`` does (``verify_path`` of the run
   directory with its event log; ``events=False``: of ``checkpoints/`` alone, without the log):
   every checkpoint's files and manifest, the retention record of each (its manifest sha256:
   a checkpoint that verifies alone but was edited or copied in since it was recorded fails
   here), ``latest``, the journal, and against the log the committed fingerprints, the
   non-finite evidence and the ``checkpoint_published`` manifest sha256;
3. walk the records newest first: a checkpoint with an error finding naming it is skipped
   (``on_warning`` hears the first finding), so is one ``accept`` refuses (the caller's own
   test, e.g. the run's result-determining config); the first one left wins.

``published_in_log(events)`` lists the checkpoints the run's log records as published, so a
resume that finds none of them left (``checkpoints/`` deleted) says so instead of silently
training again from the seed.

Findings that name no checkpoint (a retention policy not followed, ...) do not make any one
checkpoint untrustworthy; they are passed to ``on_warning`` once. Nothing is loaded here:
``ftkit.checkpoint.restore.load(path, verified=True)`` reads the winner without hashing it again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ftkit.errors import InputError

if TYPE_CHECKING:
    from ftkit.checkpoint.results import VerifyResult

Accept = Callable[[Path], "str | None"]  # a checkpoint -> why it must not be used, or None


def newest_trusted(
    checkpoints: Path,
    on_warning: Callable[[str], None] | None = None,
    accept: Accept | None = None,
    events: bool = True,
) -> Path | None:
    """The newest recorded checkpoint of ``checkpoints`` that passes the run's verification and
    ``accept`` (see the module docstring); None when there is none. ``ValueError`` when the
    journal or the records are unreadable (reconcile refuses to guess), or when ``events`` is
    set and the run (``checkpoints/..``) has no event log to cross-check them with."""
    from ftkit.checkpoint.journal import reconcile
    from ftkit.checkpoint.retention import load_records
    from ftkit.checkpoint.verify import verify_path

    warn = on_warning or (lambda message: None)
    rep = reconcile(checkpoints)
    if rep.rolled:
        warn(f"{checkpoints}: rolled an interrupted retention transaction {rep.rolled}")
    for name in rep.removed_unrecorded:
        warn(f"{checkpoints}: removed {name}, which was never published")
    records, _ = load_records(checkpoints)
    if not records:
        return None
    try:
        result = verify_path(checkpoints.parent if events else checkpoints, events=events)
    except InputError as exc:
        raise ValueError(f"the checkpoints cannot be verified: {exc.message}") from None
    untrusted, general = error_findings(result)
    if general:
        more = f" (and {len(general) - 1} more)" if len(general) > 1 else ""
        warn(f"verify-checkpoint finds in {checkpoints}: {general[0]}{more}")
    for rec in sorted(records, key=lambda r: r.step, reverse=True):
        path = checkpoints / rec.name
        why = untrusted.get(rec.name)
        if why is None and accept is not None:
            why = accept(path)
        if why is None:
            return path
        warn(f"{rec.name} does not verify ({why}); trying an older checkpoint")
    return None


def error_findings(result: VerifyResult) -> tuple[dict[str, str], list[str]]:
    """``(untrusted, general)`` of a verification: ``{checkpoint name: "FTnnn: message"}`` of the
    first error finding naming each checkpoint, and the error findings that name none."""
    untrusted: dict[str, str] = {}
    general: list[str] = []
    for f in result.findings:
        if f.severity.value != "error":
            continue
        name = f.evidence.get("checkpoint")
        if name is None:
            general.append(f"{f.code}: {f.message}")
        else:
            untrusted.setdefault(str(name), f"{f.code}: {f.message}")
    return untrusted, general


def published_in_log(events: Path) -> list[str]:
    """Names of the checkpoints the drivers' logs in ``events`` record as published
    (``checkpoint_published``), in log order, each once; torn or foreign lines are skipped."""
    from ftkit.events.driver_log import driver_events

    names: dict[str, None] = {}
    for ev in driver_events(events, "checkpoint_published"):
        if isinstance(ev.get("path"), str):
            names[Path(ev["path"]).name] = None
    return list(names)
