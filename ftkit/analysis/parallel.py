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

Compact record layout (``C_*`` indices): ``(code, time, line, seq, rollout, step, attempt, cell,
rank, has_rank, ...)`` then, by code: ``OUTCOME``: ``outcome, epoch``; ``FINGERPRINT``: ``total``
(as logged), ``orjson`` bytes of ``[params, optimizer]``; ``WITNESS``: ``ids, counts``.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from ftkit.events.reader import EventStream, IssueCallback
from ftkit.events.validate import CHECKS

__all__ = ["HOT_TYPES", "PARALLEL_BYTES", "ParallelStream", "default_workers"]

OUTCOME, FINGERPRINT, WITNESS = range(3)
HOT_TYPES = ("step_outcome", "state_fingerprint", "witness_counts")  # index = the record's code
HOT_CODES = {t: i for i, t in enumerate(HOT_TYPES)}
CHUNK_BYTES = 64 << 10  # of the file per chunk
CHUNK_ITEMS = 1024
PARALLEL_BYTES = 16 << 20  # inputs smaller than this are read in one process (forking costs more)
_PIPE_BYTES = 1 << 20  # a worker works ahead this far per pipe (Linux F_SETPIPE_SZ; a hint)
_F_SETPIPE_SZ = 1031


def default_workers(files: int, size: int) -> int:
    """Worker processes for ``files`` files of ``size`` bytes: ``FTKIT_ANALYZE_WORKERS`` when set
    (``0``: none), else 0 below ``PARALLEL_BYTES``, for a single file, or in a process that
    imported Ray (``ftkit train`` analysing its own log: forking a process with Ray's threads could
    deadlock), and one per core but the replay's otherwise (so one on two cores, none on one); at
    most one per file. Measured on an idle two-core machine, one worker takes a third off the wall
    time; on cores other jobs hold, its extra CPU can cost more than it saves
    (docs/analyze-events.md, "Worker processes")."""
    env = os.environ.get("FTKIT_ANALYZE_WORKERS", "").strip()
    if env.isdigit():
        return min(int(env), files)
    if size < PARALLEL_BYTES or files < 2 or "ray" in sys.modules:  # Ray's threads make fork() unsafe
        return 0
    # the replay keeps one core busy: the others decode and check
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores - 1, files)


def reduce_file(path: Path, index: int) -> Iterator[bytes]:
    """The chunks of file ``index``, in file order: ``marshal`` blobs of ``(lines, bytes, items,
    issues)``, ``items`` the file's heap items ``(time, index, event or record, line)``, ``issues``
    ``(position, file, line, kind, message)``: reported before ``items[position]``."""
    out: list[tuple[Any, ...]] = []
    issues: list[tuple[Any, ...]] = []
    stream = EventStream([path], lambda *issue: issues.append((len(out), *issue)))
    counts = stream.counts
    sent_lines = sent_bytes = 0
    src: Any = None
    run: Any = None
    seq_next, last_time = 0, float("-inf")
    plan = {t: (check, HOT_CODES.get(t)) for t, check in CHECKS.items()}  # one lookup per line
    for heap_time, _, ev, line in stream.file_events(0):
        item: Any = ev
        try:
            check, code = plan[ev.get("type")]
        except (KeyError, TypeError):  # no type, an unknown one, or not a string: the replay reports it
            check = None
        if check is not None and check(ev):
            if src is None:  # the stream's first valid line: its source and run (the replay checks them)
                src, run = ev["source"], ev["run"]
                seq_next, last_time = ev["seq"] + 1, ev["time"]
            elif ev["source"] == src:  # else the replay finds the stream is not one source's
                seq, time = ev["seq"], ev["time"]
                if code is not None and seq == seq_next and time >= last_time - 1.0 and ev["run"] == run:
                    item = _record(code, ev, line, time, seq)
                seq_next, last_time = seq + 1, time
        out.append((heap_time, index, item, line))
        if len(out) >= CHUNK_ITEMS or counts[1] - sent_bytes >= CHUNK_BYTES:
            yield marshal.dumps((counts[0] - sent_lines, counts[1] - sent_bytes, out, issues))
            sent_lines, sent_bytes, out, issues = counts[0], counts[1], [], []
    if out or issues or counts[0] != sent_lines or counts[1] != sent_bytes:
        yield marshal.dumps((counts[0] - sent_lines, counts[1] - sent_bytes, out, issues))


def _record(code: int, ev: dict[str, Any], line: int, time: Any, seq: int) -> tuple[Any, ...]:
    """The compact record of a checked hot line (layout: the module docstring)."""
    rank, has_rank = (ev["rank"], True) if "rank" in ev else (None, False)
    if code == OUTCOME:
        return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
                ev["outcome"], ev["epoch"])  # fmt: skip
    if code == WITNESS:
        return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
                ev["ids"], ev["counts"])  # fmt: skip
    return (code, time, line, seq, ev["rollout"], ev["step"], ev["attempt"], ev["cell"], rank, has_rank,
            ev["total"], orjson.dumps([ev["params"], ev["optimizer"]]))  # fmt: skip


def _serve(files: dict[int, Path], requests: Connection, replies: Connection) -> None:
    """A worker: answer each requested file index with that file's next chunk (empty: its end)."""
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
        self.procs = []
        for w in range(workers):
            req_r, req_w = ctx.Pipe(duplex=False)
            rep_r, rep_w = ctx.Pipe(duplex=False)
            with contextlib.suppress(OSError):
                fcntl.fcntl(rep_w.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
            proc = ctx.Process(target=_serve, args=(mine[w], req_r, rep_w), daemon=True)
            proc.start()
            req_r.close()
            rep_w.close()
            self.requests.append(req_w)
            self.replies.append(rep_r)
            self.procs.append(proc)
        self.ready: dict[int, bytes] = {}

    def _ask(self, i: int) -> None:
        self.requests[self.owner[i]].send_bytes(i.to_bytes(4, "little"))

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
            lines, nbytes, items, issues = marshal.loads(blob)
            counts[0] += lines
            counts[1] += nbytes
            if not issues:
                yield from items
                continue
            done = 0
            for position, *issue in issues:
                yield from items[done:position]
                done = position
                on_issue(*issue)
            yield from items[done:]

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
