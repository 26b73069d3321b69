"""Preflight: each rank's typed go / no-go before anything is serialised, and their agreement.

Every rank of every live cell runs ``preflight`` at a publication boundary with its own guard
verdict; the caller gathers the verdicts (no collective touches tensors yet) and ``agree``
decides for everyone: one failing rank means no rank serialises and the publication is
rejected with the reasons. Nothing here blocks, so nobody can hang on a failed peer.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.layout import step_name

Hook = Callable[[str], "str | None"]  # fault point -> injected kind (or None)
SPACE_MARGIN = 1.02  # free space asked for: the payload (``Payload.nbytes``, which counts
SPACE_SLACK = 64 << 10  # headers and manifest entries) times the margin, plus the slack


class InjectedFault(RuntimeError):
    """An armed fault point returned a kind the publisher cannot apply there."""


def fire(at: Hook | None, point: str) -> str | None:
    """Run the fault hook for ``point``: ``enospc`` raises ``OSError(ENOSPC)``; ``preflight-fail``
    is returned (only meaningful at ``publish_preflight``); other kinds raise ``InjectedFault``.

    Kinds that act by themselves (a ``sigkill`` kills the process inside the hook) never return.
    """
    kind = at(point) if at is not None else None
    if kind is None:
        return None
    if kind == "enospc":
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected at {point})")
    if kind == "preflight-fail" and point == "publish_preflight":
        return kind
    raise InjectedFault(f"fault kind {kind!r} cannot be injected at {point}")


@dataclass(frozen=True)
class PreflightVerdict:
    """One rank's (or, from ``agree``, everyone's) go / no-go; ``reasons`` say why not."""

    ok: bool
    who: str
    reasons: tuple[str, ...] = field(default_factory=tuple)
    free_bytes: int | None = None

    @property
    def reason(self) -> str:
        """The reasons as one line (empty when ok)."""
        return "; ".join(self.reasons)


def preflight(
    checkpoints: Path,
    step: int,
    payload_bytes: int,
    guard: GuardVerdict,
    who: str,
    at: Hook | None = None,
) -> PreflightVerdict:
    """One rank's checks for publishing ``step``: guard clean, room for the payload, target free.

    ``payload_bytes`` is the size of what will be written (``Payload.nbytes``); the
    free space asked for is ``payload_bytes * SPACE_MARGIN + SPACE_SLACK`` on the file system
    of ``checkpoints`` (the staging directory is created inside it, so the final rename never
    crosses file systems). Never raises for an ``OSError``: that is a failed verdict.
    """
    reasons: list[str] = []
    free: int | None = None
    try:
        if fire(at, "publish_preflight") == "preflight-fail":
            reasons.append("preflight failure injected")
        if guard.tainted:
            reasons.append(
                f"guard: {guard.count} non-finite observation(s) in steps [{guard.from_step}, {guard.to_step}]"
                + (f" ({guard.reasons[0]})" if guard.reasons else "")
            )
        if guard.to_step != step:
            reasons.append(f"guard interval ends at step {guard.to_step}, not at the checkpoint's step {step}")
        checkpoints.mkdir(parents=True, exist_ok=True)
        if not os.access(checkpoints, os.W_OK | os.X_OK):
            reasons.append(f"{checkpoints} is not writable")
        target = checkpoints / step_name(step)
        if target.exists() or target.is_symlink():
            reasons.append(f"{target} exists already")
        free = shutil.disk_usage(checkpoints).free
        need = int(payload_bytes * SPACE_MARGIN) + SPACE_SLACK
        if free < need:
            reasons.append(f"not enough free space in {checkpoints}: {free} bytes free, {need} needed")
    except OSError as exc:
        reasons.append(f"preflight I/O error: {exc}")
    return PreflightVerdict(ok=not reasons, who=who, reasons=tuple(f"{who}: {r}" for r in reasons), free_bytes=free)


def agree(verdicts: Iterable[PreflightVerdict]) -> PreflightVerdict:
    """Everyone's decision: ok only when every verdict is ok (and there is at least one)."""
    items = list(verdicts)
    if not items:
        return PreflightVerdict(ok=False, who="all", reasons=("no preflight verdicts",))
    reasons = tuple(r for v in items if not v.ok for r in (v.reasons or (f"{v.who}: failed",)))
    frees = [v.free_bytes for v in items if v.free_bytes is not None]
    return PreflightVerdict(ok=not reasons, who="all", reasons=reasons, free_bytes=min(frees) if frees else None)
