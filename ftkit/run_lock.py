"""One ``ftkit train`` per run directory: a lock that its owner holds while it trains.

``hold_run_dir(out)`` (a context manager around the whole of ``run_training``) takes an
exclusive ``flock`` on ``<parent>/.<name>.ftkit-lock``, next to the run directory rather than
inside it, so one lock covers a new run, an ``--overwrite`` that would delete the directory and
a ``--resume`` that appends to it. The kernel drops a ``flock`` when its owner's last descriptor
closes, so a killed process (SIGKILL, power loss of the process) can never leave it stuck, and
the descriptor is close-on-exec, so the processes a run starts (Ray, spawned ranks) do not keep
it alive. While the lock is held the file names its owner (pid, host, start time); a second
process asking for it gets ``UsageError`` (exit 2) naming that owner, whether it is still
running (checked when it is on this host) and how to stop it.

``flock`` is per host: on a file system shared by several hosts (NFS) it protects only where
the file system propagates it. Where the lock file cannot be created (a parent that does not
exist yet or is not writable, a name too long), the caller goes on unlocked: nothing is created
before the run directory checks, which refuse an unusable ``--out`` with their own message (a
new run in a parent that does not exist yet is the one case left unlocked).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ftkit.errors import UsageError
from ftkit.fsutil import pid_alive


def lock_path(out: Path) -> Path:
    """The lock file of run directory ``out``: ``<parent>/.<name>.ftkit-lock``."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}.ftkit-lock"


@contextlib.contextmanager
def hold_run_dir(out: Path) -> Iterator[None]:
    """Hold the lock of run directory ``out`` for the duration (see the module docstring);
    ``UsageError`` at entry when another process holds it."""
    path = lock_path(out)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError:
        yield  # an unusable place: the run directory checks refuse it with their own message
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise _held(out, path, fd) from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (the file stays: removing it would race a waiting taker)


def _held(out: Path, path: Path, fd: int) -> UsageError:
    """The error for a lock held by another process, naming the owner its file records."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        owner = {}
    pid, host = owner.get("pid"), owner.get("host")
    since = owner.get("since")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else ""
    state = ""
    if isinstance(pid, int) and host == socket.gethostname():
        state = ", running" if pid_alive(pid) else ", not running (a process it started still holds the lock)"
    return UsageError(
        f"{out} is being trained by another ftkit train (pid {pid} on {host}{when}{state})",
        hint=f"wait for it to end, or stop it (kill {pid} on {host}); the lock ({path}) is released when it exits",
    )
    return True
