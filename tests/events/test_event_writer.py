"""EventWriter: one append-only file per incarnation, flushed per line, fsynced, never raises."""

from __future__ import annotations

import json
import os
import threading

from ftkit.events.validate import is_valid
from ftkit.events.writer import EventWriter


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_file_per_incarnation_and_envelope(tmp_path):
    w = EventWriter(tmp_path / "events", run="r1", role="trainer", cell=2, rank=1)
    assert w.incarnation == 0 and w.path.name == "trainer-c2-r1-i0.jsonl"
    assert w.emit(
        "step_outcome", rollout=0, step=3, attempt=0, epoch=0, cell=2, rank=1, outcome="committed", micro_shards=[0, 1]
    )
    # flushed per line: readable before close
    (event,) = _read(w.path)
    assert event["seq"] == 0 and event["run"] == "r1" and event["schema"] == 2
    assert event["source"]["role"] == "trainer" and event["source"]["cell"] == 2 and event["source"]["rank"] == 1
    assert event["source"]["pid"] == os.getpid() and is_valid(event)
    w.close()


def test_next_incarnation_never_overwrites(tmp_path):
    d = tmp_path / "events"
    with EventWriter(d, "r", "driver") as a:
        a.emit("run_finished", status="completed")
    with EventWriter(d, "r", "driver") as b:
        b.emit("run_finished", status="failed")
    assert b.incarnation == 1 and b.path.name == "driver-i1.jsonl"
    assert _read(a.path)[0]["status"] == "completed" and _read(b.path)[0]["source"]["incarnation"] == 1


def test_reopening_an_incarnation_appends_and_continues_seq(tmp_path):
    d = tmp_path / "events"
    with EventWriter(d, "r", "engine", rank=0, incarnation=3) as w:
        for _ in range(3):
            w.emit("metric", rollout=0, step=None, values={})
    with open(w.path, "ab") as fh:  # a crashed writer left half a line
        fh.write(b'{"schema":1,"ty')
    with EventWriter(d, "r", "engine", rank=0, incarnation=3) as w2:
        w2.emit("metric", rollout=0, step=None, values={})
    lines = w.path.read_text().splitlines()
    assert len(lines) == 7 and lines[4] == '{"schema":1,"ty'
    events = [json.loads(lines[i]) for i in (0, 1, 2, 3, 5, 6)]
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4, 5]
    assert [e["type"] for e in events[3::2]] == ["log_closed", "log_closed"] and events[-1]["lines"] == 5


def test_thread_safe_whole_lines_and_unique_seq(tmp_path):
    w = EventWriter(tmp_path, "r", "trainer", cell=0, rank=0)
    params = {f"p{i}": "ab" * 16 for i in range(50)}

    def work():
        for _ in range(200):
            w.emit("weights_sent", rollout=0, version=0, total="00", params=params)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    events = _read(w.path)
    assert sorted(e["seq"] for e in events) == list(range(1601)) and w.dropped == 0
    assert events[-1]["type"] == "log_closed" and events[-1]["lines"] == 1600


def test_never_raises_counts_drops_and_reports_them(tmp_path, caplog):
    w = EventWriter(tmp_path, "r", "trainer", cell=0, rank=0)
    assert w.emit("metric", rollout=0, step=0, values={"x": object()}) is False
    assert w.emit("metric", rollout=0, step=1, values={"loss": 1.0})
    assert w.dropped == 1 and "TypeError" in w.last_error
    w.close()
    assert w.emit("metric", rollout=0, step=2, values={}) is False and w.dropped == 2
    w.close()  # idempotent
    events = _read(w.path)
    assert [e["seq"] for e in events] == [1, 2, 3]  # the lost line left a visible gap
    assert events[1]["type"] == "events_dropped" and events[1]["count"] == 1
    assert events[2]["type"] == "log_closed" and events[2]["lines"] == 3 and events[2]["dropped"] == 1


def test_write_errors_are_counted_not_raised(tmp_path, monkeypatch):
    w = EventWriter(tmp_path, "r", "driver")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    assert w.emit("run_finished", status="completed") is False
    assert w.dropped == 1 and "No space" in w.last_error
    monkeypatch.undo()
    w.close()


def test_sync_and_close_fsync(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    w = EventWriter(tmp_path, "r", "driver")
    calls.clear()
    w.emit("run_finished", status="completed")
    assert calls == []  # emit does not fsync (cheap per call) ...
    w.sync()
    assert len(calls) == 1  # ... sync does, at step boundaries
    w.close()
    assert len(calls) == 2


def test_numpy_like_values_are_serialised(tmp_path):
    class Scalar:
        def item(self):
            return 7

    with EventWriter(tmp_path, "r", "driver") as w:
        assert w.emit("metric", rollout=0, step=Scalar(), values={"loss": 0.5})
    assert _read(w.path)[0]["step"] == 7


def test_background_sync_returns_at_once_and_the_next_emit_waits_for_it(tmp_path, monkeypatch):
    import ftkit.events.writer as writer_mod

    gate, started, calls = threading.Event(), threading.Event(), []
    real_fsync = os.fsync

    def slow_fsync(fd):
        started.set()
        assert gate.wait(30), "the test never released the fsync"
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.delenv("FTKIT_STRICT_EVENTS")  # sync mechanics, told with partial events
    w = EventWriter(tmp_path, run="r", role="trainer", cell=0, rank=0)
    w.emit("step_outcome", step=0)
    monkeypatch.setattr(writer_mod.os, "fsync", slow_fsync)
    w.sync(wait=False)  # returns while the fsync is still blocked
    assert started.wait(30) and not calls
    emitter = threading.Thread(target=w.emit, args=("step_outcome",), kwargs={"step": 1})
    emitter.start()
    emitter.join(0.2)
    assert emitter.is_alive()  # the next line waits for the boundary's fsync
    assert [e["step"] for e in _read(w.path)] == [0]
    gate.set()
    emitter.join(30)
    assert not emitter.is_alive() and len(calls) == 1
    w.close()
    assert [e.get("step") for e in _read(w.path)] == [0, 1, None] and len(calls) == 2 and w.dropped == 0


def test_close_waits_for_a_background_sync_and_counts_its_failure(tmp_path, monkeypatch):
    import ftkit.events.writer as writer_mod

    def failing_fsync(fd):
        raise OSError(5, "I/O error")

    monkeypatch.delenv("FTKIT_STRICT_EVENTS")  # sync mechanics, told with partial events
    w = EventWriter(tmp_path, run="r", role="trainer")
    w.emit("step_outcome", step=0)
    monkeypatch.setattr(writer_mod.os, "fsync", failing_fsync)
    w.sync(wait=False)
    w.close()  # joins the helper: its failure is counted and reported
    assert w.dropped >= 1 and "I/O error" in w.last_error
    assert [e["type"] for e in _read(w.path)] == ["step_outcome", "events_dropped", "log_closed"]


def test_log_closed_reports_the_process_peak_memory(tmp_path):
    import resource

    ballast = bytearray(64 * 2**20)  # the peak is at least this process's after touching 64 MiB
    ballast[::4096] = b"x" * len(ballast[::4096])
    w = EventWriter(tmp_path, "r", "engine", rank=0)
    w.close()
    closed = _read(w.path)[-1]
    assert closed["type"] == "log_closed" and is_valid(closed)
    peak = closed["peak_rss_bytes"]
    assert 64 * 2**20 <= peak <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del ballast
