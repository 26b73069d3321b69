"""Writing a side report (``--junit-xml``, ``--html``) where the user pointed it.

- **A regular file, or a new name:** written atomically beside it (temporary file, fsync,
  rename), so a reader never sees half a report.
- **A symbolic link:** the file it leads to is written that way; the link stays a link.
- **Anything else that exists** (``/dev/stdout``, ``/dev/null``, a FIFO, a terminal): written
  through, in place. It is never renamed over: replacing ``/dev/stdout`` with a file would break
  the machine for every later process.

A write that fails (a full disk, an I/O error) is a ``UsageError`` (exit 2) naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ftkit.errors import UsageError


def write_report_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as the module doc says."""
    path = Path(path)
    try:
        try:
            mode: int | None = os.stat(path).st_mode  # follows links
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "wb") as f:
                f.write(data)
            return
        from ftkit.tensors.st import write_bytes_atomic

        write_bytes_atomic(Path(os.path.realpath(path)), data)
    except OSError as exc:
        raise UsageError(
            f"cannot write {path}: {exc.strerror or exc}", "choose another path, or free space where it is"
        ) from None
