"""The orders every rendering of a ``CompareResult`` shares (human, JSON, GitHub, JUnit, step
summary, HTML): which compared tensors are the most different (``worst``) and in which order
findings are shown (``ordered_findings``: the cause before its consequences)."""

from __future__ import annotations

from ftkit.dumps.compare import CompareResult, PairResult
from ftkit.dumps.metrics import Metrics
from ftkit.findings import Finding, sort_findings

CAUSES = frozenset({"CD012", "CD014"})  # the configs differ / could not be compared: listed first


def worst(result: CompareResult, n: int) -> list[PairResult]:
    """The ``n`` most different compared tensors: failing first, then by dissimilarity, max_rel.
    Each has metrics (read them with ``compared``)."""
    ranked = [p for p in result.pairs if p.metrics is not None and not p.metrics.bitwise_equal]
    ranked.sort(key=lambda p: (not p.failed, -metrics(p).dissimilarity, -metrics(p).max_rel, -metrics(p).max_abs))
    return ranked[:n]


def metrics(p: PairResult) -> Metrics:
    """The metrics of a compared pair (every pair ``worst`` returns has them)."""
    if p.metrics is None:
        raise ValueError(f"{p.id} was not compared")
    return p.metrics


def ordered_findings(result: CompareResult) -> list[Finding]:
    """The findings, causes first: config differences (``CAUSES``), then the findings of the first
    divergence (capture order), then the rest most severe first (``sort_findings``). So a CI
    format that shows only the first N (GitHub's annotation budget) shows the cause."""
    first = result.first_divergence.id if result.first_divergence is not None else None

    def rank(f: Finding) -> int:
        if f.code in CAUSES:
            return 0
        return 1 if first is not None and f.evidence.get("tensor") == first else 2

    return sorted(sort_findings(result.findings), key=rank)
