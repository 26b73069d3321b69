"""The per-process reader on several cores: worker processes reduce each file to compact records.

``ParallelStream(files, on_issue, workers)`` is a drop-in for ``EventStream`` (same ``events()``,
``locate``, ``names``, counts and progress) whose per-file work runs in ``workers`` forked
processes: reading, decoding (``EventStream.file_events``, so the same lines decode to the same
objects and the same issues are reported), the structural check (``ftkit.events.validate``), the
per-stream envelope (the stream's source and run, the ``seq`` chain, time order) and, for a
fingerprint line, re-encoding its per-tensor entries as one ``bytes`` (decoded and hashed again
only for the first line of a group of equal fingerprints: recomputing every line's total in the
workers cost them about 0.7x the plain loop more CPU for no measurable gain in the replay). Only the cross-stream replay
stays in the analysing process: it merges the files by time as before and replays what the
workers send.

What a worker sends for each line of a file, in file order (a chunk of them at a time, one
``marshal`` blob per chunk, about ``CHUNK_BYTES`` of the file each):

- a **compact record** for a ``step_outcome``, ``state_fingerprint`` or ``witness_counts`` line that
  passed its check and whose envelope is the stream's usual one (same source and run as the
  stream's first valid line, ``seq`` one more than the previous valid line's, time not going
  back): a tuple of the few fields the replay reads (layout below), no dict;
- the decoded event (a dict) of any other line that decoded to an object (the first of the
  stream, other types, invalid events, anything unusual): the replay handles it as it always did;
- what the reader reported (``on_issue`` is called in the analysing process when the merge reaches
  that point of the file, as the serial reader does).

Each as the heap item the merge takes, ``(time, file, record or event, line)``.

The replay's results are therefore the same, byte for byte, as reading the files in one process
(``bench/analyze_equivalence.py``). Memory: at most two chunks per file in flight (one being
replayed, one requested), plus each worker's one read block per open file.

The pieces any worker is made of -- ``Envelope`` (one stream's envelope and its compact records),
``Chunks`` / ``unpack`` (the blobs and the issues in place), ``as_worker``, ``start``, ``widen`` --
are shared with the merged input's worker (``ftkit.analysis.demux_worker``).

Compact record layout (``C_*`` indices): ``(code, time, line, seq, rollout, step, attempt, cell,
rank, has_rank, ...)`` then, by code: ``OUTCOME``: ``outcome, epoch``; ``FINGERPRINT``: ``total``
(as logged), ``orjson`` bytes of ``[params, optimizer]``; ``WITNESS``: ``ids, counts, contributions``.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import orjson

from ftkit.events.reader import EventStream, IssueCallback
from ftkit.events.validate import CHECKS

__all__ = [
    "HOT_TYPES",
    "PARALLEL_BYTES",
    "Chunks",
    "Envelope",
    "ParallelStream",
    "as_worker",
    "start",
    "default_workers",
    "demux_workers",
    "unpack",
    "widen",
]

OUTCOME, FINGERPRINT, WITNESS = range(3)
HOT_TYPES = ("step_outcome", "state_fingerprint", "witness_counts")  # index = the record's code
HOT_CODES = {t: i for i, t in enumerate(HOT_TYPES)}
PLAN = {t: (check, HOT_CODES.get(t)) for t, check in CHECKS.items()}  # a line's check and record code
CHUNK_BYTES = 64 << 10  # of the file per chunk
CHUNK_ITEMS = 1024
PARALLEL_BYTES = 16 << 20  # inputs smaller than this are read in one process (forking costs more)
_PIPE_BYTES = 1 << 20  # a worker works ahead this far per pipe (Linux F_SETPIPE_SZ; a hint)
_F_SETPIPE_SZ = 1031


def _budget(size: int) -> int:
    """Workers the machine and the input allow (``FTKIT_ANALYZE_WORKERS`` when set, ``0``: none):
    0 below ``PARALLEL_BYTES`` or in a process that imported Ray (``ftkit train`` analysing its own
    log: forking a process with Ray's threads could deadlock), else one per core but the replay's
    (so one on two cores, none on one). Measured on an idle two-core machine, one worker takes a
    third off the wall time; on cores other jobs hold, its extra CPU can cost more than it saves
    (docs/analyze-events.md, "Worker processes")."""
    env = os.environ.get("FTKIT_ANALYZE_WORKERS", "").strip()
    if env.isdigit():
        return int(env)
    if size < PARALLEL_BYTES or "ray" in sys.modules:  # Ray's threads make fork() unsafe
        return 0
    # the replay keeps one core busy: the others decode and check
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores - 1


def default_workers(files: int, size: int) -> int:
    """Worker processes for ``files`` per-process files of ``size`` bytes: the budget (``_budget``),
    at most one per file, none for a single file unless ``FTKIT_ANALYZE_WORKERS`` is set."""
    n = min(_budget(size), files)
    return n if files >= 2 or os.environ.get("FTKIT_ANALYZE_WORKERS", "").strip().isdigit() else 0


def demux_workers(size: int) -> int:
    """Worker processes for the second pass of a merged input of ``size`` bytes (0 or 1: one
    stream of lines to decode; ``ftkit.analysis.demux_worker``)."""
    return min(_budget(size), 1)


class Envelope:
    """A worker's view of one stream's envelope: what ``reduce`` sends for each decoded line of it.

    A hot line that passes its check and continues the stream's usual envelope (the source and run
    of the stream's first valid line, ``seq`` one more than the previous valid line's, time not
    going back) becomes its compact record; any other line is sent as its decoded event, for the
    replay to check and report as it always does."""

    __slots__ = ("src", "run", "seq_next", "last_time")

    def __init__(self) -> None:
        self.src: Any = None
        self.run: Any = None
        self.seq_next = 0
        self.last_time = float("-inf")

    def reduce(self, ev: dict[str, Any], line: int) -> Any:
        """The compact record of ``ev`` (read at ``line``), or ``ev`` itself."""
        try:
            check, code = PLAN[ev.get("type")]
        except (KeyError, TypeError):  # no type, an unknown one, or not a string: the replay reports it
            return ev
        if not check(ev):
            return ev
        if self.src is None:  # the stream's first valid line: its source and run (the replay checks them)
            self.src, self.run = ev["source"], ev["run"]
            self.seq_next, self.last_time = ev["seq"] + 1, ev["time"]
            return ev
        if ev["source"] != self.src:  # the replay finds the stream is not one source's
            return ev
        seq, time = ev["seq"], ev["time"]
        usual = seq == self.seq_next and time >= self.last_time - 1.0 and ev["run"] == self.run
        self.seq_next, self.last_time = seq + 1, time
        if code == FINGERPRINT and "weights" in ev:  # a bf16 run's: the replay reads the event whole
            return ev
        return _record(code, ev, line, time, seq) if usual and code is not None else ev


def _record(code: int, ev: dict[str, Any], line: int, time: Any, seq: int) -> tuple[Any, ...]:
    """The compact record of a checked hot line (layout: the module docstring)."""
    rank, has_rank = (ev["rank"], True) if "rank" in ev else (None, False)
    if code == OUTCOME:
        return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
                ev["outcome"], ev["epoch"])  # fmt: skip
    if code == WITNESS:
        return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
                ev["ids"], ev["counts"], ev["contributions"])  # fmt: skip
    return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
            ev["total"], orjson.dumps([ev["params"], ev["optimizer"]]))  # fmt: skip


class Chunks:
    """A worker's outgoing items cut into ``marshal`` blobs of ``(lines, bytes, items, issues)``:
    ``lines`` / ``bytes`` what the reader read since the previous blob, ``issues`` ``(position,
    file, line, kind, message)``, each reported before ``items[position]`` (``unpack``)."""

    def __init__(self) -> None:
        self.out: list[tuple[Any, ...]] = []
        self.issues: list[tuple[Any, ...]] = []
        self.counts = [0, 0]  # the reader's (set to its list)
        self.sent = (0, 0)

    def issue(self, *issue: Any) -> None:
        """The reader's ``on_issue``: reported at this point of the items."""
        self.issues.append((len(self.out), *issue))

    def ready(self) -> bool:
        """Whether a blob's worth is waiting (``CHUNK_ITEMS`` items or ``CHUNK_BYTES`` read)."""
        return len(self.out) >= CHUNK_ITEMS or self.counts[1] - self.sent[1] >= CHUNK_BYTES

    def left(self) -> bool:
        """Whether anything was not sent yet (items, issues, or lines read since)."""
        return bool(self.out or self.issues) or (self.counts[0], self.counts[1]) != self.sent

    def take(self) -> bytes:
        """The blob of what is waiting; empties it."""
        (lines, nbytes), sent = self.counts, self.sent
        blob = marshal.dumps((lines - sent[0], nbytes - sent[1], self.out, self.issues))
        self.sent, self.out, self.issues = (lines, nbytes), [], []
        return blob


def as_worker() -> None:
    """Set up a forked worker: Ctrl-C (SIGINT to the terminal's process group) is the analysing
    process's to handle -- it stops reading, and the worker ends on the closed pipe -- so the
    worker ignores it instead of dying with a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(proc: BaseProcess) -> None:
    """Start a worker; ``WorkerLost`` when the system refuses a process (fork's ``EAGAIN``,
    ``ENOMEM``): the analysis then runs in one process."""
    try:
        proc.start()
    except OSError as exc:
        raise WorkerLost(f"no analysis worker could be started: {exc}") from None


def widen(conn: Connection) -> None:
    """Let a worker work ``_PIPE_BYTES`` ahead on the pipe ``conn`` writes to (Linux; a hint)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)


def unpack(blob: bytes, counts: list[int], on_issue: IssueCallback) -> Iterator[Any]:
    """The items of one ``Chunks`` blob, its issues reported in place and its counts added."""
    lines, nbytes, items, issues = marshal.loads(blob)
    counts[0] += lines
    counts[1] += nbytes
    done = 0
    for position, *issue in issues:
        yield from items[done:position]
        done = position
        on_issue(*issue)
    yield from items[done:]


def reduce_file(path: Path, index: int) -> Iterator[bytes]:
    """The ``Chunks`` blobs of file ``index``, in file order, ``items`` the file's heap items
    ``(time, index, event or record, line)``."""
    chunks, envelope = Chunks(), Envelope()
    stream = EventStream([path], chunks.issue)
    chunks.counts = stream.counts
    reduce = envelope.reduce
    for heap_time, _, ev, line in stream.file_events(0):
        chunks.out.append((heap_time, index, reduce(ev, line), line))
        if chunks.ready():
            yield chunks.take()
    if chunks.left():
        yield chunks.take()


def _serve(files: dict[int, Path], requests: Connection, replies: Connection) -> None:
    """A worker: answer each requested file index with that file's next chunk (empty: its end)."""
    as_worker()
    gens = {i: reduce_file(p, i) for i, p in files.items()}
    while True:
        try:
            request = requests.recv_bytes()
        except EOFError:  # the analysing process is gone
            return
        if not request:  # stop (an EOF would not come: other workers hold copies of the pipe)
            return
        i = int.from_bytes(request, "little")
        blob = next(gens[i], b"")
        try:
            replies.send_bytes(i.to_bytes(4, "little") + blob)
        except OSError:  # the analysing process stopped reading (it stopped early)
            return
        if not blob:
            del gens[i]


class WorkerLost(Exception):
    """A worker process ended without answering (killed, out of memory): ``analyze_paths`` then
    analyses the same files again in one process, so the result does not depend on it."""


class ParallelStream(EventStream):
    """``EventStream`` whose files are reduced by ``workers`` forked processes (see the module)."""

    def __init__(self, files: list[Path], on_issue: IssueCallback, workers: int) -> None:
        super().__init__(files, on_issue)
        ctx = multiprocessing.get_context("fork")
        order = sorted(range(len(files)), key=lambda i: -os.path.getsize(files[i]))
        load = [0] * workers
        mine: list[dict[int, Path]] = [{} for _ in range(workers)]
        self.owner = [0] * len(files)
        for i in order:  # the biggest file to the least loaded worker
            w = load.index(min(load))
            mine[w][i] = files[i]
            load[w] += os.path.getsize(files[i])
            self.owner[i] = w
        self.requests: list[Connection] = []
        self.replies: list[Connection] = []
        self.procs: list[BaseProcess] = []
        self.ready: dict[int, bytes] = {}
        for w in range(workers):
            req_r, req_w = ctx.Pipe(duplex=False)
            rep_r, rep_w = ctx.Pipe(duplex=False)
            widen(rep_w)
            proc = ctx.Process(target=_serve, args=(mine[w], req_r, rep_w), daemon=True)
            self.requests.append(req_w)
            self.replies.append(rep_r)
            try:
                start(proc)
            except WorkerLost:
                self.close()  # the workers already started
                raise
            finally:
                req_r.close()
                rep_w.close()
            self.procs.append(proc)

    def _ask(self, i: int) -> None:
        try:
            self.requests[self.owner[i]].send_bytes(i.to_bytes(4, "little"))
        except OSError as exc:  # the worker is gone (EPIPE): not this process's stdout breaking
            raise WorkerLost(f"the analysis worker of file {i} ended: {exc or type(exc).__name__}") from None

    def _chunk(self, i: int) -> bytes:
        """File ``i``'s requested chunk (replies for other files of its worker are kept)."""
        ready, replies = self.ready, self.replies[self.owner[i]]
        while i not in ready:
            try:
                reply = replies.recv_bytes()
            except (EOFError, OSError) as exc:  # the worker is gone
                raise WorkerLost(f"the analysis worker of file {i} ended: {exc or type(exc).__name__}") from None
            ready[int.from_bytes(reply[:4], "little")] = reply[4:]
        return ready.pop(i)

    def file_events(self, index: int) -> Iterator[tuple[float, int, Any, int]]:
        """Heap items of one file: compact records and whole events as the worker sent them."""
        on_issue, counts = self.on_issue, self.counts
        self._ask(index)
        while blob := self._chunk(index):
            self._ask(index)  # the next chunk is read while this one is replayed
            yield from unpack(blob, counts, on_issue)

    def close(self) -> None:
        """Stop the workers (also when the replay stopped early)."""
        for conn in self.requests:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"")
        for conn in self.requests + self.replies:
            conn.close()
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
