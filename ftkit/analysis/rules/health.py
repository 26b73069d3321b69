"""Numerical health and checkpoint trust (invariant I4): FT109 non-finite metric, FT110 checkpoint."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

from ftkit.analysis.registry import Rule, register
from ftkit.findings import Severity
from ftkit.tensors.untrusted import NotRegular, read_regular

_isfinite = math.isfinite


@register
class NonfiniteMetric(Rule):
    code = "FT109"
    name = "nonfinite-metric"
    description = "a metric (loss, grad norm, reward, ...) is NaN or infinite (null: a warning)"
    fix = "the training diverged or a reduction overflowed; the guard must discard such steps"
    events = ("metric",)

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        values = ev["values"]
        self.checked += len(values)
        for name, v in values.items():
            if v is None:
                self.report(
                    f"metric {name} is null at step {ev['step']} (rollout {ev['rollout']})",
                    Severity.warning,
                    metric=name,
                    step=ev["step"],
                    rollout=ev["rollout"],
                    where=self.replay.where(fi, line),
                )
            elif not _isfinite(v):
                self.report(
                    f"metric {name} = {v} at step {ev['step']} (rollout {ev['rollout']})",
                    metric=name,
                    step=ev["step"],
                    rollout=ev["rollout"],
                    where=self.replay.where(fi, line),
                )


@register
class CheckpointUntrusted(Rule):
    code = "FT110"
    name = "checkpoint-untrusted"
    description = (
        "a checkpoint was published although a grad_nonfinite or a non-finite metric falls in its "
        "guard interval, its metric is non-finite, or its guard interval stops short of its step; "
        "for a log in a run directory, a published checkpoint still there whose MANIFEST.json is not "
        "the one the publication logged (manifest_sha256)"
    )
    fix = "the non-finite guard must veto publication for the whole interval since the previous checkpoint"
    events = ("metric", "grad_nonfinite", "checkpoint_published")

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.bad: dict[int, str] = {}
        self.published: list[tuple[dict[str, Any], tuple[str, int]]] = []

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        t = ev["type"]
        if t == "metric":
            if ev["step"] is not None:
                for name, v in ev["values"].items():
                    if v is not None and not _isfinite(v):
                        self.bad.setdefault(ev["step"], f"metric {name}={v}")
        elif t == "grad_nonfinite":
            self.bad.setdefault(ev["step"], f"grad_nonfinite on cell {ev['cell']} rank {ev['rank']} ({ev['where']})")
        else:
            self.published.append((ev, self.replay.where(fi, line)))

    def finish(self) -> None:
        bad_steps = sorted(self.bad)
        latest = {Path(ev["path"]).name: (ev, where) for ev, where in self.published}  # later sessions win
        for ev, where in latest.values():
            self.check()
            problem = _manifest_problem(ev, where)
            if problem is not None:
                self.report(f"checkpoint {ev['kind']} at step {ev['step']}: {problem}", step=ev["step"], where=where)
        for ev, where in self.published:
            self.check()
            lo, hi = ev["guard_from_step"], ev["guard_to_step"]
            inside = [s for s in bad_steps if lo <= s <= hi]
            base = f"checkpoint {ev['kind']} at step {ev['step']} ({ev['path']})"
            if inside:
                self.report(
                    f"{base} published although its guard interval [{lo}, {hi}] holds non-finite step(s) "
                    f"{inside[:5]}: {self.bad[inside[0]]}",
                    step=ev["step"],
                    kind=ev["kind"],
                    bad_steps=inside[:20],
                    where=where,
                )
            if ev["metric"] is not None and not _isfinite(ev["metric"]):
                self.report(f"{base} published with metric {ev['metric']}", step=ev["step"], where=where)
            if hi < ev["step"]:
                self.report(
                    f"{base}: guard interval [{lo}, {hi}] stops before the checkpoint's step",
                    Severity.warning,
                    step=ev["step"],
                    where=where,
                )


def _manifest_problem(ev: dict[str, Any], where: tuple[str, int]) -> str | None:
    """What is wrong with the manifest of a ``checkpoint_published`` when the log lies in a run
    directory (``RUN/events/``) whose ``checkpoints/`` still holds the checkpoint: its
    ``MANIFEST.json`` is not a regular file, or its sha256 is not the logged ``manifest_sha256``.
    None when it agrees or cannot be looked at (a log elsewhere, a checkpoint retention dropped)."""
    log = Path(where[0]).parent
    name = Path(ev["path"]).name
    if log.name != "events" or name in ("", ".", "..") or name.startswith("."):
        return None
    manifest = log.parent / "checkpoints" / name / "MANIFEST.json"
    if not os.path.lexists(manifest):
        return None
    try:
        sha = hashlib.sha256(read_regular(manifest)).hexdigest()
    except NotRegular as exc:
        return f"{name}/{exc}"
    except OSError as exc:
        return f"{name}/MANIFEST.json is unreadable ({exc.strerror or exc})"
    if sha != ev["manifest_sha256"]:
        return (
            f"the log says {name}/MANIFEST.json has sha256 {ev['manifest_sha256'][:16]}..., "
            f"the one in {log.parent / 'checkpoints'} has {sha[:16]}..."
        )
    return None
