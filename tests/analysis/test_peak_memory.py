"""Each process's peak memory (issue 36: the bytes each process holds): ``log_closed`` carries the
writer's peak RSS, and ``analyze-events`` (so ``ftkit train``'s report too) shows the largest of
each role, from a real run; a damaged value is ignored, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tamper_run import copy_run, read_log, write_log

from ftkit import cli

pytestmark = pytest.mark.slow


def _analyze(capsys: pytest.CaptureFixture[str], run: Path, fmt: str) -> str:
    code = cli.main(["analyze-events", str(run), "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_every_role_reports_its_peak_memory(real_train_run: Path, capsys) -> None:
    peaks = json.loads(_analyze(capsys, real_train_run, "json"))["stats"]["peak_rss_bytes"]
    assert set(peaks) == {"driver", "trainer", "engine"}
    assert all(100 * 2**20 < v < 64 * 2**30 for v in peaks.values())  # torch alone is over 100 MiB
    closed = [
        e["peak_rss_bytes"]
        for path in (real_train_run / "events").glob("trainer-*.jsonl")
        for e in read_log(path)
        if e["type"] == "log_closed"
    ]
    assert peaks["trainer"] == max(closed)  # the largest rank's
    human = _analyze(capsys, real_train_run, "human")
    assert f"trainer {peaks['trainer'] / 2**20:,.0f} MiB" in human and "Peak memory" in human


def test_a_damaged_peak_is_ignored(real_train_run: Path, tmp_path: Path, capsys) -> None:
    run = copy_run(real_train_run, tmp_path / "run")
    path = next((run / "events").glob("engine-*.jsonl"))
    evs = read_log(path)
    evs[-1]["peak_rss_bytes"] = "lots"
    write_log(path, evs)
    code = cli.main(["analyze-events", str(run), "--format", "json"])
    out, _ = capsys.readouterr()
    assert code in (0, 1)  # the schema check may flag the line; never exit 3
    assert "engine" not in json.loads(out)["stats"]["peak_rss_bytes"]
