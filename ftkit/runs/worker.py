"""``RemoteSide``: one run of a comparison replayed in a worker process of its own.

Reading a log -- decoding, the integrity replay of ``analyze-events``, the ``Ledger`` -- is
almost all of the work of ``compare_runs``, and the two logs are independent: each is read by a
``Side`` in a forked worker (``ftkit.analysis.parallel``'s ``as_worker`` / ``start`` / ``widen``)
while the comparing process only matches. The worker's ``Side`` writes to a ``Recorder``, a
``Matcher`` that keeps its own run's values (the ``Ledger`` reads its step's metrics back) but
no per-tensor detail, and records every call; after each ``advance(CHUNK)`` the worker sends
the calls, ``closed_below`` and the progress as one ``marshal`` blob. ``RemoteSide.advance``
takes the next blob and makes the same calls on the comparing process's ``Matcher``: the calls
arrive in the order one process would make them (the side that is behind is advanced, one chunk
at a time, as in ``compare_runs``' loop), so the result is the same, byte for byte.

A call's per-tensor detail travels as its own ``marshal`` bytes and is decoded only when the
``Matcher`` hands it to ``compare_item`` (``Matcher.detail``): the detail of equal items, nearly
all of them, is never decoded in the comparing process.

Memory: a worker is at most a pipe (``widen``) and one blob ahead of the comparison; at the end
it sends its integrity findings, stats and config (``pickle``). A worker that dies is
``WorkerLost`` (``compare_runs`` then reads both logs again in one process); an exception in a
worker is raised again in the comparing process.
"""

from __future__ import annotations

import contextlib
import marshal
import multiprocessing
import os
import pickle
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ftkit.analysis.parallel import WorkerLost, as_worker, start, widen
from ftkit.findings import Finding
from ftkit.runs.matcher import Key, Matcher, Pos
from ftkit.runs.side import Side

STEP, PUT, RETRACT, RESET, FINISHED = range(5)  # the recorded calls
BATCH, END, RAISED = b"B", b"E", b"X"  # the first byte of a worker's message


class Recorder(Matcher):
    """A worker's ``Matcher``: its run's values without detail, and every call in ``ops``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, ...]] = []

    def step(self, side: int, step: int, rollout: int) -> None:
        super().step(side, step, rollout)
        self.ops.append((STEP, step, rollout))

    def put(self, side: int, key: Key, pos: Pos, value: Any, detail: Any = None) -> None:
        super().put(side, key, pos, value)
        self.ops.append((PUT, key, pos, value, None if detail is None else marshal.dumps(detail)))

    def retract(self, side: int, step: int, rollout: int) -> None:
        super().retract(side, step, rollout)
        self.ops.append((RETRACT, step, rollout))

    def reset(self, side: int) -> None:
        super().reset(side)
        self.ops.append((RESET,))

    def finished(self, side: int) -> None:
        super().finished(side)
        self.ops.append((FINISHED,))


def _serve(index: int, paths: list[str], chunk: int, conn: Connection) -> None:
    """A worker: replay run ``index``'s log ``chunk`` events at a time, sending each chunk's calls."""
    as_worker()
    try:
        recorder = Recorder()
        side = Side(index, paths, recorder)
        while not side.done:
            side.advance(chunk)
            conn.send_bytes(BATCH + marshal.dumps((side.closed_below, side.progress(), recorder.ops)))
            recorder.ops = []
        ledger = side.ledger
        end = (side.damage(), side.warnings(), side.stats(), ledger.config, ledger.layout, ledger.scheme)
        conn.send_bytes(END + pickle.dumps(end))
    except OSError:  # the comparing process stopped reading (it stopped early)
        return
    except Exception as exc:  # noqa: BLE001 - raised again in the comparing process
        with contextlib.suppress(OSError):
            conn.send_bytes(RAISED + _pickled(exc))
    finally:
        conn.close()


def _pickled(exc: Exception) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an exception that cannot travel: its text does
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


class RemoteSide:
    """Run ``index`` of a comparison read by a worker: the interface of ``Side`` that
    ``compare_runs`` uses, its calls made on ``matcher`` (see the module docstring)."""

    def __init__(self, index: int, paths: Iterable[str | os.PathLike[str]], matcher: Matcher, chunk: int) -> None:
        self.index, self.matcher = index, matcher
        self.paths = [Path(p) for p in paths]
        self.done = False
        self.closed_below = -1
        self._progress = (0, 0)
        self._end: tuple[list[Finding], list[Finding], dict[str, Any], Any, dict[str, Any], str] | None = None
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe(duplex=False)
        widen(child)
        self.proc = ctx.Process(target=_serve, args=(index, [str(p) for p in self.paths], chunk, child), daemon=True)
        try:
            start(self.proc)
        finally:
            child.close()

    @property
    def label(self) -> str:
        return "AB"[self.index]

    def advance(self, n: int) -> None:
        """Make the calls of the worker's next chunk (``n`` is the worker's: fixed at the start)."""
        try:
            blob = self.conn.recv_bytes()
        except (EOFError, OSError) as exc:
            raise WorkerLost(f"the worker of run {self.label} ended: {exc or type(exc).__name__}") from None
        tag, body = blob[:1], blob[1:]
        if tag == RAISED:
            raise pickle.loads(body)
        if tag == END:
            self._end = pickle.loads(body)
            self.done = True
            return
        self.closed_below, self._progress, ops = marshal.loads(body)
        m, side = self.matcher, self.index
        for op in ops:
            code = op[0]
            if code == PUT:
                m.put(side, op[1], op[2], op[3], op[4])
            elif code == STEP:
                m.step(side, op[1], op[2])
            elif code == RETRACT:
                m.retract(side, op[1], op[2])
            elif code == RESET:
                m.reset(side)
            else:
                m.finished(side)

    def progress(self) -> tuple[int, int]:
        return self._progress

    def close(self) -> None:
        self.conn.close()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()

    def _final(self) -> tuple[list[Finding], list[Finding], dict[str, Any], Any, dict[str, Any], str]:
        assert self._end is not None, "the worker has not finished"
        return self._end

    def damage(self) -> list[Finding]:
        return self._final()[0]

    def warnings(self) -> list[Finding]:
        return self._final()[1]

    def stats(self) -> dict[str, Any]:
        return self._final()[2]

    @property
    def ledger(self) -> SimpleNamespace:
        """What ``compare_runs`` reads of the run's ``Ledger``: its ``config``, ``layout`` and
        fingerprint ``scheme``."""
        _, _, _, config, layout, scheme = self._final()
        return SimpleNamespace(config=config, layout=layout, scheme=scheme)
