"""Which compared tensors ``compare-dumps`` shows as the most different (every rendering of a
``CompareResult`` uses the same ranking: human, JSON, step summary, HTML)."""

from __future__ import annotations

from ftkit.dumps.compare import CompareResult, PairResult
from ftkit.dumps.metrics import Metrics


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
