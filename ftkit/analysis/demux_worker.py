"""A merged input's second pass in a worker process: ``DemuxWorkerStream``.

``DemuxStream`` reads a merged or re-ordered log in two ways (``ftkit.events.demux``), both after a
first pass in the analysing process: the keys-only scan, and for the sorted way the partition of
the lines into sorted runs. Its second pass then yields every line as its decoded event, in
merged order: in place (the **sequential** way: the input was already in merged order, as
``write_merged_log`` and a time-ordered log shipper produce it) or merged from the sorted runs
(the **sorted** way: any other order, standard input). ``DemuxWorkerStream`` runs that second
pass -- reading, decoding, for the sorted way the merge of the runs and the duplicate checks,
then the structural check and each source's envelope -- in one forked worker process (which
sees the first pass's state, the sorted runs included, as it was at the fork). It sends each hot
line as its compact record and every other line as its decoded event, exactly as the per-process
workers do (``ftkit.analysis.parallel``: ``Envelope``, ``Chunks``); the replay stays in the
analysing process. The items, their order and the issues reported (at the same points) are those
of ``DemuxStream``, so the analysis is the same byte for byte.

A worker that ends without finishing raises ``WorkerLost`` (``analyze_paths`` then reads the input
again in one process). Memory: the pipe (about 1 MiB ahead) and one chunk in the analysing
process, besides ``DemuxStream``'s own (the forked worker shares the sorted runs' pages until
either side writes them).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ftkit.analysis.parallel import Chunks, Envelope, WorkerLost, as_worker, start, unpack, widen
from ftkit.events.demux import DemuxStream

__all__ = ["DemuxWorkerStream"]


class DemuxWorkerStream(DemuxStream):
    """``DemuxStream`` whose second pass runs in a worker process (see the module)."""

    _proc: BaseProcess | None = None
    _conn: Connection | None = None

    def events(self) -> Iterator[tuple[Any, int, int]]:
        """``DemuxStream.events``, as the worker sent them."""
        return self._from_worker()

    def _from_worker(self) -> Iterator[tuple[Any, int, int]]:
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        widen(send)
        self._conn = recv
        self._proc = ctx.Process(target=_serve, args=(self, send), daemon=True)
        try:
            start(self._proc)
        except WorkerLost:
            self._proc = None
            raise
        finally:
            send.close()
        # what the second pass read: lines and bytes the sequential way (the run's stats), the bytes
        # handed on from the sorted runs the sorted way (progress only: the partition counted the lines)
        sequential = self._sorter is None
        counts, on_issue = self.counts if sequential else [0, 0], self.on_issue
        while True:
            try:
                blob = recv.recv_bytes()
            except (EOFError, OSError) as exc:  # the worker is gone
                raise WorkerLost(
                    f"the analysis worker of the merged input ended: {exc or type(exc).__name__}"
                ) from None
            if not blob:
                return
            yield from unpack(blob, counts, on_issue)
            if not sequential:
                self._replayed = counts[1]

    def close(self) -> None:
        """Stop the worker (also when the replay stopped early), then ``DemuxStream.close``."""
        if self._conn is not None:
            self._conn.close()  # a worker still sending gets EPIPE and ends
            self._conn = None
        if self._proc is not None:
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
            self._proc = None
        super().close()


def _serve(stream: DemuxWorkerStream, conn: Connection) -> None:
    """The worker: ``DemuxStream``'s second pass, reduced and sent chunk by chunk, then ``b""``."""
    as_worker()
    chunks = Chunks()
    stream.on_issue = chunks.issue
    sequential = stream._sorter is None
    chunks.counts = progress = stream.counts if sequential else [0, 0]
    envelopes = [Envelope() for _ in stream.names]
    out = chunks.out
    try:
        for ev, si, loc in DemuxStream.events(stream):
            out.append((ev, si, loc) if ev is None else (envelopes[si].reduce(ev, loc), si, loc))
            if not sequential:
                progress[1] = stream._replayed
            if chunks.ready():
                conn.send_bytes(chunks.take())
                out = chunks.out
        if chunks.left():
            conn.send_bytes(chunks.take())
        conn.send_bytes(b"")
    except OSError:  # the analysing process stopped reading (it stopped early)
        return
