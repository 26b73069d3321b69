"""Durable file-system operations shared by every writer (events, safetensors, dumps)."""

from __future__ import annotations

import os


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
