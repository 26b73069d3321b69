"""The reader: discovery, gz, time-merge, and every kind of damage reported, never raised."""

from __future__ import annotations

import gzip
import json

import pytest

from ftkit.errors import InputError
from ftkit.events import reader
from ftkit.events.reader import EventStream, discover, iter_events


def _ev(t, seq=0, **kw):
    return json.dumps({"type": "metric", "time": t, "seq": seq, **kw})


def _stream(files):
    issues = []
    stream = EventStream(files, lambda *a: issues.append(a))
    items = list(stream.events())
    return items, issues


def test_discover_files_dirs_gz_and_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jsonl").write_text(_ev(1) + "\n")
    (tmp_path / "a" / "deep").mkdir()
    with gzip.open(tmp_path / "a" / "deep" / "y.jsonl.gz", "wt") as fh:
        fh.write(_ev(2) + "\n")
    (tmp_path / "a" / "notes.txt").write_text("not a log")
    found = discover([tmp_path / "a", tmp_path / "a" / "x.jsonl"])
    assert [p.name for p in found] == ["y.jsonl.gz", "x.jsonl"]  # sorted, duplicates removed, .txt ignored
    assert [e["time"] for e in iter_events([tmp_path / "a"])] == [1, 2]
    with pytest.raises(InputError, match="no such file"):
        discover([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no \\*.jsonl"):
        discover([tmp_path / "empty"])
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError):
        discover([tmp_path / "dangling.jsonl"])


def test_a_file_is_taken_whatever_its_name_and_gzip_by_magic(tmp_path):
    p = tmp_path / "log.bin"
    p.write_bytes(gzip.compress((_ev(5) + "\n").encode()))
    assert [e["time"] for e in iter_events([p])] == [5]


def test_merge_by_time_keeps_each_file_in_order(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(_ev(t, i) for i, t in enumerate([1, 4, 3.5, 9])) + "\n")
    b.write_text("\n".join(_ev(t, i) for i, t in enumerate([2, 3, 10])) + "\n")
    items, issues = _stream([a, b])
    order = [(i, e["seq"]) for e, i, _ in items if e is not None]
    assert order == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 3), (1, 2)]
    ends = [i for e, i, _ in items if e is None]
    assert sorted(ends) == [0, 1] and issues == []


def test_damage_is_reported_with_file_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(
        b"\n".join(
            [
                _ev(1).encode(),
                b"\xff\xfe garbage \x00",
                b"[1, 2]",
                b"",
                b'{"a": ',
                _ev(2, value=float("nan")).encode(),
                b'{"time": 3, "trunc',
            ]
        )
    )
    items, issues = _stream([p])
    assert [e["time"] for e, _, _ in items if e is not None] == [1, 2]
    kinds = [(line, kind) for _, line, kind, _ in issues]
    assert kinds == [(2, "malformed"), (3, "malformed"), (5, "malformed"), (7, "truncated")]
    assert all(name == str(p) for name, *_ in issues)


def test_every_json_value_that_is_not_an_object_is_malformed(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"\n".join([_ev(1).encode(), b'"text"', b"42", b"1.5", b"null", b"true", b"[]", _ev(2).encode()]))
    items, issues = _stream([p])
    assert [e["time"] for e, _, _ in items if e is not None] == [1, 2]
    assert [(line, kind, msg) for _, line, kind, msg in issues] == [
        (2, "malformed", "a JSON str, not an object"),
        (3, "malformed", "a JSON int, not an object"),
        (4, "malformed", "a JSON float, not an object"),
        (5, "malformed", "a JSON NoneType, not an object"),
        (6, "malformed", "a JSON bool, not an object"),
        (7, "malformed", "a JSON list, not an object"),
    ]


def test_a_deeply_nested_line_in_a_long_block_is_malformed_not_a_crash(tmp_path):
    # the length test that keeps such a line away from orjson runs only in blocks over SAFE_LEN
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"\n".join([_ev(1).encode(), b"[" * 200_000, _ev(2).encode()]) + b"\n")
    items, issues = _stream([p])
    assert [e["time"] for e, _, _ in items if e is not None] == [1, 2]
    assert [(line, kind) for _, line, kind, _ in issues] == [(2, "malformed")]


def test_nan_and_infinity_literals_decode():
    assert reader.decode(b'{"a": NaN, "b": -Infinity}')["b"] == float("-inf")
    with pytest.raises(ValueError):
        reader.decode(b"[" * 100_000)


def test_huge_lines_are_skipped_with_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_LINE", 1000)
    monkeypatch.setattr(reader, "CHUNK", 64)
    p = tmp_path / "x.jsonl"
    big = '{"pad": "' + "x" * 5000 + '"}'
    p.write_text("\n".join([_ev(1), big, _ev(2), "y" * 3000]) + "\n" + _ev(3) + "\n" + "z" * 2000)
    items, issues = _stream([p])
    assert [e["time"] for e, _, _ in items if e is not None] == [1, 2, 3]
    assert [(line, kind) for _, line, kind, _ in issues] == [(2, "too_long"), (4, "too_long"), (6, "too_long")]


def test_empty_and_blank_files_yield_nothing(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    (tmp_path / "b.jsonl").write_bytes(b"\n\n   \n")
    items, issues = _stream(discover([tmp_path]))
    assert items == [] and issues == []


def test_corrupt_gzip_is_an_issue_not_a_crash(tmp_path):
    good = gzip.compress(("\n".join(_ev(t, t) for t in range(2000)) + "\n").encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "bad.jsonl.gz").write_bytes(good[:10] + b"\x00" * 200 + good[210:])
    items, issues = _stream(discover([tmp_path]))
    assert {kind for _, _, kind, _ in issues} <= {"truncated", "unreadable", "malformed"}
    assert len(issues) >= 2
