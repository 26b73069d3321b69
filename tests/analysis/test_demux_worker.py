"""A merged log's sequential pass on a worker process (``ftkit.analysis.demux_worker``) gives the
same analysis, byte for byte, as one process: on every injected violation, on damage (malformed,
truncated, forged lines, a seq gap, a contradicted fingerprint total), when the worker is killed,
and when the input is not in merged order (the sorted way, duplicates and conflicting copies too)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest
from exact_json import exact_json

from ftkit.analysis import demux_worker
from ftkit.analysis.engine import analyze_paths
from ftkit.analysis.parallel import PARALLEL_BYTES, demux_workers
from ftkit.events.merge import write_merged_log
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec


def _analysis(path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, spill: int = 64 << 20) -> tuple[str, str]:
    """The analysis as JSON, and how the input was read."""
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", str(workers))
    r = analyze_paths([path], spill_bytes=spill)
    out = exact_json(r)
    assert not multiprocessing.active_children()  # the worker was stopped
    return out, r.stats["read_as"]


def _merged(tmp_path: Path, spec: SyntheticSpec) -> Path:
    generate(tmp_path, spec)
    merged = tmp_path / "merged.jsonl"
    write_merged_log(tmp_path / "events", merged)
    return merged


def _same(path: Path, monkeypatch: pytest.MonkeyPatch, read_as: str = "sequential", spill: int = 64 << 20) -> str:
    serial, how = _analysis(path, monkeypatch, 0, spill)
    assert how == read_as
    started = []
    from_worker = demux_worker.DemuxWorkerStream._from_worker
    monkeypatch.setattr(demux_worker.DemuxWorkerStream, "_from_worker", lambda s: started.append(1) or from_worker(s))
    assert _analysis(path, monkeypatch, 1, spill) == (serial, how)
    assert started == [1]  # the second pass ran on the worker
    return serial


@pytest.mark.parametrize("violation", [None, *VIOLATIONS])
def test_a_merged_log_gives_the_same_analysis_on_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, violation: str | None
) -> None:
    merged = _merged(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1, violation=violation))
    out = _same(merged, monkeypatch)
    if violation is not None:
        assert f'"code": "{violation}"' in out


def test_damage_in_a_merged_log_is_reported_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    merged = _merged(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1))
    lines = merged.read_bytes().split(b"\n")
    fps = [i for i, ln in enumerate(lines) if b'"state_fingerprint"' in ln and json.loads(ln)["cell"] == 1]
    bad = json.loads(lines[fps[1]])
    bad["total"] = "0" * 32  # a total its parts contradict
    lines[fps[1]] = json.dumps(bad).encode()
    forged = json.loads(lines[fps[2]])
    forged["cell"] = 0  # evidence naming another cell than its writer's
    lines[fps[2]] = json.dumps(forged).encode()
    lines[fps[3]] = b'{"type": "state_fingerprint", oops'  # malformed
    del lines[fps[4]]  # a seq gap
    merged.write_bytes(b"\n".join(lines[:-1]) + b'\n{"type": "step_out')  # a truncated last line
    out = _same(merged, monkeypatch)
    for text in ("not the fingerprint of its own", "evidence only counts from its own writer", "malformed", "seq gap"):
        assert text in out


def test_a_shuffled_log_gives_the_same_analysis_on_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    merged = _merged(tmp_path, SyntheticSpec(cells=2, tp=1, pp=2, rollouts=2, tensors=4, faults=1))
    lines = merged.read_bytes().splitlines(keepends=True)
    twice = lines[10]
    conflicting = json.loads(lines[20])
    conflicting["time"] += 0.5  # the same source and seq, another line
    lines += [twice, json.dumps(conflicting).encode() + b"\n"]
    random.Random(0).shuffle(lines)
    merged.write_bytes(b"".join(lines))
    for spill in (64 << 20, 16 << 10):  # the runs in memory, then on disk
        out = _same(merged, monkeypatch, read_as="sorted", spill=spill)
        assert "delivered twice" in out and "is also a different line" in out


def test_a_worker_killed_mid_analysis_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker SIGKILLed after its first chunk (the OOM killer, an operator): the input is read
    again in one process, with the same result, never exit 3."""
    merged = _merged(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1))
    serial, _ = _analysis(merged, monkeypatch, 0)

    class DiesAfterOneChunk:
        def __init__(self, conn) -> None:  # type: ignore[no-untyped-def]
            self.conn, self.sent = conn, 0

        def send_bytes(self, blob: bytes) -> None:
            if self.sent:
                os.kill(os.getpid(), signal.SIGKILL)
            self.sent += 1
            self.conn.send_bytes(blob)

    serve, lost = demux_worker._serve, []
    monkeypatch.setattr(demux_worker, "_serve", lambda stream, conn: serve(stream, DiesAfterOneChunk(conn)))
    worker_lost = demux_worker.WorkerLost

    class Lost(worker_lost):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object) -> None:
            lost.append(args)
            super().__init__(*args)

    monkeypatch.setattr(demux_worker, "WorkerLost", Lost)
    assert _analysis(merged, monkeypatch, 1) == (serial, "sequential")
    assert len(lost) == 1  # the worker did die, and the analysis started again


def test_the_worker_is_chosen_by_size_and_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FTKIT_ANALYZE_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert demux_workers(PARALLEL_BYTES) == 1  # two cores: one decodes, one replays
    assert demux_workers(PARALLEL_BYTES - 1) == 0  # small: one process
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert demux_workers(PARALLEL_BYTES) == 0
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", "4")
    assert demux_workers(10) == 1  # one stream of lines: one worker at most


def test_ctrl_c_is_left_to_the_analysing_process(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """SIGINT reaches every process of the terminal's group: the worker ignores it (the analysing
    process stops reading and the worker ends on the closed pipe) instead of dying with a traceback."""
    from ftkit.analysis.demux_worker import DemuxWorkerStream

    merged = _merged(tmp_path, SyntheticSpec(cells=2, tp=2, pp=1, rollouts=30, tensors=100, faults=0))  # ~9 MB
    stream = DemuxWorkerStream([merged], lambda *issue: None)
    try:
        items = stream.events()
        next(items)
        assert stream._proc is not None and stream._proc.is_alive()  # blocked on the full pipe
        os.kill(stream._proc.pid, signal.SIGINT)
        n = 1 + sum(1 for _ in items)  # WorkerLost if the worker died of it
    finally:
        stream.close()
    assert n > 1_000
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_no_process_to_start_is_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The system refuses a process (fork's EAGAIN under a process limit): the analysis runs in one
    process with the same result, for per-process files and for a merged input."""
    import errno
    from multiprocessing.process import BaseProcess

    merged = _merged(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1))
    expected = [_analysis(path, monkeypatch, 0) for path in (tmp_path / "events", merged)]

    def refused(self: BaseProcess) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(BaseProcess, "start", refused)
    assert [_analysis(path, monkeypatch, 2) for path in (tmp_path / "events", merged)] == expected
