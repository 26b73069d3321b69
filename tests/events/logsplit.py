"""Test support: rearrange a run's log lines as shippers do, and compare analysis results.

``signature(result)`` is what must not depend on how the lines arrive: verdict, findings (code,
severity, message, evidence without file/line), per-rule checked / finding counts, recovery table
(without file/line). ``write_arrangement`` writes a log's lines permuted and split over files,
some gzipped.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

from ftkit.analysis.engine import AnalysisResult


def signature(result: AnalysisResult) -> dict[str, Any]:
    def strip(d: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in d.items() if k not in ("file", "line")))

    return {
        "verdict": result.verdict(),
        "findings": sorted((f.code, f.severity.value, f.message, strip(f.evidence)) for f in result.findings),
        "rules": [(r.code, r.checked, r.findings) for r in result.rules],
        "recovery": [strip(row) for row in result.recovery],
    }


def log_lines(events_dir: Path) -> list[bytes]:
    """Every line of every file under ``events_dir`` (without newlines), files in name order."""
    lines: list[bytes] = []
    for path in sorted(events_dir.glob("*.jsonl")):
        lines += path.read_bytes().splitlines()
    return lines


def write_arrangement(lines: list[bytes], out: Path, seed: int, parts: int, gz: bool) -> list[Path]:
    """``lines`` shuffled with ``seed`` and cut into ``parts`` files under ``out`` (gzipped when
    ``gz``, every other file); returns the files."""
    rng = random.Random(seed)
    order = list(lines)
    rng.shuffle(order)
    cuts = sorted(rng.sample(range(1, len(order)), min(parts, len(order)) - 1)) if parts > 1 else []
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(order)])):
        data = b"".join(line + b"\n" for line in order[start:end])
        if gz and i % 2 == 0:
            path = out / f"part{i}.jsonl.gz"
            path.write_bytes(gzip.compress(data))
        else:
            path = out / f"part{i}.jsonl"
            path.write_bytes(data)
        files.append(path)
    return files
