"""A process that must not run the interpreter's normal exit: a part that left a C extension in a
state its own exit handlers cannot survive (Ray whose GCS is gone: ``ray.shutdown`` waits on it
for a minute and its client crashes at interpreter exit) asks for a hard exit here; the console
entry point then flushes stdout and stderr and ends with ``os._exit`` and the same exit code."""

from __future__ import annotations

import contextlib
import os
import sys

_requested = False


def request() -> None:
    """Ask the entry point to end this process with ``os._exit`` (see the module doc)."""
    global _requested
    _requested = True


def exit_now_if_requested(code: int) -> None:
    """``os._exit(code)`` after flushing the standard streams, if a hard exit was requested."""
    if not _requested:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
