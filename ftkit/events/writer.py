"""``EventWriter``: one append-only JSONL file per process incarnation (invariant I5).

Contract:

- The file is ``<events_dir>/<role>[-c<cell>][-r<rank>]-i<incarnation>.jsonl``. It is opened
  with ``O_APPEND | O_CREAT`` and never truncated; ``incarnation=None`` claims the next free
  incarnation for (role, cell, rank) atomically (``O_EXCL``), so a restarted process never
  writes over its predecessor. Reopening an existing incarnation appends and continues its
  ``seq`` after the last complete line.
- ``emit`` writes one whole line with a single ``write`` system call (so the line is in the
  kernel when ``emit`` returns: "flushed per line"); ``sync`` fsyncs (call it at step
  boundaries); ``close`` fsyncs and closes. All three are thread-safe.
- ``sync(wait=False)`` starts the fsync on a helper thread and returns at once (a rank
  returns its step to the driver while the disk works). Every later ``emit``, ``sync`` and
  ``close`` first waits for it, so no line written after the boundary (and nothing the caller
  does after its next ``emit``) can precede the durability of the lines before it.
- The writer never raises into training: anything that fails (serialisation, a full disk, a
  closed file) increments ``dropped`` and keeps ``last_error``. Every emit consumes a ``seq``
  even when its line is lost, so the gap is visible to ``analyze-events`` (FT111); ``close``
  also writes an ``events_dropped`` line when anything was dropped, then ``log_closed`` (schema 2),
  always the last line of a writer that closed normally.
- ``emit`` validates nothing (it is called per step on the hot path); the analyzer validates.
  Except under ``FTKIT_STRICT_EVENTS=1`` (set for the whole test session): then every line is
  checked against the schema (``parse_event``, no unknown fields) and a wrong event type, field
  name or field type raises ``EventSchemaError`` at the ``emit`` call; read when the writer is made.
- ``clock``, ``pid`` and ``host`` default to the real ones; tools that replay or synthesise
  logs (``ftkit.testing.synthetic``) pass their own. Engines pass their engine index as ``rank``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftkit.events.envelope import SCHEMA
from ftkit.fsutil import fsync_dir

log = logging.getLogger("ftkit.events")


def file_stem(role: str, cell: int | None, rank: int | None) -> str:
    """The file name prefix of a (role, cell, rank): ``trainer-c0-r1``, ``driver``."""
    stem = role
    if cell is not None:
        stem += f"-c{cell}"
    if rank is not None:
        stem += f"-r{rank}"
    return stem


class EventSchemaError(ValueError):
    """An emitted event does not match the schema (raised only under ``FTKIT_STRICT_EVENTS=1``)."""


def _check_line(data: bytes) -> None:
    """Raise ``EventSchemaError`` unless ``data`` (one serialised line) is a valid event of a
    known type whose fields are all declared by its schema model."""
    from pydantic import ValidationError

    from ftkit.events.schema import parse_event

    obj = json.loads(data)
    try:
        event = parse_event(obj)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        raise EventSchemaError(f"{obj.get('type')!r} event does not match the schema: {wrong}") from None
    if event.model_extra:
        raise EventSchemaError(f"{event.type!r} event has field(s) not in the schema: {sorted(event.model_extra)}")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


class EventWriter:
    """Append events of one process incarnation to its own file under ``events_dir``."""

    def __init__(
        self,
        events_dir: str | os.PathLike[str],
        run: str,
        role: str,
        cell: int | None = None,
        rank: int | None = None,
        incarnation: int | None = None,
        *,
        clock: Callable[[], float] = time.time,
        pid: int | None = None,
        host: str | None = None,
    ) -> None:
        self.dir = Path(events_dir)
        self.run, self.role, self.cell, self.rank = run, role, cell, rank
        self.dropped = 0
        self.last_error: str | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: concurrent.futures.Future[None] | None = None  # a background fsync (sync(wait=False))
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None
        self._seq = 0
        self._fd: int | None = None
        self._strict = os.environ.get("FTKIT_STRICT_EVENTS") == "1"
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = file_stem(role, cell, rank)
        if incarnation is None:
            self.incarnation, self._fd = self._claim(stem)
        else:
            self.incarnation = incarnation
            path = self.dir / f"{stem}-i{incarnation}.jsonl"
            self._seq = _next_seq(path)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if _ends_unterminated(path):  # a crashed predecessor's fragment stays its own line
                os.write(self._fd, b"\n")
        self.path = self.dir / f"{stem}-i{self.incarnation}.jsonl"
        fsync_dir(self.dir)
        self._source = {
            "role": role,
            "cell": cell,
            "rank": rank,
            "incarnation": self.incarnation,
            "pid": os.getpid() if pid is None else pid,
            "host": socket.gethostname() if host is None else host,
        }

    def _claim(self, stem: str) -> tuple[int, int]:
        pattern = re.compile(re.escape(stem) + r"-i(\d+)\.jsonl(\.gz)?$")
        taken = [int(m.group(1)) for p in self.dir.iterdir() if (m := pattern.match(p.name))]
        inc = max(taken, default=-1) + 1
        while True:
            try:
                fd = os.open(
                    self.dir / f"{stem}-i{inc}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644
                )
                return inc, fd
            except FileExistsError:  # another process claimed it first
                inc += 1

    @property
    def seq(self) -> int:
        """The ``seq`` the next event will carry."""
        return self._seq

    def emit(self, type: str, **fields: Any) -> bool:
        """Append one event; returns whether its line was written (never raises)."""
        if self._pending is not None:
            self._wait_pending()
        with self._lock:
            seq = self._seq
            self._seq += 1
            try:
                event = {
                    "schema": SCHEMA,
                    "type": type,
                    "run": self.run,
                    "time": self._clock(),
                    "source": self._source,
                    "seq": seq,
                    **fields,
                }
                data = (json.dumps(event, default=_json_default, separators=(",", ":")) + "\n").encode()
                if self._strict:
                    _check_line(data)
                if self._fd is None:
                    raise OSError("event writer is closed")
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
                return True
            except Exception as exc:  # noqa: BLE001 - the writer never raises into training
                if isinstance(exc, EventSchemaError):
                    raise  # strict mode (tests): the call site is wrong
                self._drop(exc)
                return False

    def _drop(self, exc: BaseException) -> None:
        self.dropped += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.dropped == 1:
            log.warning("event writer %s could not write a line: %s", self.path, self.last_error)

    def sync(self, wait: bool = True) -> None:
        """fsync the file (call at step boundaries); failures are counted, never raised.

        ``wait=False``: the fsync runs on a helper thread; the next ``emit``, ``sync`` or
        ``close`` waits for it to finish before doing anything else.
        """
        self._wait_pending()
        if wait:
            self._fsync()
            return
        with self._pending_lock:
            if self._helper is None:  # one helper thread per writer, started on first use
                self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ftkit-events-fsync")
            self._pending = self._helper.submit(self._fsync)

    def _fsync(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._drop(exc)

    def _wait_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # _fsync never raises: failures are counted in dropped

    def close(self) -> None:
        """Report drops (``events_dropped``), write ``log_closed``, fsync and close; idempotent."""
        if self._fd is None:
            return
        self._wait_pending()  # a background fsync's failure belongs in the count below
        if self.dropped:
            self.emit("events_dropped", count=self.dropped, last_error=self.last_error or "")
        self.emit("log_closed", lines=self._seq, dropped=self.dropped, peak_rss_bytes=peak_rss_bytes())
        self.sync()
        with self._pending_lock:
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=True)
        with self._lock:
            fd, self._fd = self._fd, None
        try:
            os.close(fd)
        except OSError as exc:
            self._drop(exc)

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _next_seq(path: Path) -> int:
    """``seq`` after the last complete line of an existing file (0 when absent or empty)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - (1 << 20)))
            tail = fh.read().split(b"\n")
    except FileNotFoundError:
        return 0
    for line in reversed(tail[:-1]):  # tail[-1] is empty or an unterminated fragment
        try:
            return int(json.loads(line)["seq"]) + 1
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def _ends_unterminated(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far (``getrusage``'s ``ru_maxrss``: KiB on Linux,
    bytes on macOS), None where the platform has no ``resource`` module."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
