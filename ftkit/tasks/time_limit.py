"""A wall-clock limit on a Python call made in the main thread: ``call_within(seconds, fn)``.

A Python call that never returns cannot be stopped from another thread, so the limit is a
signal: ``setitimer(ITIMER_REAL)`` delivers SIGALRM to the process, and its handler (run by
the interpreter in the main thread, between two bytecodes or when a blocking system call such as
``time.sleep`` or a socket read is interrupted) raises ``TimeLimitExceeded`` inside the call.
It is a ``BaseException``, so a plug-in's ``except Exception`` does not swallow it; one that
swallows it anyway (a bare ``except:`` in a retry loop) is hit again every ``REFIRE_S`` seconds,
with a trace function set on its frames that raises it again at the next line it runs, so the
handler that swallowed it cannot (tracing ends with the call: a debugger's or coverage's trace
function is put back). A call that returns after the
limit fired, or raises its own exception instead, counts as timed out all the same (ftkit's own
errors, such as a signal's interruption, pass through). The call runs where it ran before, in the same
thread and process, so what it computes is unchanged; the cost is four system calls per call.

The handler and the timer are installed for the call only and the previous ones restored after
(a caller's own SIGALRM handler, a timer that was running: its remaining time, less the call's).
A call that sets its own SIGALRM timer inside (``signal.alarm``, as some grading libraries do)
replaces this limit with its own for as long as it runs. Beyond reach: code stuck inside a C
extension that never returns to the interpreter (Ctrl-C cannot stop it either). Outside the main
thread (a library caller's thread) signals cannot be used and the call runs without a limit.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from ftkit.errors import FtkitError

T = TypeVar("T")
#: Seconds between repeated SIGALRMs once the limit has passed (for a call that swallows the first).
REFIRE_S = 1.0


class TimeLimitExceeded(BaseException):
    """The call ran past its limit (``seconds``). A ``BaseException``: it is not the call's failure
    to handle, and an ``except Exception`` in the call does not swallow it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not return within {seconds:g} s")
        self.seconds = seconds


def enforced() -> bool:
    """Whether ``call_within`` enforces its limit here (only the main thread can take signals)."""
    return threading.current_thread() is threading.main_thread()


def call_within(seconds: float | None, fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)``; ``TimeLimitExceeded`` when it has not returned after ``seconds``
    (``None``: no limit; outside the main thread: no limit, see the module docstring). What ``fn``
    raises or returns passes through unchanged."""
    if seconds is None or not enforced():
        return fn(**kwargs)
    fired = False
    armed = True
    here = sys._getframe()
    tracing: list[Any] = []  # the trace function that was set before, once the call is traced

    def raise_on_line(frame: FrameType, event: str, arg: Any) -> Any:
        if not armed:
            return None
        if event in ("line", "call"):  # not "exception": that is ours, on its way into the handler
            raise TimeLimitExceeded(seconds)
        return raise_on_line

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not armed:
            return
        exc = TimeLimitExceeded(seconds)  # built first: with tracing on, its __init__ call would raise
        if fired:  # it swallowed the last one: its next line raises, even in a handler
            if not tracing:
                tracing.append(sys.gettrace())
            _trace_frames(frame, here, raise_on_line)
        fired = True
        raise exc

    previous = signal.signal(signal.SIGALRM, on_alarm)
    started, outer = time.monotonic(), 0.0
    try:
        outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds, REFIRE_S)
        out = fn(**kwargs)
    except Exception as exc:  # raised while it overran (it turned our exception into its own): too late
        if fired and not isinstance(exc, FtkitError):
            raise TimeLimitExceeded(seconds) from exc
        raise
    finally:
        armed = False  # a SIGALRM from here on is ignored
        if tracing:
            sys.settrace(tracing[0])
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if outer > 0:  # someone's timer was running: it goes on with what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-6))
    if fired:  # the call swallowed the exception and returned: still too late
        raise TimeLimitExceeded(seconds)
    return out


def _trace_frames(frame: FrameType | None, stop: FrameType, tracer: Any) -> None:
    """Trace the frames from ``frame`` out to ``stop`` (excluded) and every frame started from now
    on with ``tracer``."""
    while frame is not None and frame is not stop:
        frame.f_trace = tracer
        frame = frame.f_back
    sys.settrace(tracer)
