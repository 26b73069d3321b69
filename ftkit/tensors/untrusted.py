"""Reading untrusted input without crashing, hanging or recursing: the helpers every reader of
dumps, indexes, run.json and rules files uses.

- ``open_regular(path)``: open for reading only a regular file (a FIFO, socket or device is an
  ``InputError``; the open is non-blocking, so a FIFO without a writer cannot hang);
- ``read_regular(path)``: the bytes of a file that must be a plain file (a checkpoint's
  bookkeeping): a symlink, FIFO, socket, device or directory is ``NotRegular`` (a ``ValueError``),
  opened non-blocking and without following a link, so nothing hangs and nothing stands in;
- ``load_json(raw)``: ``json.loads`` that raises ``ValueError`` for invalid UTF-8 or JSON,
  nesting deeper than ``MAX_JSON_DEPTH`` (checked by a linear scan before parsing, so no
  recursion limit or C-level stack is ever reached) and integers too long to convert;
- ``is_text(s)``: whether a decoded string is printable as UTF-8 (JSON can carry lone
  surrogates such as ``"\\ud800"`` that no output stream can write);
- ``short_repr(v)``: ``repr`` cut to one readable line for error messages.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftkit.errors import InputError

MAX_JSON_DEPTH = 64  # nesting any ftkit JSON document may have (headers, indexes, run.json)


def load_json(raw: bytes | str) -> Any:
    """``json.loads`` that fails closed: ``ValueError`` for invalid UTF-8 or JSON, nesting
    deeper than ``MAX_JSON_DEPTH`` (checked before parsing, so no recursion limit is hit),
    and integers with more digits than Python converts."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw  # UnicodeDecodeError is a ValueError
    if _max_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError as exc:  # pragma: no cover - the depth check comes first
        raise ValueError("nested too deeply") from exc


def _max_depth(text: str) -> int:
    """Bracket nesting depth of a JSON text, ignoring brackets inside strings (linear scan)."""
    if "[" not in text and "{" not in text:
        return 0
    depth = best = 0
    in_str = False
    for m in _JSON_TOKENS.finditer(text):
        tok = m.group()
        if in_str:
            if tok == '"':
                in_str = False
            continue
        if tok == '"':
            in_str = True
        elif tok in "[{":
            depth += 1
            best = max(best, depth)
        elif tok in "]}":
            depth -= 1
    return best


_JSON_TOKENS = re.compile(r'\\.|"|[\[\]{}]', re.S)


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[Any]:
    """Open ``path`` for reading only if it is a regular file: a FIFO, socket or device is an
    ``InputError`` (opened non-blocking, so a FIFO without writer cannot hang us)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path} is not a regular file", "pass regular files; FIFOs and devices are not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        yield fh


class NotRegular(ValueError):
    """A path that must be a regular file is a symlink, FIFO, socket, device or directory."""


def read_regular(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file and not a symbolic link; ``NotRegular``
    otherwise (the open never follows a final link and never blocks, so a FIFO cannot hang the
    reader); ``FileNotFoundError`` when absent, other ``OSError`` as raised."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOENT and os.path.islink(path)):
            raise NotRegular(f"{Path(path).name} is a symbolic link, not a regular file") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFDIR: "directory"}.get(
                stat.S_IFMT(mode), "device"
            )
            raise NotRegular(f"{Path(path).name} is a {kind}, not a regular file")
        os.set_blocking(fd, True)
        return fh.read()


def is_text(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (JSON's ``"\\ud800"`` decodes to a lone surrogate that
    no output stream can print)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def short_repr(value: object, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters (messages must stay one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
