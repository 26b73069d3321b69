"""A log ftkit did not write (``bench/independent_events.py``: ``json.dumps`` lines, payload before
the envelope, spaces after separators, its own file names) analyses clean, faults and heals
included, and gives the same result as per-process files, one merged file and shuffled lines."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from ftkit.analysis.engine import analyze_paths
from ftkit.events.merge import write_merged_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "events"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import independent_events  # noqa: E402
from logsplit import log_lines, signature  # noqa: E402


def test_independent_log_passes_in_every_arrangement(tmp_path):
    independent_events.main([str(tmp_path / "run"), "--events", "3000", "--cells", "3", "--faults", "1"])
    events = tmp_path / "run" / "events"
    first = next(iter(sorted(events.glob("c0.r0.*.jsonl")))).read_text().split("\n")[0]
    assert first.startswith('{"type": "step_outcome", ') and first.endswith('"schema": 2}')  # not ftkit's writer
    files = analyze_paths([events])
    assert files.stats["read_as"] == "per-process"
    assert files.verdict() == "pass" and not files.findings, [f.message for f in files.findings]
    assert files.stats["faults"] == 1 and files.stats["heals"] == 1
    # no checkpoints, no non-finite steps; no canary or GRPO log-probs (its config names no loss), no
    # rollout advantages (FT116)
    assert all(r.checked for r in files.rules if r.code not in ("FT110", "FT114", "FT116"))
    write_merged_log(events, tmp_path / "merged.jsonl")
    lines = log_lines(events)
    random.Random(0).shuffle(lines)
    (tmp_path / "shuffled.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for name, mode in (("merged.jsonl", "sequential"), ("shuffled.jsonl", "sorted")):
        other = analyze_paths([tmp_path / name])
        assert other.stats["read_as"] == mode
        assert signature(other) == signature(files)
