"""The per-process reader on worker processes (``ftkit.analysis.parallel``) gives the same analysis,
byte for byte, as one process: on clean and faulted logs, on every injected violation, and on
damage the workers must hand back untouched (malformed and truncated lines, a seq gap, a forged
line, a fingerprint total its parts contradict, a file that is not one process's)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
from exact_json import exact_json

from ftkit.analysis.engine import analyze_paths
from ftkit.analysis.parallel import PARALLEL_BYTES, default_workers
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec


def _analysis(path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> str:
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", str(workers))
    r = analyze_paths([path])
    return exact_json(r)


def _same(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    serial = _analysis(path, monkeypatch, 0)
    for workers in (1, 2, 3):
        assert _analysis(path, monkeypatch, workers) == serial, workers
    assert not multiprocessing.active_children()  # the workers were stopped
    return serial


@pytest.mark.parametrize("violation", [None, *VIOLATIONS])
def test_workers_give_the_same_analysis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, violation: str | None) -> None:
    generate(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1, violation=violation))
    out = _same(tmp_path / "events", monkeypatch)
    if violation is not None:
        assert f'"code": "{violation}"' in out


def _rank_file(events: Path) -> Path:
    return sorted(events.glob("trainer-c1-r0-*.jsonl"))[0]


def test_damage_is_reported_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1))
    events = tmp_path / "events"
    path = _rank_file(events)
    lines = path.read_bytes().split(b"\n")
    fps = [i for i, ln in enumerate(lines) if b'"state_fingerprint"' in ln]
    bad = json.loads(lines[fps[1]])
    bad["total"] = "0" * 32  # a total its parts contradict
    lines[fps[1]] = json.dumps(bad).encode()
    forged = json.loads(lines[fps[2]])
    forged["cell"] = 0  # evidence naming another cell
    lines[fps[2]] = json.dumps(forged).encode()
    lines[fps[3]] = b'{"type": "state_fingerprint", oops'  # malformed
    del lines[fps[4] + 1]  # a seq gap
    path.write_bytes(b"\n".join(lines[:-1]) + b'\n{"type": "step_out')  # a truncated last line
    out = _same(events, monkeypatch)
    for text in ("not the fingerprint of its own", "evidence only counts from its own writer", "malformed", "seq gap"):
        assert text in out


def test_a_file_of_several_sources_falls_back_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path, SyntheticSpec(cells=2, tp=1, pp=1, rollouts=2, tensors=4, faults=0))
    events = tmp_path / "events"
    a, b = sorted(events.glob("trainer-*.jsonl"))[:2]
    a.write_bytes(a.read_bytes() + b.read_bytes())  # two sources in one file, one twice
    out = _same(events, monkeypatch)
    assert '"read_as": "sorted"' in out or '"read_as": "sequential"' in out


def test_worker_count_follows_the_input_size_the_cores_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FTKIT_ANALYZE_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert default_workers(40, PARALLEL_BYTES) == 7  # one core for the replay
    assert default_workers(3, PARALLEL_BYTES) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert default_workers(40, PARALLEL_BYTES) == 1  # two cores: one decodes, one replays
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert default_workers(40, PARALLEL_BYTES) == 0  # one core: nothing to run beside the replay
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert default_workers(40, PARALLEL_BYTES - 1) == 0  # small: one process
    assert default_workers(1, PARALLEL_BYTES * 4) == 0  # one file: nothing to share
    monkeypatch.setitem(sys.modules, "ray", sys)  # a Ray driver (ftkit train): no fork
    assert default_workers(40, PARALLEL_BYTES * 4) == 0
    monkeypatch.delitem(sys.modules, "ray")
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", "3")
    assert default_workers(40, 10) == 3
    assert default_workers(2, 10) == 2  # at most one per file
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", "0")
    assert default_workers(40, PARALLEL_BYTES * 4) == 0


def test_a_worker_killed_mid_analysis_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker SIGKILLed before it answers (the OOM killer, an operator): the files are analysed
    again in one process, with the same result, never exit 3."""
    import signal

    from ftkit.analysis import parallel

    generate(tmp_path, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1))
    serial = _analysis(tmp_path / "events", monkeypatch, 0)
    serve = parallel._serve

    def dies_first(files, requests, replies):  # type: ignore[no-untyped-def]
        if min(files) == 0:  # the worker of file 0 dies, the other one serves
            os.kill(os.getpid(), signal.SIGKILL)
        serve(files, requests, replies)

    monkeypatch.setattr(parallel, "_serve", dies_first)
    assert _analysis(tmp_path / "events", monkeypatch, 2) == serial
    assert not multiprocessing.active_children()


def test_a_request_to_a_dead_worker_is_a_lost_worker(tmp_path: Path) -> None:
    """A worker SIGKILLed from outside between two requests: the next request meets a closed pipe
    (EPIPE), which is ``WorkerLost`` (the analysis starts again in one process), not a broken
    stdout of this process (which the CLI would take for ``| head`` going away)."""
    import signal

    from ftkit.analysis.parallel import ParallelStream, WorkerLost

    generate(tmp_path, SyntheticSpec(cells=2, tp=1, pp=1, rollouts=2, tensors=4, faults=0))
    files = sorted((tmp_path / "events").glob("*.jsonl"))
    stream = ParallelStream(files, lambda *issue: None, 1)
    try:
        proc = stream.procs[0]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        with pytest.raises(WorkerLost):
            next(stream.file_events(0))
    finally:
        stream.close()
