"""Test support: an analysis as one JSON text, for byte-for-byte comparisons of two ways of reading
the same log (findings with their file and line, rule counts, stats, recovery table, notes)."""

from __future__ import annotations

import json

from ftkit.analysis.engine import AnalysisResult


def exact_json(r: AnalysisResult) -> str:
    return json.dumps(
        {
            "findings": [f.model_dump(mode="json") for f in r.findings],
            "rules": [s.model_dump(mode="json") for s in r.rules],
            "stats": r.stats,
            "recovery": r.recovery,
            "notes": r.notes,
        },
        sort_keys=True,
        default=str,
    )
