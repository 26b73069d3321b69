"""Writing a side report (``--junit-xml``, ``--html``) where the user pointed it.

``ftkit.fsutil.output_file`` does the writing: atomically for a regular file (through a symbolic
link, to the file it leads to), in place for a special file (``/dev/stdout``, ``/dev/null``, a
FIFO: never renamed over). A write that fails (a full disk, an I/O error) is a ``UsageError``
(exit 2) naming the path.
"""

from __future__ import annotations

from pathlib import Path

from ftkit.errors import UsageError
from ftkit.fsutil import output_file


def write_report_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as the module doc says."""
    try:
        with output_file(path) as f:
            f.write(data)
    except OSError as exc:
        raise UsageError(
            f"cannot write {path}: {exc.strerror or exc}", "choose another path, or free space where it is"
        ) from None
