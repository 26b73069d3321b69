"""Durable file-system operations shared by every writer (events, safetensors, dumps, reports)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_MARK = ".tmp-"


def temp_path(target: Path) -> Path:
    """A hidden temp name next to ``target`` that records the writing host and pid."""
    host = socket.gethostname().replace("-", "_") or "host"
    return target.with_name(f".{target.name}{TMP_MARK}{host}-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so that a create or rename inside it is durable.

    A no-op where the platform cannot open or fsync a directory.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file for an output the user named (a report, a merged log), published when the
    block ends without an exception:

    - a regular file or a new name: a temporary file beside it, fsynced and renamed over it at
      the end (a reader never sees half of it; on an exception it is removed and the old file
      stays); through a symbolic link, the file the link leads to (the link stays a link);
    - anything else that exists (``/dev/stdout``, ``/dev/null``, a FIFO, a terminal): opened and
      written in place, never renamed over (that would replace the device for every later
      process).
    """
    named = Path(path)
    try:
        special = not stat.S_ISREG(os.stat(named).st_mode)  # follows links
    except FileNotFoundError:
        special = False
    if special:
        with open(named, "wb") as f:
            yield f
        return
    target = Path(os.path.realpath(named))
    tmp = temp_path(target)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
