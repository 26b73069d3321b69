"""How a training run ends: the two non-bug failures and the status file for other tools.

* ``RunFailed`` (exit 1): the run could not go on (fewer live cells than ``--min-cells``, a
  step failed more than ``--max-retries`` times, no cell left to export or save from, Ray
  itself lost what the run needs: ``ray_failure``);
* ``RunInterrupted`` (exit 128 + signal: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP): the user
  stopped it, or the terminal it ran in went away.

Both are ``FtkitError``s: the CLI prints one ``Error:`` line and a hint, never a traceback and
never "bug". Whatever the end, the driver writes ``<run_dir>/status.json`` last
(``write_status``): ``{"status": "completed" | "failed" | "interrupted", "reason": str | null,
"exit_code": int | null, "steps_committed": int, "steps_total": int, "finished": unix seconds}``
(``exit_code`` is that of ``ftkit train`` when the driver knows it: 1 for ``RunFailed``, 2
for a configuration problem found while starting, 3 for a bug, 130 / 143 / 129 when interrupted;
``null`` for completed, whose exit code the analyzer's verdict decides).
The same status and reason end the event log (``run_finished``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ftkit.errors import FtkitError

if TYPE_CHECKING:
    from ftkit.evidence.emit import RunStatus

STATUS_FILE = "status.json"


class RunFailed(FtkitError):
    """The run stopped because it could not go on (exit 1); ``message`` says why."""

    exit_code = 1


class RunInterrupted(FtkitError):
    """SIGINT / SIGTERM / SIGHUP stopped the run (exit 128 + the signal number)."""

    def __init__(self, signum: int, started: bool = True, ended: str | None = None) -> None:
        """``started``: the run directory and its log exist (False: stopped while Ray started);
        ``ended``: the run had already ended so (its ``run_finished`` and ``status.json`` written)
        when the signal came, during Ray's shutdown or the analysis (``verdict_after_end``)."""
        name = signal.Signals(signum).name
        if ended is not None:
            message = (
                f"interrupted by {name} after the run ended: its log ends with run_finished '{ended}' "
                "(status.json too); the verdict was not computed"
            )
            hint = "get the verdict with `ftkit analyze RUN_DIR`"
        elif started:
            message = f"interrupted by {name}: the run stopped, its log ends with run_finished 'interrupted'"
            hint = "continue it with `ftkit train --resume RUN_DIR`, or train again with --overwrite"
        else:
            message = f"interrupted by {name} while Ray was starting: nothing was written"
            hint = "run the same command again"
        super().__init__(message, hint=hint)
        self.signum = signum
        self.exit_code = 128 + signum


def interruption(exc: BaseException) -> RunInterrupted | None:
    """The ``RunInterrupted`` behind ``exc``: ``exc`` itself, or the exception it was raised
    from or during. A signal that lands while a C extension runs comes out wrapped: inside Ray's
    Cython ``CoreWorker.wait`` the handler's exception surfaces as a ``SystemError`` ("returned a
    result with an exception set") whose ``__cause__`` it is; Ray's deserialiser wraps it in a
    ``RaySystemError`` that keeps no link to it, so a recorded signal (``pending_interruption``)
    counts too."""
    return _in_chain(exc) or pending_interruption()


def _in_chain(exc: BaseException | None) -> RunInterrupted | None:
    """The ``RunInterrupted`` that ``exc`` is, or was raised from or during, else ``None``."""
    seen: set[int] = set()
    cur = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RunInterrupted):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


class _QuietInterruptions(logging.Filter):
    """Drops a log record of an exception raised from or during a ``RunInterrupted``: Ray's
    deserialiser logs, with its traceback, any exception raised while it runs, the signal
    handler's too; the run reports the interruption itself, in its one ``Error:`` line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _in_chain(record.exc_info[1] if record.exc_info else None) is None


#: The loggers that log an exception the signal handler raised inside them.
_RAISED_INSIDE = ("ray._private.serialization",)


def ray_failure(exc: BaseException) -> RunFailed | None:
    """A ``RunFailed`` for a failure of Ray itself that reached the driver: a Ray system error
    (a placement group removed, an object lost, a node or the local raylet gone) is the
    cluster losing what the run needs, not a bug in ftkit. An exception raised by ftkit's own
    code inside an actor (``RayTaskError``) is not one; neither is anything that is not Ray's."""
    import ray

    if not isinstance(exc, ray.exceptions.RayError) or isinstance(exc, ray.exceptions.RayTaskError):
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return RunFailed(
        f"Ray failed under the run: {type(exc).__name__}: {lines[0][:300] if lines else 'no detail'}",
        hint="check the cluster (`ray status`, a node or raylet that died); "
        "then continue with `ftkit train --resume RUN_DIR`",
    )


def write_status(
    run_dir: Path, status: str, reason: str | None, exit_code: int | None, steps_committed: int, steps_total: int
) -> None:
    """Write ``status.json`` atomically (see the module docstring)."""
    from ftkit.fsutil import fsync_dir

    doc = {
        "status": status,
        "reason": reason,
        "exit_code": exit_code,
        "steps_committed": steps_committed,
        "steps_total": steps_total,
        "finished": time.time(),
    }
    tmp = run_dir / f".{STATUS_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / STATUS_FILE)
    fsync_dir(run_dir)


class _Signals:
    """What ``signals_interrupt`` has received in this process: the first signal (later ones are
    ignored, so the cleanup finishes) and whether raising is deferred (``signals_deferred``)."""

    fired: int | None = None
    deferring: int = 0


def pending_interruption() -> RunInterrupted | None:
    """The interruption a signal received inside ``signals_interrupt`` asked for, or ``None``.

    A signal's ``RunInterrupted`` is raised wherever the main thread happens to be, and code
    that is not ftkit's may swallow or wrap it: Ray deserialising a checkpoint turns it into a
    ``RaySystemError``, which reads like a dead cell. So the signal is also recorded here, and
    every place that would take an exception for a failure (a cell or engine declared failed,
    the driver's last handler) and every step boundary asks first: a signal is never swallowed
    and never becomes a cell failure."""
    return RunInterrupted(_Signals.fired) if _Signals.fired is not None else None


def raise_if_interrupted() -> None:
    """Raise the pending interruption, if a signal was received (``pending_interruption``)."""
    stop = pending_interruption()
    if stop is not None:
        raise stop


@contextlib.contextmanager
def signals_deferred(raise_after: bool = True) -> Iterator[None]:
    """Inside the block a signal is only recorded; it is raised when the block ends (unless
    ``raise_after`` is false: the caller asks ``pending_interruption`` itself). For code that
    must not be cut half-way by a Python exception: the record of how a run ended (``end_run``).
    Nests; a no-op outside ``signals_interrupt``."""
    _Signals.deferring += 1
    try:
        yield
    finally:
        _Signals.deferring -= 1
    if raise_after and not _Signals.deferring:
        raise_if_interrupted()


def end_run(
    status: RunStatus,
    reason: str | None,
    code: int | None,
    shutdown: Callable[[bool], None],
    record: Callable[[RunStatus, str | None, int | None], None],
) -> tuple[RunStatus, str | None, int | None]:
    """Stop the run's actors (``shutdown(interrupted)``) and record how the run ended
    (``record(status, reason, code)``: ``run_finished`` and ``status.json``); returns the end as
    recorded. A signal that comes before the record is written makes the end ``interrupted``
    (exit 128 + the signal), whatever it was to be: the shutdown it cut goes on briefly
    (``shutdown(True)``); the caller raises ``pending_interruption`` when the end it returns is
    not the one it passed. The record itself is written with signals only recorded, so a log
    and a status file always say the same; a signal from then on is ``verdict_after_end``'s."""
    try:
        shutdown(status == "interrupted")
    except BaseException as exc:
        if interruption(exc) is None:
            raise
        with signals_deferred(raise_after=False):
            shutdown(True)
    stop = pending_interruption()
    if stop is not None and status != "interrupted":
        status, reason, code = "interrupted", stop.message.split(":")[0], stop.exit_code
    with signals_deferred(raise_after=False):
        record(status, reason, code)
    return status, reason, code


def verdict_after_end(analyze: Callable[[], Any], status: str, rewrite: Callable[[int], None]) -> Any:
    """``analyze()`` (the verdict over the run's log), run once the end was recorded as ``status``.
    A signal since then (during Ray's shutdown or the analysis) is a ``RunInterrupted`` whose
    message says the log ends with that status, and ``rewrite(exit_code)`` puts its exit code in
    ``status.json``: the file, the log, the message and the exit code agree."""
    try:
        raise_if_interrupted()
        return analyze()
    except BaseException as exc:
        stop = interruption(exc)
        if stop is None:
            raise
        late = RunInterrupted(stop.signum, ended=status)
        with signals_deferred(raise_after=False):
            rewrite(late.exit_code)
        raise late from None


@contextlib.contextmanager
def signals_interrupt() -> Iterator[Callable[[], None]]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session: by default
    it would kill the driver at once and orphan the local Ray's processes) raise
    ``RunInterrupted`` in the main thread (once:
    a second signal during the cleanup is ignored, so the cleanup finishes) and are recorded
    (``pending_interruption``; inside ``signals_deferred`` they are only recorded). The block gets
    ``arm()``, which installs the handlers again: call it after anything that installs its
    own (``ray.init`` sets a SIGTERM handler that exits). The previous handlers come back
    afterwards. Ray's deserialiser logs an exception raised inside it with its traceback: inside
    the block, that log of the handler's ``RunInterrupted`` is dropped (``_QuietInterruptions``),
    so an interrupted run prints its ``Error:`` line and no traceback. Outside the main thread
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    _Signals.fired, _Signals.deferring = None, 0

    def handler(signum: int, frame: FrameType | None) -> None:
        if _Signals.fired is not None:
            return
        _Signals.fired = signum
        if not _Signals.deferring:
            raise RunInterrupted(signum)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in signals}
    quiet = _QuietInterruptions()

    def arm() -> None:
        for s in signals:
            signal.signal(s, handler)

    arm()
    for name in _RAISED_INSIDE:
        logging.getLogger(name).addFilter(quiet)
    try:
        yield arm
    finally:
        for name in _RAISED_INSIDE:
            logging.getLogger(name).removeFilter(quiet)
        for s, h in previous.items():
            signal.signal(s, h)
        _Signals.fired, _Signals.deferring = None, 0
