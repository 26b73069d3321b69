"""Experiment tracking for ``ftkit train --report-to``: the run's metrics and config, also in
TensorBoard, Weights & Biases or MLflow (docs/tracking.md).

The event log stays the record of truth, and it is also the trackers' only source: a
``TrackingFeed`` reads the driver's ``metric`` events back from the run's ``events/``
(``ftkit.report.live_tail.EventTail``) whenever the driver calls back (every committed step,
every cell-state change) and once more at the end, and hands each tracker the values exactly as
logged. So the trackers see what ``analyze-events`` sees, and nothing in the training loop
knows they exist: they only read.

Names and step axis (``scalars_of``): a step's ``metric`` (``step`` set) goes to
``train/<name>`` (loss, grad_norm, tokens_per_s, the RL metrics ...) and its phases to
``time/<phase>`` (seconds), at the run-global step; a rollout's ``metric`` (``step`` null:
reward, the rollout statistics, eval_reward) goes to ``rollout/<name>`` at the rollout's first
step (``rollout * steps_per_rollout``), with ``rollout/index`` = the rollout. Null values and the
per-micro-shard seconds (a list) are left out.

Failures never reach the training: a tracker that cannot be imported is exit 2 before Ray
starts (``check_report_to``, with the ``pip install`` hint of its extra); a tracker that raises
while the run goes on is reported once (``on_warning``) and dropped for the rest of the run,
the training and its log unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ftkit.integrations.trackers import BACKENDS, EXTRA, import_backend


class Tracker(Protocol):
    """One backend (``ftkit.integrations.trackers``): started once the run directory exists."""

    name: str

    def start(self, config: Mapping[str, Any], first_step: int, resumed: bool) -> None:
        """Open the backend's run (``first_step``: the step of the first metric this process logs)
        and record the run's config (run.json's ``config``)."""

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Record ``scalars`` at ``step``."""

    def flush(self) -> None:
        """Make what was logged durable (called after every batch of metrics)."""

    def close(self) -> None:
        """End the backend's run."""


def check_report_to(names: Iterable[str]) -> None:
    """``InstallError`` (exit 2, the ``pip install`` hint of the tracker's extra) unless every
    tracker named can be imported; called by ``ftkit train`` before Ray starts."""
    from ftkit.extras import require

    for name in names:
        require(EXTRA[name], f"--report-to {name}")
        import_backend(name)


def scalars_of(event: Mapping[str, Any], steps_per_rollout: int) -> tuple[int, dict[str, float]] | None:
    """The step and the named scalars of one ``metric`` event (module docstring); ``None`` for
    an event that carries neither a rollout nor a step."""
    step, rollout = event.get("step"), event.get("rollout")
    values = event.get("values") or {}
    out: dict[str, float] = {}
    if type(step) is int:
        prefix = "train/"
        for phase, seconds in dict(event.get("phases") or {}).items():
            if _number(seconds):
                out[f"time/{phase}"] = float(seconds)
        if _number(event.get("wall_seconds")):
            out["time/wall_seconds"] = float(event["wall_seconds"])
    elif type(rollout) is int:
        step, prefix = rollout * steps_per_rollout, "rollout/"
        out["rollout/index"] = float(rollout)
    else:
        return None
    for name, value in dict(values).items():
        if _number(value):
            out[prefix + str(name)] = float(value)
    return step, out


def _log(tracker: Tracker, scalars: Mapping[str, float], step: int) -> None:
    tracker.log(scalars, step)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TrackingFeed:
    """The driver's ``metric`` events of ``run_dir/events`` to ``trackers`` (module docstring).
    Make it before the run starts (a resumed run's earlier sessions, already in the log, are
    not logged again); call ``poll()`` from the driver's callbacks and ``close()`` at the end,
    whatever the outcome. Never raises."""

    def __init__(
        self,
        trackers: list[Tracker],
        run_dir: Path,
        steps_per_rollout: int,
        resumed: bool = False,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        from ftkit.report.live_tail import EventTail

        self.trackers, self.run_dir = list(trackers), Path(run_dir)
        self.steps_per_rollout, self.resumed = steps_per_rollout, resumed
        self.on_warning = on_warning or (lambda message: None)
        self.tail = EventTail(self.run_dir / "events", wanted=frozenset({"metric"}))
        if not resumed:  # a new run's log is all its own (--overwrite replaces the files it saw)
            self.tail.seen.clear()
        self.started = False
        self.logged = 0  # metric events handed on

    def poll(self) -> None:
        """Hand the trackers the driver's ``metric`` events logged since the last poll."""
        if not self.trackers:
            return
        try:
            batch = [
                found
                for event in self.tail.poll()
                if dict(event.get("source") or {}).get("role") == "driver"
                and (found := scalars_of(event, self.steps_per_rollout)) is not None
            ]
        except Exception:  # noqa: BLE001 - the feed never raises into training
            return
        if not batch:
            return
        if not self.started:
            self.started = True
            config = self._config()
            self._each("start", lambda t: t.start(config, batch[0][0], self.resumed))
        for step, scalars in batch:
            self._each("log", partial(_log, scalars=scalars, step=step))
            self.logged += 1
        self._each("flush", lambda t: t.flush())

    def close(self) -> None:
        """The last metrics (a run's end logs some after its last step), then end every tracker."""
        for _ in range(1000):  # EventTail reads at most 1 MiB per file and poll
            before = self.logged
            self.poll()
            if self.logged == before:
                break
        if self.started:
            self._each("close", lambda t: t.close())
        self.trackers = []

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001 - a tracker never fails the run
                self.trackers.remove(tracker)
                reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
                self.on_warning(
                    f"--report-to {tracker.name}: the tracker failed ({what}: {reason}); it gets nothing more "
                    f"in this run, the training goes on and the event log keeps every metric"
                )

    def _config(self) -> dict[str, Any]:
        """The run's config as run.json records it (``{}`` when it cannot be read)."""
        try:
            doc = json.loads((self.run_dir / "run.json").read_text())
            config = doc.get("config")
            return dict(config) if isinstance(config, dict) else {}
        except (OSError, ValueError):
            return {}


def open_trackers(names: Iterable[str], run_dir: Path) -> list[Tracker]:
    """One tracker per name (``ftkit.integrations.trackers.BACKENDS``), writing under ``run_dir``."""
    return [BACKENDS[name](Path(run_dir)) for name in names]
