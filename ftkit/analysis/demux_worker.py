"""A merged input's sequential pass in a worker process: ``DemuxWorkerStream``.

``DemuxStream`` reads a merged or re-ordered log in two ways (``ftkit.events.demux``). When the
keys-only first pass finds the lines already in merged order (the **sequential** way: what
``write_merged_log`` and a time-ordered log shipper produce), the second pass decodes every line
in file order and hands it on in place. ``DemuxWorkerStream`` runs that pass -- reading,
decoding, the structural check and each source's envelope -- in one forked worker process, which
sends each hot line as its compact record and every other line as its decoded event, exactly as
the per-process workers do (``ftkit.analysis.parallel``: ``Envelope``, ``Chunks``); the replay
stays in the analysing process. The items, their order and the issues reported (at the same
points) are those of ``DemuxStream``, so the analysis is the same byte for byte.

The **sorted** way (lines out of order, standard input) is not handed to a worker: its partition
and its merge of the sorted runs stay in one process. A worker that ends without finishing raises
``WorkerLost`` (``analyze_paths`` then reads the input again in one process). Memory: the pipe
(about 1 MiB ahead) and one chunk in the analysing process, besides ``DemuxStream``'s own.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ftkit.analysis.parallel import Chunks, Envelope, WorkerLost, unpack, widen
from ftkit.events.demux import DemuxStream

__all__ = ["DemuxWorkerStream"]


class DemuxWorkerStream(DemuxStream):
    """``DemuxStream`` whose sequential pass runs in a worker process (see the module)."""

    _proc: BaseProcess | None = None
    _conn: Connection | None = None

    def events(self) -> Iterator[tuple[Any, int, int]]:
        """``DemuxStream.events``: the sequential way's items as the worker sent them."""
        if self.mode != "sequential":
            return super().events()
        return self._from_worker()

    def _from_worker(self) -> Iterator[tuple[Any, int, int]]:
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        widen(send)
        self._proc = ctx.Process(target=_serve, args=(self, send), daemon=True)
        self._proc.start()
        send.close()
        self._conn = recv
        counts, on_issue = self.counts, self.on_issue
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
    """The worker: ``DemuxStream``'s sequential pass, reduced and sent chunk by chunk, then ``b""``."""
    chunks = Chunks()
    stream.on_issue = chunks.issue
    chunks.counts = stream.counts
    envelopes = [Envelope() for _ in stream.names]
    out = chunks.out
    try:
        for ev, si, loc in DemuxStream._sequential(stream):
            out.append((ev, si, loc) if ev is None else (envelopes[si].reduce(ev, loc), si, loc))
            if chunks.ready():
                conn.send_bytes(chunks.take())
                out = chunks.out
        if chunks.left():
            conn.send_bytes(chunks.take())
        conn.send_bytes(b"")
    except OSError:  # the analysing process stopped reading (it stopped early)
        return
