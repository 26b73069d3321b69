"""``compare_runs`` with each run read by a worker process (``ftkit.runs.worker``): the same result,
byte for byte, as in one process -- for equal runs, a divergence, a resumed (faulted) run and a
merged log -- and a worker killed with SIGKILL or failing on its input loses nothing (the logs
are read again in one process, or the worker's error is the comparison's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from ftkit import cli
from ftkit.errors import InputError
from ftkit.events.merge import write_merged_log
from ftkit.report.runs_formats import document
from ftkit.runs import compare, worker
from ftkit.runs.compare import compare_runs
from ftkit.tensors.fingerprint import state_total
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def _run(path: Path, **kw: object) -> Path:
    spec = SyntheticSpec(**{"cells": 2, "faults": 0, "tensors": 4, "rollouts": 6, "engines": 1, **kw})  # type: ignore[arg-type]
    generate(path, spec)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    ref = _run(root / "ref")
    faulted = _run(root / "faulted", cells=4, faults=2)
    changed = root / "changed"
    shutil.copytree(ref, changed)
    for path in sorted((changed / "events").glob("*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        for ev in events:
            if ev["type"] == "state_fingerprint" and ev["step"] >= 9:
                ev["params"][sorted(ev["params"])[0]] = "0" * 32
                ev["total"] = state_total(ev["params"], ev["optimizer"])
        path.write_text("".join(json.dumps(ev) + "\n" for ev in events))
    merged = root / "merged.jsonl"
    write_merged_log(faulted / "events", merged)
    return {"ref": ref, "faulted": faulted, "changed": changed, "merged": merged}


def _doc(a: Path, b: Path, workers: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", workers)
    result = compare_runs([a], [b])
    return json.dumps({"verdict": result.verdict, **document(result)}, sort_keys=True)


@pytest.mark.parametrize(
    ("a", "b"), [("faulted", "ref"), ("ref", "changed"), ("merged", "changed"), ("changed", "merged")]
)
def test_workers_give_the_result_of_one_process(runs, a: str, b: str, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    real = worker.RemoteSide.__init__

    def counting(self, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202 - RemoteSide's own
        real(self, *args, **kw)
        started.append(self.proc.pid)

    monkeypatch.setattr(worker.RemoteSide, "__init__", counting)
    one = _doc(runs[a], runs[b], "0", monkeypatch)
    assert started == []
    two = _doc(runs[a], runs[b], "2", monkeypatch)
    assert len(started) == 2 and two == one
    assert json.loads(one)["verdict"] == ("pass" if "changed" not in (a, b) else "fail")


def test_a_worker_killed_with_sigkill_is_read_again_in_one_process(runs, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _doc(runs["faulted"], runs["changed"], "0", monkeypatch)
    real_advance, parent = worker.Side.advance, os.getpid()
    calls = [0]

    def dies(self, n: int) -> None:  # noqa: ANN001 - Side's own; B's worker dies at its second chunk
        calls[0] += 1
        if os.getpid() != parent and self.index == 1 and calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real_advance(self, n)

    monkeypatch.setattr(worker.Side, "advance", dies)
    monkeypatch.setattr(compare, "CHUNK", 64)  # several chunks, so the worker dies part-way
    fallback = []
    real_side = compare.Side

    def local(*args, **kw):  # noqa: ANN002, ANN003, ANN202 - Side's own
        fallback.append(args[0])
        return real_side(*args, **kw)

    monkeypatch.setattr(compare, "Side", local)
    got = _doc(runs["faulted"], runs["changed"], "2", monkeypatch)
    assert fallback == [0, 1] and got == expected  # the chunk does not change the result (below)


def test_the_result_does_not_depend_on_the_chunk(runs, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _doc(runs["faulted"], runs["changed"], "0", monkeypatch)
    monkeypatch.setattr(compare, "CHUNK", 64)
    assert _doc(runs["faulted"], runs["changed"], "0", monkeypatch) == whole
    assert _doc(runs["faulted"], runs["changed"], "2", monkeypatch) == whole


def test_an_error_in_a_worker_is_the_comparisons(runs, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real_advance, parent = worker.Side.advance, os.getpid()

    def fails(self, n: int) -> None:  # noqa: ANN001 - Side's own; fails in the forked worker only
        if os.getpid() != parent:
            raise InputError(f"{self.paths[0]}: unreadable", "check the file")
        real_advance(self, n)

    monkeypatch.setattr(worker.Side, "advance", fails)
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", "2")
    code = cli.main(["compare-runs", str(runs["ref"]), str(runs["changed"])])
    err = capsys.readouterr().err
    assert code == 2 and "unreadable" in err and "Traceback" not in err
