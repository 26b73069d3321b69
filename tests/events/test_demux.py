"""Any arrangement of a run's lines gives the analysis of its per-process files (issue 13).

Synthetic runs (faults, heals, every planted violation) are shuffled and split over plain and
gzipped files by hypothesis; duplicates, conflicts, the on-disk spill sort, the sequential read
of a merged log and standard input each have their own test.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsplit import log_lines, signature, write_arrangement

from ftkit.analysis.engine import analyze_paths
from ftkit.events.demux import DemuxStream
from ftkit.events.merge import write_merged_log
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec

REPO = Path(__file__).resolve().parents[2]  # the tree under test, for subprocesses

SPEC = SyntheticSpec(cells=3, tp=2, engines=1, rollouts=3, steps_per_rollout=2, samples_per_rollout=12, tensors=6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, Path]:
    """A clean run with two faults and heals, and one run per planted violation."""
    out: dict[str | None, Path] = {}
    for violation in (None, *VIOLATIONS):
        d = tmp_path_factory.mktemp(f"run-{violation}")
        spec = SyntheticSpec(**{**SPEC.__dict__, "faults": 2, "violation": violation})
        generate(d, spec)
        out[violation] = d / "events"
    return out


@pytest.fixture(scope="module")
def reference(runs: dict[str | None, Path]) -> dict[str | None, dict]:
    return {v: signature(analyze_paths([d])) for v, d in runs.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    violation=st.sampled_from([None, *VIOLATIONS]),
    seed=st.integers(0, 2**32),
    parts=st.integers(1, 4),
    gz=st.booleans(),
)
def test_any_permutation_and_split_gives_the_per_process_result(runs, reference, violation, seed, parts, gz):
    with tempfile.TemporaryDirectory() as d:
        files = write_arrangement(log_lines(runs[violation]), Path(d), seed, parts, gz)
        result = analyze_paths(files)
    assert result.stats["read_as"] == "sorted"
    assert signature(result) == reference[violation]


def test_the_clean_reference_has_faults_heals_and_passes(reference, runs):
    result = analyze_paths([runs[None]])
    assert result.stats["read_as"] == "per-process" and result.verdict() == "pass"
    assert result.stats["faults"] == 2 and result.stats["heals"] >= 1 and len(reference[None]["recovery"]) == 2


def test_cat_of_the_files_gives_the_same_result(runs, reference, tmp_path):
    for violation in (None, "FT106", "FT112"):
        merged = tmp_path / f"cat-{violation}.jsonl"
        merged.write_bytes(b"".join(p.read_bytes() for p in sorted(runs[violation].glob("*.jsonl"))))
        assert signature(analyze_paths([merged])) == reference[violation]


def test_merged_log_is_read_in_one_sequential_pass(runs, reference, tmp_path):
    for violation in (None, "FT101", "FT113"):
        for name in ("m.jsonl", "m.jsonl.gz"):
            written = write_merged_log(runs[violation], tmp_path / name)
            assert written.lines == len(log_lines(runs[violation])) and written.fragments == 0
            result = analyze_paths([tmp_path / name])
            assert result.stats["read_as"] == "sequential"
            assert signature(result) == reference[violation]
    assert not list(tmp_path.glob("*.tmp"))


def test_merged_log_is_a_byte_copy_of_the_lines(runs, tmp_path):
    written = write_merged_log(runs[None], tmp_path / "m.jsonl")
    assert sorted((tmp_path / "m.jsonl").read_bytes().splitlines()) == sorted(log_lines(runs[None]))
    times = [json.loads(line)["time"] for line in (tmp_path / "m.jsonl").read_bytes().splitlines()]
    assert times == sorted(times) and written.files == len(list(runs[None].glob("*.jsonl")))


def test_merged_log_leaves_out_a_dead_writers_fragment(runs, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    for p in runs[None].glob("*.jsonl"):
        (events / p.name).write_bytes(p.read_bytes())
    victim = sorted(events.glob("trainer-*.jsonl"))[0]
    victim.write_bytes(victim.read_bytes() + b'{"schema":1,"type":"metr')
    written = write_merged_log(events, tmp_path / "m.jsonl")
    assert written.fragments == 1
    per_process, merged = analyze_paths([events]), analyze_paths([tmp_path / "m.jsonl"])
    assert [f.code for f in per_process.findings] == ["FT111"] and per_process.verdict() == "pass"  # a warning
    assert merged.verdict() == "pass"


def test_a_line_delivered_twice_is_one_warning(runs, reference, tmp_path):
    lines = log_lines(runs[None])
    for twice in (lines[0], lines[len(lines) // 2], lines[-1]):
        log = tmp_path / "dup.jsonl"
        log.write_bytes(b"\n".join([*lines, twice]) + b"\n")
        result = analyze_paths([log])
        extra = [f for f in result.findings if f.code == "FT111"]
        assert len(extra) == 1 and extra[0].severity.value == "warning" and "second copy" in extra[0].message
        assert result.verdict() == "pass"
        assert [(f.code, f.message) for f in result.findings if f not in extra] == [
            (f[0], f[2]) for f in reference[None]["findings"]
        ]


def test_same_source_and_seq_with_other_content_is_an_error(runs, tmp_path):
    lines = log_lines(runs[None])
    victim = next(line for line in lines if b'"type":"metric"' in line)
    forged = victim.replace(b'"type":"metric"', b'"type":"metric","forged":1')
    for order in ([*lines, forged], [forged, *lines]):
        log = tmp_path / "conflict.jsonl"
        log.write_bytes(b"\n".join(order) + b"\n")
        result = analyze_paths([log])
        errors = [f for f in result.findings if f.code == "FT111" and f.severity.value == "error"]
        assert len(errors) == 1 and "different line" in errors[0].message and result.verdict() == "fail"


def test_a_per_process_file_with_a_duplicate_is_read_demultiplexed(runs, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    for p in runs[None].glob("*.jsonl"):
        data = p.read_bytes()
        if p.name.startswith("trainer-c0-r0"):
            data += data.splitlines(keepends=True)[3]
        (events / p.name).write_bytes(data)
    result = analyze_paths([events])
    assert result.stats["read_as"] == "sorted" and result.verdict() == "pass"
    assert [f.code for f in result.findings] == ["FT111"] and "second copy" in result.findings[0].message


def test_lines_of_two_runs_in_one_stream_are_still_an_error(runs, tmp_path):
    other = [line.replace(b'"run":"synthetic"', b'"run":"other"') for line in log_lines(runs[None])]
    log = tmp_path / "two.jsonl"
    log.write_bytes(b"\n".join(log_lines(runs[None]) + other) + b"\n")
    result = analyze_paths([log])
    assert any("several runs" in f.message for f in result.findings) and result.verdict() == "fail"


@pytest.mark.parametrize("violation", [None, "FT104", "FT108"])
def test_the_on_disk_sort_gives_the_same_result_and_cleans_up(runs, reference, tmp_path, violation, monkeypatch):
    files = write_arrangement(log_lines(runs[violation]), tmp_path / "in", seed=7, parts=3, gz=True)
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr("ftkit.events.spill.FAN_IN", 3)  # several merge passes
    result = analyze_paths(files, spill_bytes=4096)
    assert signature(result) == reference[violation]
    assert list(spill.iterdir()) == []


def test_the_sort_spills_when_over_its_budget(runs, tmp_path):
    files = write_arrangement(log_lines(runs[None]), tmp_path, seed=1, parts=1, gz=False)
    stream = DemuxStream(files, lambda *a: None, spill_bytes=8192, tmpdir=str(tmp_path))
    try:
        items = [e for e, _, _ in stream.events() if e is not None]
        assert stream.mode == "sorted" and stream._sorter is not None and stream._sorter.spilled > 0
        assert len(items) == len(log_lines(runs[None]))
    finally:
        stream.close()


def test_lines_without_a_source_are_findings_whatever_their_place(runs, reference, tmp_path):
    junk = [b"not json", b"[1,2]", b'{"type":"metric","seq":3}', b'{"source":[],"seq":1,"type":"x"}']
    base = signature(analyze_paths([runs[None]]))
    results = []
    for seed in (1, 2):
        files = write_arrangement(log_lines(runs[None]) + junk, tmp_path / str(seed), seed, 2, False)
        results.append(signature(analyze_paths(files)))
    assert results[0] == results[1] and results[0]["verdict"] == "fail"
    assert len(results[0]["findings"]) == len(base["findings"]) + 3  # the unknown type "x" is a note only


def test_standard_input(runs, reference, tmp_path):
    data = b"".join(sorted(p.read_bytes() for p in runs["FT109"].glob("*.jsonl")))
    for payload in (data, gzip.compress(data)):
        proc = subprocess.run(
            [sys.executable, "-m", "ftkit", "analyze", "-", "--format", "json"],
            input=payload,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        doc = json.loads(proc.stdout)
        assert proc.returncode == 1 and doc["stats"]["read_as"] == "sorted"
        assert sorted(f["code"] for f in doc["findings"]) == sorted(f[0] for f in reference["FT109"]["findings"])


@pytest.mark.parametrize("arrangement", ["sorted", "sequential"])
def test_progress_moves_through_every_pass(runs, tmp_path, monkeypatch, arrangement):
    """Issue 24 item 6: the bar of a merged or shuffled log moves while it is read, not 0% then 100%."""
    monkeypatch.setattr("ftkit.events.reader.BLOCK", 4096)  # the keys-only scan ticks every BLOCK bytes
    monkeypatch.setattr("ftkit.events.demux.BLOCK", 4096)  # the sequential read advances a block at a time
    monkeypatch.setattr("ftkit.events.demux.TICK_LINES", 16)  # the partition every TICK_LINES lines
    monkeypatch.setattr("ftkit.analysis.replay.TICK", 16)  # the replay every TICK events
    if arrangement == "sorted":
        paths = write_arrangement(log_lines(runs[None]), tmp_path, seed=3, parts=1, gz=False)
    else:
        write_merged_log(runs[None], tmp_path / "m.jsonl")
        paths = [tmp_path / "m.jsonl"]
    calls: list[tuple[int, int]] = []
    result = analyze_paths(paths, progress=lambda done, total: calls.append((done, total)))
    assert result.stats["read_as"] == arrangement
    size = sum(p.stat().st_size for p in paths)
    passes = 3 if arrangement == "sorted" else 2
    demuxed = calls[next(i for i, c in enumerate(calls) if c[1] == size * passes) :]
    assert demuxed[-1] == (size * passes, size * passes)
    dones = [d for d, _ in demuxed]
    assert dones == sorted(dones)
    for k in range(passes) if arrangement == "sequential" else (1, 2):  # each pass moves the bar (the
        # scan of a shuffled log stops at its first line out of order)
        assert any(size * k < d < size * (k + 1) for d in dones), (k, dones[:8], size)
